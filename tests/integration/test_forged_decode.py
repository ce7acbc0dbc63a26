"""A forged `Decode` naming a producer of the caller's own cannot poison a decode worker's prefix
cache (issue 17): without the cluster secret the call is refused before the engine sees it and the
fake producer is never contacted; even a caller holding the secret (an insider, the worst case)
gets its fake producer refused by the KV handshake, because the producer must prove the secret
too, so the prompt is recomputed. Either way a later request with the same prompt gets the tokens
one vLLM engine computes for it."""

from __future__ import annotations

import random
import socket
import threading

import grpc
import pytest

from kv_transfer.handle import KVHandle
from pdserve.client import Client
from pdserve.v1 import generation_pb2, worker_pb2, worker_pb2_grpc

pytestmark = pytest.mark.integration


class FakeProducer:
    """A KV port of the forger's: accepts connections, sends garbage, counts who came."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            try:
                conn.sendall(random.Random(7).randbytes(4096))
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.listener.close()


def forged_decode(prompt: list[int], producer: FakeProducer) -> worker_pb2.DecodeRequest:
    blocks = (len(prompt) - 1) // 32  # what a real handle names: the prompt's full blocks but its last token's
    handle = KVHandle(transfer_id="f" * 32, remote_address=producer.address, remote_engine_id="forged",
                      remote_block_ids=tuple(range(blocks)), remote_num_tokens=blocks * 32)
    return worker_pb2.DecodeRequest(request_id="forged-1", prompt_token_ids=prompt,
                                    sampling=generation_pb2.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
                                    kv_transfer_params_json=handle.encode())


def fresh_prompt(seed: int) -> list[int]:
    rng = random.Random(seed)  # first tokens no other test uses: nothing of it is cached anywhere
    return [rng.randrange(1000, 1900) for _ in range(96)]


def test_a_forged_decode_without_the_secret_is_refused_and_poisons_nothing(tcp_cluster, reference):
    decode_id = tcp_cluster.worker_ids("decode")[0]
    prompt, producer = fresh_prompt(17001), FakeProducer()
    try:
        with grpc.insecure_channel(tcp_cluster.worker_address(decode_id)) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                list(worker_pb2_grpc.WorkerStub(channel).Decode(forged_decode(prompt, producer), timeout=30))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert producer.connections == 0
    finally:
        producer.close()
    expected = reference.answer(prompt, max_tokens=4, temperature=0.0, ignore_eos=True)["token_ids"]
    with Client(tcp_cluster.grpc_target) as client:
        got = [t for chunk in client.generate(token_ids=prompt, max_tokens=4, ignore_eos=True, temperature=0.0) for t in chunk.token_ids]
    assert got == expected


def test_even_a_secret_holders_fake_producer_is_refused_by_the_kv_handshake_and_the_prompt_recomputed(
        tcp_cluster, reference):
    decode_id = tcp_cluster.worker_ids("decode")[0]
    prompt, producer = fresh_prompt(17002), FakeProducer()
    try:
        with tcp_cluster.worker_channel(decode_id) as channel:  # calls that prove the cluster secret
            replies = list(worker_pb2_grpc.WorkerStub(channel).Decode(forged_decode(prompt, producer), timeout=60))
    finally:
        producer.close()
    assert producer.connections >= 1  # the decode worker tried the named producer ...
    last = replies[-1]
    assert last.finished and last.kv_load_error and last.kv_loaded_tokens == 0  # ... refused it, loaded nothing
    expected = reference.answer(prompt, max_tokens=4, temperature=0.0, ignore_eos=True)["token_ids"]
    assert [t for r in replies for t in r.token_ids] == expected  # recomputed: the engine's own tokens
    with Client(tcp_cluster.grpc_target) as client:
        got = [t for chunk in client.generate(token_ids=prompt, max_tokens=4, ignore_eos=True, temperature=0.0) for t in chunk.token_ids]
    assert got == expected  # what the decode worker cached for this prompt is its own computation
