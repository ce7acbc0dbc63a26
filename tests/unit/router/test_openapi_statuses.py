"""The router's OpenAPI schema documents every status each route answers, with OpenAI's error body
and `Retry-After` on 429 (issue 18 item 6), and no other: no FastAPI 422 (pdserve answers 400).
The same in-process app as the HTTP tests, over scripted workers; a refused request's live answer
must match what the schema says of it."""

from __future__ import annotations

import httpx

from router.http_api import create_app
from router.lifecycle import RouterConfig
from scripted_workers import ScriptedWorker, scripted_cluster

ERROR_BODY = {"message", "type", "param", "code"}


async def _served(redis_server, tokenizer, requests: list[tuple[str, str, dict | None]],
                  config: RouterConfig | None = None) -> list[httpx.Response]:
    lifecycle, pool, registry = await scripted_cluster(redis_server, tokenizer, {"prefill-a": ScriptedWorker(),
                                                                                 "decode-a": ScriptedWorker()}, config)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(lifecycle, "tiny")),
                                     base_url="http://router") as client:
            return [await client.request(method, path, json=body) for method, path, body in requests]
    finally:
        await pool.close()
        await registry.close()


def _statuses(schema: dict) -> dict[str, set[str]]:
    return {f"{method.upper()} {path}": set(operation["responses"])
            for path, item in schema["paths"].items() for method, operation in item.items()}


async def test_every_route_documents_each_status_it_answers_and_no_422(redis_server, tokenizer):
    [reply] = await _served(redis_server, tokenizer, [("GET", "/openapi.json", None)])
    generation = {"200", "400", "401", "404", "429", "503", "504", "500"}
    assert _statuses(reply.json()) == {"GET /health": {"200", "500"}, "GET /metrics": {"200", "500"},
                                       "GET /v1/models": {"200", "401", "500"},
                                       "POST /v1/completions": generation, "POST /v1/chat/completions": generation,
                                       "POST /tokenize": {"200", "400", "401", "404", "500"},
                                       "POST /detokenize": {"200", "400", "401", "404", "500"}}
    assert {"HTTPValidationError", "ValidationError"} & set(reply.json()["components"]["schemas"]) == set()


async def test_errors_are_documented_with_openai_s_body_and_429_with_retry_after(redis_server, tokenizer):
    [reply] = await _served(redis_server, tokenizer, [("GET", "/openapi.json", None)])
    schema = reply.json()
    completions = schema["paths"]["/v1/completions"]["post"]["responses"]
    detail = schema["components"]["schemas"]["ErrorDetail"]
    assert set(detail["properties"]) == ERROR_BODY and set(detail["required"]) == {"message", "type", "code"}
    for status in ("400", "401", "404", "429", "503", "504", "500"):
        assert completions[status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert set(completions["429"]["headers"]) == {"Retry-After"}
    assert set(completions["401"]["headers"]) == {"WWW-Authenticate"}
    assert "Retry-After" not in completions["400"].get("headers", {})
    assert set(completions["200"]["content"]) == {"application/json", "text/event-stream"}


async def test_a_body_that_fails_validation_and_a_refusal_for_load_answer_as_documented(redis_server, tokenizer):
    bad, refused = await _served(redis_server, tokenizer, [
        ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": "many"}),
        ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 4}),
    ], config=RouterConfig(max_model_len=256, max_inflight=0))
    assert bad.status_code == 400 and set(bad.json()["error"]) == ERROR_BODY
    assert bad.json()["error"]["param"] == "body.max_tokens"   # vLLM's param for a schema error
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    assert set(refused.json()["error"]) == ERROR_BODY
