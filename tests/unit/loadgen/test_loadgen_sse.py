"""SSE decoding and OpenAI completion chunks, on plain values."""

import pytest

from loadgen.targets.base import Delta, TargetError
from loadgen.targets.sse import SSEDecoder, error_message, parse_completion_chunk


def test_decoder_yields_one_event_per_blank_line_and_skips_comments():
    decoder = SSEDecoder()
    lines = [": ping", "data: {\"a\": 1}", "", "event: x", "data:line1", "data: line2", "", "data: [DONE]", ""]
    assert [e for line in lines if (e := decoder.feed(line)) is not None] == ['{"a": 1}', "line1\nline2", "[DONE]"]
    decoder.feed("data: tail")
    assert decoder.flush() == "tail" and decoder.flush() is None


def test_completion_chunks_become_content_or_usage_deltas():
    assert parse_completion_chunk('{"choices": [{"text": " hi"}]}') == Delta(content=True, text=" hi")
    assert parse_completion_chunk('{"choices": [{"text": null}]}') == Delta(content=True, text="")
    usage = '{"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}'
    assert parse_completion_chunk(usage) == Delta(content=False, completion_tokens=3, prompt_tokens=7)
    assert parse_completion_chunk('{"id": "x"}') is None


def test_error_events_and_garbage_raise_target_errors():
    with pytest.raises(TargetError, match="stream error: overloaded"):
        parse_completion_chunk('{"error": {"message": "overloaded"}}')
    with pytest.raises(TargetError, match="not JSON"):
        parse_completion_chunk("{oops")


def test_error_message_reads_openai_and_vllm_bodies():
    assert error_message('{"error": {"message": "too long"}}') == "too long"
    assert error_message('{"message": "bad model", "code": 404}') == "bad model"
    assert error_message("plain text") == "plain text"
