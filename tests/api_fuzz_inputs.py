"""Hypothesis strategies for fuzzing the router's public APIs (issue 18 item 6): OpenAI JSON bodies
for `/v1/completions` and `/v1/chat/completions`, `GenerateRequest` messages for gRPC, and raw
bytes for both. Inputs look valid enough to reach deep (a real prompt, most fields right) and
carry what a client may get wrong: wrong types and nesting, extreme numbers (1e30, NaN, inf,
ints past 64 bits), unknown fields, unpaired surrogates and other unicode, empty and long prompts
(up to `MAX_PROMPT_WORDS`, past the model's context), out-of-vocabulary token ids, bad stop lists,
bad messages. Sizes stay bounded so one example costs milliseconds to a second, never minutes.

Used by tests/integration/test_api_fuzz.py (a short run) and bench/fuzz_api.py (a long one).
"""

from __future__ import annotations

import json
import math

from hypothesis import strategies as st

from pdserve.v1 import generation_pb2 as pb

MAX_PROMPT_WORDS = 2500      # "x " * 2500 is ~2500 tokens: past the test clusters' 2048-token context
VOCAB_EDGE = 50_000          # token ids up to here and a little past any tiny model's vocabulary

INT32 = (-2**31, 2**31 - 1)
EDGE_INTS = [0, -1, 1, 2, 7, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63, -2**63 - 1,
             2**64, 10**30]
EDGE_FLOATS = [0.0, -0.0, 0.5, 1.0, 2.0, 2.0000001, -2.0000001, 1e-300, 5e-324, 1e30, -1e30, 1.7976931348623157e308,
               math.nan, math.inf, -math.inf, 3.4028235e38]

# Text with everything a client may send: the default alphabet, control characters and unpaired
# surrogates (JSON may carry "\ud800"; a Python str can hold it).
texts = st.text(alphabet=st.characters(codec=None, categories=None), max_size=40) | \
    st.text(alphabet=st.characters(categories=["Cs", "Cc", "So", "Lo"]), max_size=20)
ints = st.sampled_from(EDGE_INTS) | st.integers(-2**70, 2**70)
# Output lengths: small, or far out of range; never a valid 1000 (an example must stay short).
output_lengths = st.integers(1, 8) | st.sampled_from(EDGE_INTS) | st.integers(2**31, 2**70) | st.integers(-2**70, 0)
floats = st.sampled_from(EDGE_FLOATS) | st.floats(allow_nan=True, allow_infinity=True)
scalars = st.none() | st.booleans() | ints | floats | texts
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
                           max_leaves=8)


def _either(plausible: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a value of the field's type (edges included), sometimes anything JSON can hold."""
    return st.one_of(plausible, plausible, plausible, json_values)


token_ids = st.integers(0, 300) | st.sampled_from([-1, VOCAB_EDGE, 2**31 - 1, 2**31, -2**31, 2**63, 10**30])
prompt_texts = st.one_of(st.just(""), texts, st.integers(0, MAX_PROMPT_WORDS).map(lambda n: "x " * n + "y"))
prompts = st.one_of(prompt_texts, texts.filter(bool), st.lists(st.integers(0, 300), min_size=1, max_size=64),
                    st.lists(token_ids, max_size=64),
                    st.integers(2000, MAX_PROMPT_WORDS).map(lambda n: [11] * n),
                    st.lists(st.lists(token_ids, max_size=3), min_size=1, max_size=2), json_values)
stops = st.one_of(texts, st.lists(texts, max_size=4), st.lists(st.just(""), min_size=1, max_size=2),
                  st.lists(st.text(min_size=1, max_size=5), max_size=40))

SAMPLING_FIELDS: dict[str, st.SearchStrategy] = {
    "max_tokens": output_lengths,
    "max_completion_tokens": output_lengths,
    "temperature": st.floats(0, 2) | floats,
    "top_p": st.floats(0, 1) | floats,
    "top_k": st.integers(-1, 50) | ints,
    "seed": st.integers(0, 2**32) | ints,
    "stop": stops,
    "stop_token_ids": st.lists(token_ids, max_size=5),
    "include_stop_str_in_output": st.booleans(),
    "ignore_eos": st.booleans(),
    "min_tokens": st.integers(0, 8) | ints,
    "presence_penalty": st.floats(-2, 2) | floats,
    "frequency_penalty": st.floats(-2, 2) | floats,
    "repetition_penalty": st.floats(0, 3) | floats,
    "skip_special_tokens": st.booleans(),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": _either(st.booleans())}),
    "n": st.sampled_from([1, 1, 0, 2, -1]),
    "user": texts,
    "request_id": texts,
    "slo_class": st.sampled_from(["", "interactive", "batch"]) | texts,
    "model": st.sampled_from(["tiny", "gpt-4", ""]) | texts,
    "logprobs": st.none() | st.integers(0, 5),
    "echo": st.booleans(),
}

content_parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "image_url", ""]) | texts},
                                               optional={"text": _either(texts), "image_url": json_values}), max_size=3)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | texts},
    optional={"content": _either(texts | content_parts), "name": _either(texts), "tool_calls": json_values}),
    max_size=4)


