"""The inputs fuzzing found (issue 18 item 6, tests/integration/test_api_fuzz.py), as plain values:
each is the client's 400 naming the field, where it was a 500 before."""

from __future__ import annotations

import httpx
import pytest

from pdserve.errors import InvalidRequest
from pdserve.sampling import Sampling
from router.http_api import create_app
from router.openai_schema import CompletionRequest, unpaired_surrogate_at
from scripted_workers import ScriptedWorker, scripted_cluster


@pytest.mark.parametrize("fields, field", [
    ({"top_k": 2**40}, "top_k"),                 # vLLM takes it; the workers' int32 cannot carry it
    ({"seed": 2**64}, "seed"),
    ({"seed": -2**63 - 1}, "seed"),
    ({"max_tokens": 2**31}, "max_tokens"),
])
def test_a_value_the_workers_wire_cannot_carry_is_refused_naming_the_field(fields, field):
    with pytest.raises(InvalidRequest) as error:
        Sampling.validated(**fields)
    assert error.value.field == field


def test_the_wire_s_own_edges_are_served():
    sampling = Sampling.validated(top_k=2**31 - 1, seed=2**63 - 1)
    assert (sampling.to_proto().top_k, sampling.to_proto().seed) == (2**31 - 1, 2**63 - 1)


@pytest.mark.parametrize("value, where", [
    ({"prompt": "\ud800"}, "prompt"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udfff"}]}]}, "messages.0.content.0.text"),
    ({"stop": ["ok", "\ud83d"]}, "stop.1"),
    ({"\ud800": 1}, "\ud800"),
    ({"prompt": "héllo 😀 \u2028"}, None),
])
def test_unpaired_surrogates_are_found_where_they_are(value, where):
    assert unpaired_surrogate_at(value) == where


async def test_a_prompt_with_an_unpaired_surrogate_is_400_naming_the_prompt(redis_server, tokenizer):
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"prefill-a": ScriptedWorker(),
                                                                                 "decode-a": ScriptedWorker()})
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(lifecycle, "tiny")),
                                     base_url="http://router") as client:
            reply = await client.post("/v1/completions", content=b'{"prompt": "\\ud800", "max_tokens": 2}',
                                      headers={"content-type": "application/json"})
            unparsable = await client.post("/v1/completions", content=b'{"prompt": ',
                                           headers={"content-type": "application/json"})
            odd_key = await client.post("/v1/completions", content=b'{"prompt": "hi", "\\ude73": 1}',
                                        headers={"content-type": "application/json"})
    finally:
        await pool.close()
        await registry.close()
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt"
    assert unparsable.status_code == 400 and unparsable.json()["error"]["type"] == "Bad Request"
    assert odd_key.status_code == 400 and odd_key.json()["error"]["param"] == "\\ude73"  # sent escaped: no 500
    with pytest.raises(InvalidRequest):
        CompletionRequest.model_validate({"prompt": "hi", "user": "\udc00"})
