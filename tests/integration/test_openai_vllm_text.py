"""A disaggregated cluster's HTTP answers carry vLLM's text (issue 16 item 1): the same request
sent to one colocated vLLM engine (reference_engine.py, the same engine settings) and to the
cluster's `/v1/completions` gives the same text, completion tokens, finish_reason and stop_reason,
streamed and not. Stop strings are taken from the reference's own greedy text, one of them across
the first token (which the prefill engine samples) and the second (the decode engine's first).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import httpx
import pytest

from cluster_helpers import HERE, engine_settings

pytestmark = pytest.mark.integration

GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 24}


class Reference:
    """reference_engine.py in a child process, asked one request at a time."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self._read()  # ready

    def _read(self) -> dict:
        while line := self.process.stdout.readline():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"the reference engine exited ({self.process.wait()})")

    def ask(self, token_ids: list[int], **sampling) -> dict:
        self.process.stdin.write(json.dumps({"token_ids": token_ids, "sampling": sampling}) + "\n")
        self.process.stdin.flush()
        answer = self._read()
        return {"text": answer["text"], "num_tokens": len(answer["token_ids"]),
                "finish_reason": answer["finish_reason"], "stop_reason": answer["stop_reason"],
                "token_ids": answer["token_ids"]}


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    settings = tmp_path_factory.mktemp("reference-engine") / "settings.json"
    settings.write_text(json.dumps(asdict(engine_settings(tiny_model))))
    process = subprocess.Popen([sys.executable, str(HERE / "reference_engine.py"), str(settings)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield Reference(process)
    finally:
        process.stdin.close()
        process.wait(timeout=120)


def served(cluster, token_ids: list[int], stream: bool, **sampling) -> dict:
    """The cluster's answer over HTTP, in the reference's terms."""
    body = {"prompt": token_ids, "stream": stream, **sampling}
    if stream:
        body["stream_options"] = {"include_usage": True}
    reply = httpx.post(f"{cluster.http_url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    if not stream:
        answer = reply.json()
        choice, usage = answer["choices"][0], answer["usage"]
        text = choice["text"]
    else:
        events = [json.loads(line[len("data: "):]) for line in reply.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        usage = events[-1]["usage"]
        choices = [event["choices"][0] for event in events if event["choices"]]
        text, choice = "".join(c["text"] for c in choices), choices[-1]
    return {"text": text, "num_tokens": usage["completion_tokens"], "finish_reason": choice["finish_reason"],
            "stop_reason": choice["stop_reason"]}


def _without_tokens(answer: dict) -> dict:
    return {k: v for k, v in answer.items() if k != "token_ids"}


@pytest.fixture(scope="module")
def cases(prompts) -> list[list[int]]:
    """Prompts of 33 and 100 tokens no other test sends: the clusters are the session's, and a
    prompt cached here would change what a later test counts as transferred."""
    return [list(reversed(prompts[4]["token_ids"])), list(reversed(prompts[9]["token_ids"]))]


def test_greedy_text_is_vllm_s_streamed_and_not(tcp_cluster, reference, cases):
    for token_ids in cases:
        expected = _without_tokens(reference.ask(token_ids, **GREEDY))
        for stream in (False, True):
            assert served(tcp_cluster, token_ids, stream, **GREEDY) == expected, f"stream={stream}"


def test_stop_strings_cut_the_text_as_vllm_does_across_the_first_token_too(tcp_cluster, reference, cases):
    checked = 0
    for token_ids in cases:
        whole = reference.ask(token_ids, **GREEDY)["text"]
        first = reference.ask(token_ids, **GREEDY | {"max_tokens": 1})["text"]
        stops = {"across": whole[len(first) - 1:len(first) + 1] if first else "", "middle": whole[8:11]}
        for where, stop in stops.items():
            if len(stop.strip()) < 1:
                continue
            for include in (False, True):
                sampling = GREEDY | {"stop": [stop], "include_stop_str_in_output": include}
                expected = _without_tokens(reference.ask(token_ids, **sampling))
                assert expected["finish_reason"] == "stop"  # the case is what it claims
                for stream in (False, True):
                    assert served(tcp_cluster, token_ids, stream, **sampling) == expected, \
                        f"{where} stop {stop!r}, include={include}, stream={stream}"
                    checked += 1
    assert checked >= 8


def test_stop_token_ids_and_min_tokens_end_the_text_as_vllm_does(tcp_cluster, reference, cases):
    for token_ids in cases:
        whole = reference.ask(token_ids, **GREEDY)
        for sampling in (GREEDY | {"stop_token_ids": [whole["token_ids"][5]]},
                         GREEDY | {"stop": [whole["text"][:2]], "min_tokens": 3}):
            expected = _without_tokens(reference.ask(token_ids, **sampling))
            for stream in (False, True):
                assert served(tcp_cluster, token_ids, stream, **sampling) == expected, f"{sampling}, stream={stream}"


def test_repetition_penalty_gives_vllm_s_tokens(tcp_cluster, reference):
    """It weighs the prompt and the output alike, so it is exact though the decode engine sees the
    first token as part of its prompt (presence and frequency penalties are not: see README)."""
    token_ids = list(range(300, 340))  # the tiny model's greedy output comes back to a prompt token
    plain = reference.ask(token_ids, **GREEDY)
    penalized = reference.ask(token_ids, **GREEDY | {"repetition_penalty": 2.0})
    assert penalized["token_ids"] != plain["token_ids"]  # the penalty changes this output
    for stream in (False, True):
        assert served(tcp_cluster, token_ids, stream, **GREEDY | {"repetition_penalty": 2.0}) == \
            _without_tokens(penalized)