@st.composite
def _bodies(draw, required: dict[str, st.SearchStrategy]) -> dict:
    """A body that reaches deep often: the required fields (now and then missing), up to four
    sampling fields of their own type (edges included), and sometimes one field of a wrong type
    or unknown fields. About one body in five is served."""
    body = {name: draw(strategy) for name, strategy in required.items() if draw(st.integers(0, 9))}
    for name in draw(st.lists(st.sampled_from(sorted(SAMPLING_FIELDS)), max_size=4, unique=True)):
        body[name] = draw(SAMPLING_FIELDS[name])
    if not draw(st.integers(0, 4)):
        body[draw(st.sampled_from(sorted({**required, **SAMPLING_FIELDS})))] = draw(json_values)
    if not draw(st.integers(0, 9)):
        body |= draw(st.dictionaries(texts, json_values, min_size=1, max_size=2))
    return body


completion_bodies = _bodies({"prompt": prompts})
chat_bodies = _bodies({"messages": messages})


def encode_json(body: object) -> bytes:
    """`body` as a client sends it: ASCII JSON, an unpaired surrogate as its escape ("\\ud800", which
    JSON allows), NaN and inf as Python's `NaN`/`Infinity` literals (not JSON, but Python clients
    send them and the router's parser reads them)."""
    return json.dumps(body).encode()


raw_bodies = st.binary(max_size=200) | st.sampled_from([b"", b"{", b"null", b"[]", b"\"prompt\"", b"{\"prompt\": NaN}",
                                                        b"{\"prompt\": \"hi\", \"max_tokens\": Infinity}",
                                                        b"{\"prompt\": \"\\ud800\", \"max_tokens\": 2}"])

# ---- gRPC --------------------------------------------------------------------------------------
int32s = st.sampled_from([v for v in EDGE_INTS if INT32[0] <= v <= INT32[1]]) | st.integers(*INT32)
int64s = st.sampled_from([v for v in EDGE_INTS if -2**63 <= v < 2**63]) | st.integers(-2**63, 2**63 - 1)
float32s = st.sampled_from(EDGE_FLOATS) | st.floats(width=32, allow_nan=True, allow_infinity=True)
proto_texts = st.text(max_size=40)   # protobuf strings are valid UTF-8: surrogates cannot be set

PROTO_SAMPLING: dict[str, st.SearchStrategy] = {
    "max_tokens": st.integers(1, 8) | st.sampled_from([0, -1, 2**31 - 1, -2**31]), "temperature": st.floats(0, 2, width=32) | float32s,
    "top_p": st.floats(0, 1, width=32) | float32s, "top_k": st.integers(-1, 50) | int32s, "seed": int64s,
    "stop": st.lists(proto_texts, max_size=4), "ignore_eos": st.booleans(), "min_tokens": st.integers(0, 8) | int32s,
    "presence_penalty": st.floats(-2, 2) | floats, "frequency_penalty": st.floats(-2, 2) | floats,
    "repetition_penalty": st.floats(0, 3) | floats, "stop_token_ids": st.lists(int32s, max_size=5),
    "include_stop_str_in_output": st.booleans(), "skip_special_tokens": st.booleans(),
}
proto_token_ids = st.integers(0, 300) | st.sampled_from([-1, VOCAB_EDGE, 2**31 - 1, -2**31])


@st.composite
def generate_requests(draw) -> pb.GenerateRequest:
    fields = draw(st.fixed_dictionaries({}, optional=PROTO_SAMPLING))
    request = pb.GenerateRequest(sampling=pb.SamplingParams(**fields), slo_class=draw(st.sampled_from(["", "batch"]) | proto_texts))
    prompt = draw(st.sampled_from(["text", "ids", "long", "none"]))
    if prompt == "text":
        request.text = draw(st.one_of(st.just(""), proto_texts))
    elif prompt == "ids":
        request.token_ids.ids.extend(draw(st.lists(proto_token_ids, max_size=64)))
    elif prompt == "long":
        request.token_ids.ids.extend([11] * draw(st.integers(2000, MAX_PROMPT_WORDS)))
    if draw(st.booleans()):
        request.request_id = draw(proto_texts)
    return request


def mutated_messages(message: bytes) -> st.SearchStrategy[bytes]:
    """Raw bytes near a valid serialized message (flipped, cut, spliced) and plain random bytes."""
    def flip(data: bytes, at: int, value: int) -> bytes:
        return data[:at % max(1, len(data))] + bytes([value]) + data[at % max(1, len(data)) + 1:] if data else bytes([value])
    return st.one_of(st.binary(max_size=200),
                     st.builds(flip, st.just(message), st.integers(0, 10**6), st.integers(0, 255)),
                     st.integers(0, len(message)).map(lambda n: message[:n]),
                     st.binary(max_size=20).map(lambda tail: message + tail))
