"""`pdserve planner status`: the online planner's last published tick (`planner.online.Tick.to_json`,
read back as a dict) as lines: what it decided, and how its model's latency compared with the
observed one, with the gate's verdict. Pure: the CLI reads Redis and prints.
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.model_error import METRICS, label
from planner.pool_sizes import PoolSizes


def status_lines(tick: Mapping, now_s: float) -> list[str]:
    """Everything `pdserve planner status` prints; `now_s` is the wall clock (for the tick's age)."""
    age = f"last tick {max(0.0, now_s - tick['at_s']):.0f} s ago"
    if "target" not in tick:
        return [f"{age}: {tick['note']}"]
    current, target = PoolSizes.from_mapping(tick["current"]), PoolSizes.from_mapping(tick["target"])
    if tick["applied"]:
        action = f"scaled {current} -> {target}"
    elif not tick["changed"]:
        action = f"kept {current}"
    else:
        action = f"did not scale {current} -> {target}"
    observed = tick["observed"]
    lines = [f"{age}: {action}",
             f"  load: {observed['arrival_rate_rps']:.2f} req/s, {observed['mean_prompt_tokens']:.0f} prompt and "
             f"{observed['mean_output_tokens']:.0f} output tokens on average, serving {_sizes(observed['ready'])}",
             "  reasons: " + "; ".join(tick["reasons"])]
    if tick["note"]:
        lines.append(f"  note: {tick['note']}")
    lines += [f"  error: {e}" for e in tick["errors"]]
    model = tick.get("model")
    if model is None:
        return lines + ["model error: not judged (this planner has no latency model)"]
    return lines + model_lines(model)


def model_lines(model: Mapping) -> list[str]:
    """The table of predicted against observed latency (`ModelErrorTracker.as_dict()`)."""
    interval = (f"scored, {model['num_finished']} requests finished" if model["scored"]
                else f"not scored: {model['skipped']}")
    lines = [f"model error, this interval ({interval}); recent = mean |error| over the last "
             f"{model['scored_intervals']} of up to {model['window_intervals']} scored intervals:",
             f"  {'':9} {'predicted':>10} {'observed':>10} {'error':>7} {'recent':>7} {'correction':>11}"]
    for metric in METRICS:
        m = model["metrics"][metric]
        gated = " (gated)" if metric in model["gated"] else ""
        lines.append(f"  {label(metric):9} {_ms(m['predicted_s']):>10} {_ms(m['observed_s']):>10} "
                     f"{_percent(m['error'], signed=True):>7} {_percent(m['recent_error']):>7} "
                     f"{'x' + format(m['correction'], '.2f'):>11}{gated}")
    bound = "none" if model["max_error"] is None else f"{model['max_error']:.0%}"
    verdict = "following the model's plan" if model["may_act"] else "not following the model's plan"
    lines.append(f"gate (bound {bound}): {verdict}: {model['reason']}")
    return lines


def model_summary(model: Mapping) -> str:
    """One line for each tick the running planner prints."""
    parts = []
    for metric in model["gated"]:
        m = model["metrics"][metric]
        parts.append(f"{label(metric)} {_ms(m['predicted_s'])} predicted / {_ms(m['observed_s'])} observed "
                     f"({_percent(m['error'], signed=True)})")
    verdict = "trusted" if model["may_act"] else "not trusted"
    return "model: " + ", ".join(parts) + f"; {verdict}: {model['reason']}"


def _sizes(sizes: Mapping | None) -> str:
    return "?" if sizes is None else str(PoolSizes.from_mapping(sizes))


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def _percent(ratio: float | None, signed: bool = False) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:+.0%}" if signed else f"{ratio:.0%}"
