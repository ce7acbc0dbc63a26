"""One live cluster under fuzzing (issue 18 item 6): `FuzzTarget` sends one input to a public API
as a client would and then checks every invariant, raising `FuzzFailure` naming the first broken:

- the answer is never a 5xx (HTTP, an error event in a stream included) nor INTERNAL or UNKNOWN
  (gRPC), and an error answer carries OpenAI's error body;
- it comes within `timeout_s` (no hang);
- right after it, a valid request on the same API is served in full (200 / OK, its tokens);
- the router and every worker still run, the router still routes to every worker (none
  quarantined), and `pdserve_worker_failures_total` has not moved: bad input is never a worker's
  failure.

`statuses` counts the answers seen, for the benchmark's report.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import grpc
import httpx

from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

GENERATE = "/pdserve.v1.Generation/Generate"
VALID_HTTP = {"prompt": "Still serving?", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
VALID_GRPC = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[10, 11, 12]),
                                sampling=pb.SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
SERVER_FAULTS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS,
                 grpc.StatusCode.UNIMPLEMENTED}
ERROR_FIELDS = {"message", "type", "param", "code"}


class FuzzFailure(AssertionError):
    """An invariant broke; the message says which and with what answer."""


class FuzzTarget:
    def __init__(self, cluster, timeout_s: float = 60.0):
        self.cluster = cluster
        self.timeout_s = timeout_s
        self.http = httpx.Client(base_url=cluster.http_url, timeout=timeout_s)
        self.channel = grpc.insecure_channel(cluster.grpc_target)
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)
        self.raw_generate = self.channel.unary_stream(GENERATE)   # bytes in, bytes out: any message
        self.statuses: Counter[str] = Counter()
        self.worker_failures_at_start = self.worker_failures()
        self.num_workers = (len(cluster.worker_ids("prefill")), len(cluster.worker_ids("decode")))

    def close(self) -> None:
        self.http.close()
        self.channel.close()

    # ---- one input ---------------------------------------------------------------------------------
    def send_http(self, path: str, content: bytes, content_type: str = "application/json") -> int:
        try:
            reply = self.http.post(path, content=content, headers={"content-type": content_type})
        except httpx.TimeoutException:
            raise FuzzFailure(f"HTTP {path}: no answer within {self.timeout_s:g} s") from None
        except httpx.TransportError as error:  # the router dropped the connection: it crashed on the input
            raise FuzzFailure(f"HTTP {path}: the connection failed: {error!r}") from None
        self.statuses[f"http {reply.status_code}"] += 1
        _check_http_answer(reply)
        self.check_serving()
        return reply.status_code

    def send_grpc(self, message: pb.GenerateRequest | bytes) -> grpc.StatusCode:
        raw = message if isinstance(message, bytes) else message.SerializeToString()
        try:
            list(self.raw_generate(raw, timeout=self.timeout_s))
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as error:
            code, details = error.code(), error.details()
        self.statuses[f"grpc {code.name}"] += 1
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise FuzzFailure(f"gRPC Generate: no end within {self.timeout_s:g} s")
        if code in SERVER_FAULTS:
            raise FuzzFailure(f"gRPC Generate answered {code.name}: {details}")
        self.check_serving()
        return code

    # ---- invariants --------------------------------------------------------------------------------
    def check_serving(self) -> None:
        """A valid request on each API is served in full; every process lives and is routed to."""
        reply = self.http.post("/v1/completions", json=VALID_HTTP)
        if reply.status_code != 200 or reply.json()["usage"]["completion_tokens"] != 2:
            raise FuzzFailure(f"the valid HTTP request after it was not served: {reply.status_code} {reply.text[:300]}")
        try:
            tokens = sum(len(chunk.token_ids) for chunk in self.stub.Generate(VALID_GRPC, timeout=self.timeout_s))
        except grpc.RpcError as error:
            raise FuzzFailure(f"the valid gRPC request after it failed: {error.code().name} {error.details()}") from None
        if tokens != 2:
            raise FuzzFailure(f"the valid gRPC request after it got {tokens} tokens, not 2")
        self.check_workers()

    def check_workers(self) -> None:
        dead = [name for name, process in [("router", self.cluster.router), *self.cluster.workers.items()]
                if not process.alive()]
        if dead:
            raise FuzzFailure(f"exited: {dead}")
        info = self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self.timeout_s)
        if (info.num_prefill_workers, info.num_decode_workers) != self.num_workers:
            raise FuzzFailure(f"the router routes to {info.num_prefill_workers} prefill and {info.num_decode_workers} "
                              f"decode workers of {self.num_workers}: a worker was quarantined")
        if self.worker_failures() != self.worker_failures_at_start:
            raise FuzzFailure(f"pdserve_worker_failures_total moved: {self.worker_failures_at_start} -> "
                              f"{self.worker_failures()}")

    def worker_failures(self) -> float:
        text = self.http.get("/metrics").text
        return sum(float(value) for value in re.findall(r"^pdserve_worker_failures_total\{[^}]*\} (\S+)$", text, re.M))


def _check_http_answer(reply: httpx.Response) -> None:
    if reply.status_code >= 500:
        raise FuzzFailure(f"HTTP {reply.status_code}: {reply.text[:300]}")
    if reply.status_code != 200:
        error = reply.json().get("error")
        if not isinstance(error, dict) or set(error) != ERROR_FIELDS or error["code"] != reply.status_code:
            raise FuzzFailure(f"HTTP {reply.status_code} without OpenAI's error body: {reply.text[:300]}")
        return
    if reply.headers["content-type"].startswith("text/event-stream"):
        for line in reply.text.splitlines():
            if line.startswith("data: {") and '"error"' in line:
                event = json.loads(line[len("data: "):])
                if "error" in event and event["error"]["code"] >= 500:
                    raise FuzzFailure(f"HTTP stream ended with a server error: {line[:300]}")
