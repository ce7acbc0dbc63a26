"""The compatibility suite's comparison (tests/openai_compat.py) on plain values: what it reports,
by JSON path, and what it lets pass."""

from openai_compat import (
    ABSENT, Answer, Difference, Intended, coalesced, compare, differences, stream_view, unexplained,
)


def _completion(text: str, logprob: float = -1.25, **extra) -> dict:
    return {"id": "cmpl-1", "created": 1, "model": "tiny", "object": "text_completion",
            "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": {"token_logprobs": [logprob]}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}, **extra}


def test_a_different_text_status_and_count_are_each_reported_at_their_json_path():
    expected = Answer(200, _completion("abc"))
    actual = Answer(400, _completion("abd") | {"usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 4}})
    assert compare(expected, actual) == [Difference("status", 200, 400), Difference("body.choices.0.text", "abc", "abd"),
                                         Difference("body.usage.completion_tokens", 1, 2)]


def test_ids_timestamps_null_for_absent_and_floats_within_tolerance_are_no_difference():
    expected = _completion("abc", -1.25, kv_transfer_params=None)
    actual = _completion("abc", -1.2504) | {"id": "cmpl-2", "created": 2}
    assert differences(expected, actual, "body") == []
    assert differences(_completion("abc", -1.25), _completion("abc", -1.26), "body") == [
        Difference("body.choices.0.logprobs.token_logprobs.0", -1.25, -1.26)]


def test_a_missing_id_a_missing_field_and_a_changed_type_are_differences():
    expected = _completion("abc")
    actual = {k: v for k, v in _completion("abc").items() if k not in ("id", "model")} | {"usage": {
        "prompt_tokens": 3.0, "completion_tokens": 1, "total_tokens": 4}}
    assert differences(expected, actual, "body") == [Difference("body.id", "cmpl-1", ABSENT),
                                                     Difference("body.model", "tiny", ABSENT),
                                                     Difference("body.usage.prompt_tokens", 3, 3.0)]


def test_error_messages_are_compared_by_shape_and_the_rest_of_the_error_exactly():
    vllm = {"error": {"message": "n must be at least 1", "type": "BadRequestError", "param": None, "code": 400}}
    pdserve = {"error": {"message": "other words", "type": "invalid_request_error", "param": None, "code": 400}}
    assert differences(vllm, pdserve, "body") == [Difference("body.error.type", "BadRequestError",
                                                             "invalid_request_error")]


def test_streams_are_compared_choice_by_choice_whatever_the_interleaving():
    def event(index, text):
        return {"id": "x", "created": 1, "choices": [{"index": index, "text": text}]}
    usage = {"id": "x", "created": 1, "choices": [], "usage": {"completion_tokens": 2}}
    vllm = [event(0, "a"), event(1, "b"), event(0, "c"), usage]
    pdserve = [event(1, "b"), event(0, "a"), event(0, "c"), usage]
    assert compare(Answer(200, vllm, True), Answer(200, pdserve, True)) == []
    assert stream_view(pdserve)["choice 0"] == [event(0, "ac")]   # text-only events read as one
    shorter = [event(0, "a"), event(1, "b"), usage]
    assert compare(Answer(200, vllm, True), Answer(200, shorter, True)) == [
        Difference("events.choice 0.0.choices.0.text", "ac", "a")]


def test_a_stream_s_text_is_compared_however_it_was_cut_into_events_and_the_rest_event_by_event():
    def delta(content=None, finish=None, **more):
        return {"id": "x", "choices": [{"index": 0, "delta": ({} if content is None else {"content": content}) | more,
                                        "logprobs": None, "finish_reason": finish}]}
    role = delta("", role="assistant")
    vllm = [role, delta("ab"), delta("c"), delta("d", finish="length")]
    pdserve = [role, delta("a"), delta("b"), delta("c"), delta("d", finish="length")]
    assert compare(Answer(200, vllm, True), Answer(200, pdserve, True)) == []
    assert coalesced(pdserve) == [role, delta("abcd", finish="length")]
    other_finish = pdserve[:-1] + [delta("d", finish="stop")]
    assert compare(Answer(200, vllm, True), Answer(200, other_finish, True)) == [
        Difference("events.choice 0.1.choices.0.finish_reason", "length", "stop")]
    with_logprobs = [role, {"id": "x", "choices": [{"index": 0, "delta": {"content": "ab"}, "logprobs": {"c": []},
                                                    "finish_reason": None}]}]
    assert coalesced(with_logprobs) == with_logprobs   # an event carrying more than text is kept as it is
    empty_fields = [delta("a", reasoning=None, tool_calls=[]), delta("b", tool_calls=[]), delta("c", finish="length")]
    assert [e["choices"][0]["delta"]["content"] for e in coalesced(empty_fields)] == ["abc"]  # None, [] carry nothing


def test_a_stream_s_token_ids_and_logprobs_are_read_as_one_however_they_were_cut():
    def chat(content, ids, finish=None):
        entries = [{"token": c, "logprob": -0.5, "bytes": [ord(c)], "top_logprobs": []} for c in content]
        return {"id": "x", "choices": [{"index": 0, "delta": {"content": content}, "token_ids": ids,
                                        "logprobs": {"content": entries, "refusal": None}, "finish_reason": finish}]}
    role = {"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "prompt_token_ids": [7, 8], "finish_reason": None}]}
    vllm = [role, chat("ab", [1, 2]), chat("c", [3], finish="length")]
    pdserve = [role, chat("a", [1]), chat("b", [2]), chat("c", [3], finish="length")]
    assert compare(Answer(200, vllm, True), Answer(200, pdserve, True)) == []
    assert coalesced(pdserve) == [role, chat("abc", [1, 2, 3], finish="length")]
    swapped = [role, chat("a", [2]), chat("b", [1]), chat("c", [3], finish="length")]
    assert compare(Answer(200, vllm, True), Answer(200, swapped, True)) == [
        Difference("events.choice 0.1.choices.0.token_ids.0", 1, 2),
        Difference("events.choice 0.1.choices.0.token_ids.1", 2, 1)]   # the order of the tokens counts

    def completion(text, offsets):
        return {"id": "x", "choices": [{"index": 0, "text": text, "finish_reason": None, "logprobs": {
            "text_offset": offsets, "token_logprobs": [-0.5] * len(text), "tokens": list(text),
            "top_logprobs": [{c: -0.5} for c in text]}}]}
    cut = [completion("a", [0]), completion("bc", [1, 2])]
    assert coalesced(cut) == [completion("abc", [0, 1, 2])]   # a run at the end stays one event


def test_a_streamed_tool_call_s_arguments_are_read_as_one_however_they_were_cut():
    def call(index=0, arguments=None, finish=None, name=None, **head):
        function = {"arguments": arguments} | ({"name": name} if name else {})
        calls = [] if arguments is None else [{"index": index, **head, "function": function}]
        return {"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": calls}, "logprobs": None,
                                        "finish_reason": finish}]}
    opened = call(id="call-1", type="function", name="get_weather", arguments="")
    # vLLM sent the arguments in two events and the finish apart; pdserve in one event with the finish
    vllm = [opened, call(arguments='{"on": tr'), call(arguments='ue}'), call(finish="tool_calls")]
    pdserve = [opened, call(arguments='{"on": true}', finish="tool_calls")]
    assert compare(Answer(200, vllm, True), Answer(200, pdserve, True)) == []
    assert coalesced(vllm)[1]["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "function": {"arguments": '{"on": true}'}}]   # one call, its arguments joined
    other = [opened, call(arguments='{"on": fa'), call(arguments="lse}"), call(finish="tool_calls")]
    assert [d.path for d in compare(Answer(200, vllm, True), Answer(200, other, True))] == [
        "events.choice 0.1.choices.0.delta.tool_calls.0.function.arguments"]
    # a second call's opening (its id and name) is never a piece: it stays an event of its own
    second = call(index=1, id="call-2", type="function", name="get_time", arguments="")
    assert len(coalesced([opened, call(arguments="{}"), second, call(finish="tool_calls")])) == 3


def test_only_an_intended_entry_s_path_case_and_vllm_value_excuse_a_difference():
    named = Difference("body.error.param", None, "n")
    renamed = Difference("body.error.param", "input_tokens", "prompt")
    entry = Intended("*error.param", "pdserve names the field", vllm_value=None)
    assert unexplained("n_zero", [named, renamed], (entry,)) == [renamed]
    only_here = Intended("*", "a gap", case="one_case")
    assert unexplained("one_case", [renamed], (only_here,)) == []
    assert unexplained("other_case", [renamed], (only_here,)) == [renamed]
