"""One colocated vLLM engine (reference_engine.py) asked one request at a time, and the cluster's
HTTP answer to the same request in the same terms: what the OpenAI API tests compare
(test_openai_vllm_text.py, test_openai_vllm_logprobs.py; the engine is the session's `reference`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import httpx

from pdserve.engine import engine_start_env


class Reference:
    """reference_engine.py in a child process."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self._read()  # ready

    def _read(self) -> dict:
        while line := self.process.stdout.readline():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"the reference engine exited ({self.process.wait()})")

    def answer(self, token_ids: list[int], **sampling) -> dict:
        """vLLM's whole answer: token_ids, text, finish_reason, stop_reason, logprobs, prompt_logprobs."""
        self.process.stdin.write(json.dumps({"token_ids": token_ids, "sampling": sampling}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def ask(self, token_ids: list[int], **sampling) -> dict:
        answer = self.answer(token_ids, **sampling)
        return {"text": answer["text"], "num_tokens": len(answer["token_ids"]),
                "finish_reason": answer["finish_reason"], "stop_reason": answer["stop_reason"],
                "token_ids": answer["token_ids"]}


@contextlib.contextmanager
def reference_engine(settings, folder: Path) -> Iterator[Reference]:
    """reference_engine.py with `settings` (pdserve.engine.EngineSettings), its settings file in
    `folder`; stopped (end of input) when the block ends."""
    settings_file = folder / "settings.json"
    settings_file.write_text(json.dumps(asdict(settings)))
    process = subprocess.Popen([sys.executable, str(Path(__file__).parent / "integration" / "reference_engine.py"),
                                str(settings_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env=engine_start_env(settings, os.environ))
    try:
        yield Reference(process)
    finally:
        process.stdin.close()
        process.wait(timeout=120)


def post(cluster, path: str, body: dict) -> httpx.Response:
    reply = httpx.post(f"{cluster.http_url}{path}", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply


def events(reply: httpx.Response) -> list[dict]:
    """A stream's events, without the final [DONE]."""
    return [json.loads(line[len("data: "):]) for line in reply.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def served(cluster, token_ids: list[int], stream: bool, **sampling) -> dict:
    """The cluster's /v1/completions answer, in `Reference.ask`'s terms (no token ids)."""
    body = {"prompt": token_ids, "stream": stream, **sampling}
    if stream:
        body["stream_options"] = {"include_usage": True}
    reply = post(cluster, "/v1/completions", body)
    if not stream:
        answer = reply.json()
        choice, usage = answer["choices"][0], answer["usage"]
        text = choice["text"]
    else:
        streamed = events(reply)
        usage = streamed[-1]["usage"]
        choices = [event["choices"][0] for event in streamed if event["choices"]]
        text, choice = "".join(c["text"] for c in choices), choices[-1]
    return {"text": text, "num_tokens": usage["completion_tokens"], "finish_reason": choice["finish_reason"],
            "stop_reason": choice["stop_reason"]}
