"""A request's way into an engine, from the join trace (`pdserve.engine_step_trace`): where the
handoff's time goes inside a decode worker, and a prompt's wait inside a prefill worker.

The clients' first gap (first token to second: `planner.validation_phases`' `first_gap`) is the
router's hop to the decode worker plus what happens inside it. Inside, per pulled request (each
phase in seconds, from the trace's stamps):
- `front`: the worker's front end accepted it (vLLM's `arrival_time`) to the engine core's
  scheduler taking it in; the engine core takes requests between steps, so this holds
  `behind_step`, what was left of the step running when it was accepted;
- `pull`: taken in to its pull reported done: the pull is scheduled in the next step's connector
  metadata and reported after the step it finished in, so it spans whole steps (`pull_steps`:
  how many started in it; 1 when the pull ends within the step beside it);
- `to_join`: reported done to the start of the step that runs it (the scheduler runs it in the
  next step);
- `join_step`: that step, which computes the prompt's last token and so the first decode token.
`inside` is their sum, accepted to the join step's end; the clients' first gap less `inside` is
the hops outside (the router's Decode call in, the token's way out), compared with the profile's
`handoff_s`. The way in alone (`hop_in_s`) is the request's prefill join end (its first token, for
a prompt that ran in one step) to its acceptance by the decode worker's front end: the stretch of
the simulator that `handoff_s` is (`SimRequest.handed_off_s` less its first token). The rest of
the hops is the decode token's way out less the first token's.

A prefill worker's requests (no pull): `front`, `queue` (taken in to its first step, the
engine's own queue) and `first_step` (its prompt's first chunk).

Pure: joins and steps in, means out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pdserve.engine_step_trace import TracedJoin, TracedStep

PULL_PHASES = ("front", "behind_step", "pull", "to_join", "join_step", "inside")
PROMPT_PHASES = ("front", "queue", "first_step")


def behind_step_s(accepted_s: float, steps: Sequence[TracedStep], starts: np.ndarray) -> float:
    """What was left at `accepted_s` of the traced step running then (`steps` in start order,
    `starts` their start times); 0 when none ran."""
    i = int(np.searchsorted(starts, accepted_s, side="right")) - 1
    if i < 0 or steps[i].end_s <= accepted_s:
        return 0.0
    return steps[i].end_s - accepted_s


def pull_phases(joins: Sequence[TracedJoin], steps: Sequence[TracedStep]) -> dict[str, np.ndarray]:
    """Per pulled request of `joins` whose stamps are all there, each phase of the module doc in
    seconds, and `pull_steps` (the steps that started between its arrival and its pull's report)."""
    ordered = sorted(steps, key=lambda s: s.start_s)
    starts = np.array([s.start_s for s in ordered])
    chosen = [j for j in joins if j.pulled and np.isfinite(j.accepted_s)]
    phases = {
        "front": [j.arrived_s - j.accepted_s for j in chosen],
        "behind_step": [behind_step_s(j.accepted_s, ordered, starts) for j in chosen],
        "pull": [j.pulled_s - j.arrived_s for j in chosen],
        "to_join": [j.start_s - j.pulled_s for j in chosen],
        "join_step": [j.end_s - j.start_s for j in chosen],
        "inside": [j.end_s - j.accepted_s for j in chosen],
        "pull_steps": [int(np.searchsorted(starts, j.pulled_s) - np.searchsorted(starts, j.arrived_s))
                       for j in chosen],
    }
    return {name: np.array(values, dtype=float) for name, values in phases.items()}


def prompt_phases(joins: Sequence[TracedJoin]) -> dict[str, np.ndarray]:
    """Per request of `joins` that pulled nothing (its prompt computed here) with every stamp, the
    prompt phases of the module doc in seconds."""
    chosen = [j for j in joins if not j.pulled and np.isfinite(j.accepted_s)]
    return {"front": np.array([j.arrived_s - j.accepted_s for j in chosen]),
            "queue": np.array([j.start_s - j.arrived_s for j in chosen]),
            "first_step": np.array([j.end_s - j.start_s for j in chosen])}


def external_id(engine_request_id: str) -> str:
    """The request id the router gave a worker, from the engine's: vLLM's front end appends "-"
    and 8 characters of a random id to make its own (`InputProcessor`)."""
    head, dash, tail = engine_request_id.rpartition("-")
    return head if dash and len(tail) == 8 else engine_request_id


def prefilled_at(prefill_joins: Sequence[TracedJoin], max_prompt_tokens: int | None = None) -> dict[str, float]:
    """Router request id -> when the prefill worker's join step of its prompt ended, over the
    prompts it computed (not pulled) of at most `max_prompt_tokens` (the engine's token budget: a
    longer prompt is computed in chunks and joined at its first, so its way in would hold the
    chunks after it; one within the budget may still share a step and be cut: pass the joins
    through `one_step_prompts` with the prefill worker's steps to leave those out too, as every
    reading here from a validation does: a third of the tiny model's long-short prompts were cut)."""
    return {external_id(j.request_id): j.end_s for j in prefill_joins
            if not j.pulled and (max_prompt_tokens is None or j.prompt_tokens <= max_prompt_tokens)}


def one_step_prompts(prefill_joins: Sequence[TracedJoin], prefill_steps: Sequence[TracedStep]) -> list[TracedJoin]:
    """The joins of a prefill worker whose prompt its first step may have completed: left out, each
    that started in a step the next of which continued a chunk (a prefill worker's request that
    continues is a chunked prompt; which of that step's prompts it is the trace does not say, so
    all go), since a join stamps a prompt's first step and a chunked prompt's way in would hold
    its later chunks. A prompt over the token budget always goes; one within it goes when it
    shared a step and was cut."""
    ordered = sorted(prefill_steps, key=lambda step: step.start_s)
    cut_starts = {step.start_s for step, after in zip(ordered, ordered[1:]) if after.continuing > 0}
    return [j for j in prefill_joins if j.start_s not in cut_starts]


def matched_ways_in(prefill_joins: Sequence[TracedJoin], decode_joins: Sequence[TracedJoin],
                    max_prompt_tokens: int | None = None) -> list[tuple[float, float]]:
    """Per request in both, pulled by the decode worker and prefilled (not pulled) by the prefill
    worker in one step (`prefilled_at`), in `decode_joins`' order: (its prefill join step's end,
    the decode worker's front end accepting it), monotonic seconds: its way in's ends."""
    prefilled = prefilled_at(prefill_joins, max_prompt_tokens)
    return [(prefilled[key], j.accepted_s) for j in decode_joins
            if j.pulled and np.isfinite(j.accepted_s) and (key := external_id(j.request_id)) in prefilled]


def hop_in_s(prefill_joins: Sequence[TracedJoin], decode_joins: Sequence[TracedJoin],
             max_prompt_tokens: int | None = None) -> np.ndarray:
    """Each matched request's way in (`matched_ways_in`), seconds, in `decode_joins`' order."""
    return np.array([accepted_s - first_s for first_s, accepted_s
                     in matched_ways_in(prefill_joins, decode_joins, max_prompt_tokens)], dtype=float)


def in_start_order(steps: Sequence[TracedStep]) -> tuple[list[TracedStep], np.ndarray]:
    """`steps` in start order and their start times (what `busy_share` and `served_by_s` read)."""
    ordered = sorted(steps, key=lambda s: s.start_s)
    return ordered, np.array([s.start_s for s in ordered])


def way_in_by_batch(prefill_joins: Sequence[TracedJoin], decode_joins: Sequence[TracedJoin],
                    decode_steps: Sequence[TracedStep], max_prompt_tokens: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Per matched request (`matched_ways_in`): the batch the decode engine was running when the
    request's prefill join step ended (0: it was between steps or idle) and the Decode call's way
    in, seconds."""
    ordered, starts = in_start_order(decode_steps)
    batches, ways = [], []
    for first_s, accepted_s in matched_ways_in(prefill_joins, decode_joins, max_prompt_tokens):
        i = int(np.searchsorted(starts, first_s, side="right")) - 1
        batches.append(ordered[i].decoding if i >= 0 and ordered[i].end_s > first_s else 0)
        ways.append(accepted_s - first_s)
    return np.array(batches, dtype=int), np.array(ways, dtype=float)


def busy_share(steps: Sequence[TracedStep], starts: np.ndarray, start_s: float, end_s: float) -> float:
    """The share of [start_s, end_s) an engine spent stepping (`steps` in start order, `starts` their
    start times); 0 for an empty span."""
    if end_s <= start_s:
        return 0.0
    i, busy_s = max(0, int(np.searchsorted(starts, start_s, side="right")) - 1), 0.0
    for step in steps[i:]:
        if step.start_s >= end_s:
            break
        busy_s += max(0.0, min(end_s, step.end_s) - max(start_s, step.start_s))
    return busy_s / (end_s - start_s)


def served_by_s(steps: Sequence[TracedStep], starts: np.ndarray, start_s: float, cpu_s: float,
                share_while_stepping: float) -> float:
    """When `cpu_s` of CPU work that starts at `start_s` on an engine's core is done, if it runs at
    the whole core while the engine is idle and at `share_while_stepping` of it while the engine
    steps (`steps` in start order, `starts` their start times): 1 is work the engine does not slow,
    0.5 processor sharing with one busy thread, 0 work that waits for the engine's gaps."""
    if cpu_s <= 0:
        return start_s
    if not 0 <= share_while_stepping <= 1:
        raise ValueError(f"share_while_stepping must be in [0, 1], got {share_while_stepping}")
    t, left = start_s, cpu_s
    i = max(0, int(np.searchsorted(starts, start_s, side="right")) - 1)
    while True:
        while i < len(steps) and steps[i].end_s <= t:
            i += 1
        if i < len(steps) and steps[i].start_s <= t:  # a step runs: the work gets its share until it ends
            if share_while_stepping > 0 and left <= (steps[i].end_s - t) * share_while_stepping:
                return t + left / share_while_stepping
            left -= (steps[i].end_s - t) * share_while_stepping
            t = steps[i].end_s
            continue
        gap_end_s = steps[i].start_s if i < len(steps) else float("inf")
        if left <= gap_end_s - t:
            return t + left
        left -= gap_end_s - t
        t = gap_end_s


def way_in_by_prefill_share(prefill_joins: Sequence[TracedJoin], decode_joins: Sequence[TracedJoin],
                            prefill_steps: Sequence[TracedStep], max_prompt_tokens: int | None = None
                            ) -> tuple[np.ndarray, np.ndarray]:
    """Per matched request (`matched_ways_in`): the share of its way in the prefill engine spent
    stepping (its core holds the prefill worker's API process and the router the call goes
    through) and the way in, seconds."""
    ordered, starts = in_start_order(prefill_steps)
    pairs = matched_ways_in(prefill_joins, decode_joins, max_prompt_tokens)
    return (np.array([busy_share(ordered, starts, first_s, accepted_s) for first_s, accepted_s in pairs], dtype=float),
            np.array([accepted_s - first_s for first_s, accepted_s in pairs], dtype=float))


def in_window(joins: Sequence[TracedJoin], start_s: float, end_s: float) -> list[TracedJoin]:
    """The joins whose request reached the worker's front end within [start_s, end_s)."""
    return [j for j in joins if start_s <= j.accepted_s < end_s]


def handoff_summary(joins: Sequence[TracedJoin], steps: Sequence[TracedStep], start_s: float, end_s: float,
                    client_first_gap_s: float = float("nan"),
                    prefill_joins: Sequence[TracedJoin] = (), max_prompt_tokens: int | None = None) -> dict:
    """A decode worker's pulled requests accepted in [start_s, end_s), for a report and
    validation.json: the count, each phase's mean in ms, the share of requests by `pull_steps`
    (0, 1, 2, 3 or more), given the clients' mean first gap, the hops outside (first gap -
    inside) in ms, and given the prefill workers' joins, the way in's median (`hop_in_ms`) over
    the prompts of at most `max_prompt_tokens` and their count (`hop_in_requests`)."""
    chosen = in_window(joins, start_s, end_s)
    phases = pull_phases(chosen, steps)
    n = len(phases["inside"])
    summary: dict = {"requests": n}
    if n == 0:
        return summary
    for name in PULL_PHASES:
        summary[f"{name}_ms"] = round(float(phases[name].mean()) * 1e3, 4)
    counts = np.minimum(phases["pull_steps"], 3).astype(int)
    summary["pull_steps_share"] = {("3+" if k == 3 else str(k)): round(float(np.mean(counts == k)), 4)
                                   for k in range(4)}
    if np.isfinite(client_first_gap_s):
        summary["client_first_gap_ms"] = round(client_first_gap_s * 1e3, 4)
        summary["hops_ms"] = round((client_first_gap_s - float(phases["inside"].mean())) * 1e3, 4)
    hops_in = hop_in_s(prefill_joins, chosen, max_prompt_tokens)
    if len(hops_in):
        summary["hop_in_requests"] = len(hops_in)
        summary["hop_in_ms"] = round(float(np.median(hops_in)) * 1e3, 4)
    return summary


def prompt_summary(joins: Sequence[TracedJoin], start_s: float, end_s: float) -> dict:
    """A prefill worker's requests accepted in [start_s, end_s): the count and each prompt phase's
    mean in ms."""
    phases = prompt_phases(in_window(joins, start_s, end_s))
    n = len(phases["queue"])
    summary: dict = {"requests": n}
    for name in PROMPT_PHASES if n else ():
        summary[f"{name}_ms"] = round(float(phases[name].mean()) * 1e3, 4)
    return summary


def client_first_gap_s(chunk_times: Sequence[Sequence[float]]) -> float:
    """The clients' mean first gap (second token - first) over requests of two tokens or more
    (NaN: none)."""
    gaps = [times[1] - times[0] for times in chunk_times if len(times) >= 2]
    return float(np.mean(gaps)) if gaps else float("nan")
