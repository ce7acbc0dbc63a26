"""The requests the compatibility suite sends to vLLM's own OpenAI server and to pdserve
(test_openai_vllm_server.py): one table, each case a path and a body, sent as it is and, where
the API streams, again with `"stream": true`.

Some bodies are built from vLLM's own greedy answer to the base prompt (`Greedy`), so a stop
string or stop token is one the output really meets rather than one the suite hopes it meets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MODEL = "tiny"   # the name both servers serve (pdserve: the model directory's name)
PROMPT = "The history of the city begins with"
CHAT = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Tell me about rivers."}]
GREEDY = {"model": MODEL, "temperature": 0.0, "max_tokens": 12}
SEEDED = {"model": MODEL, "temperature": 1.0, "seed": 1234, "max_tokens": 12}
BEAM = GREEDY | {"use_beam_search": True, "n": 2, "max_tokens": 8}   # width 2: up to 2 * 8 one-token steps
REPEATING = list(range(300, 340))   # token ids whose greedy output comes back to a prompt token
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOL_HISTORY = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call-1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call-1", "content": "sunny"}]
JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
               "required": ["name"], "additionalProperties": False}


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: dict | None = None                  # None: a GET
    streams: bool = True                      # also sent with "stream": true
    stream_extra: dict = field(default_factory=dict)   # what the streamed variant adds besides "stream"

    @property
    def method(self) -> str:
        return "GET" if self.body is None else "POST"

    def variants(self) -> list[tuple[str, dict | None]]:
        """(variant name, body): the case as it is, then streamed where it streams."""
        plain = [(self.name, self.body)]
        if not self.streams or self.body is None:
            return plain
        return plain + [(f"{self.name}[stream]", self.body | {"stream": True} | self.stream_extra)]


@dataclass(frozen=True)
class Known:
    """What the cases are built from, asked of vLLM's server first: its greedy answer to `PROMPT`
    with `GREEDY` (text and token ids), `PROMPT`'s token ids, and a user message whose chat
    prompt is `LONG_CHAT_TOKENS` long."""
    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    long_message: str

    def words(self) -> list[str]:
        """The greedy text's first words: bad words the output really meets."""
        return self.text.split()[:2]

    def listed_ids(self) -> list[int]:
        """`logprob_token_ids` that hold the greedy output's first token (whose rank vLLM then
        gives as its place in the list), a later one, and one listed twice."""
        return [300, self.token_ids[0], self.token_ids[3], 300]

    def stop_string(self) -> str:
        """Three characters first met in the second half of the text: a stop after a few tokens."""
        half = len(self.text) // 2
        return next(self.text[i:i + 3] for i in range(half, len(self.text) - 2)
                    if self.text[i:i + 3].strip() and self.text.find(self.text[i:i + 3]) == i)


CONTEXT_TOKENS = 2048   # the engines' max_model_len (cluster_helpers.engine_settings)
LONG_CHAT_TOKENS = CONTEXT_TOKENS - 6


def cases(known: Known) -> list[Case]:
    completions, chat = "/v1/completions", "/v1/chat/completions"
    greedy, prompt_ids = known, known.prompt_ids
    near_context = (prompt_ids * CONTEXT_TOKENS)[:CONTEXT_TOKENS - 5]
    return [
        Case("completion_greedy", completions, GREEDY | {"prompt": PROMPT}),
        Case("completion_usage_in_stream", completions, GREEDY | {"prompt": PROMPT},
             stream_extra={"stream_options": {"include_usage": True}}),
        Case("completion_stop_string", completions, GREEDY | {"prompt": PROMPT, "stop": [greedy.stop_string()]}),
        Case("completion_stop_string_kept", completions, GREEDY | {"prompt": PROMPT, "stop": greedy.stop_string(),
                                                                   "include_stop_str_in_output": True}),
        Case("completion_stop_token_ids", completions, GREEDY | {"prompt": PROMPT,
                                                                 "stop_token_ids": [greedy.token_ids[4]]}),
        Case("completion_min_tokens", completions, GREEDY | {"prompt": PROMPT, "min_tokens": 6,
                                                             "stop_token_ids": [greedy.token_ids[2]]}),
        Case("completion_ignore_eos", completions, GREEDY | {"prompt": PROMPT, "ignore_eos": True}),
        Case("completion_seeded", completions, SEEDED | {"prompt": PROMPT, "top_p": 0.9, "top_k": 50}),
        Case("completion_repeating", completions, GREEDY | {"prompt": REPEATING, "max_tokens": 24}),
        Case("completion_penalties", completions, GREEDY | {"prompt": REPEATING, "max_tokens": 24,
                                                            "presence_penalty": 1.5, "frequency_penalty": 1.0,
                                                            "repetition_penalty": 2.0}),
        Case("completion_n2_seeded", completions, SEEDED | {"prompt": PROMPT, "n": 2}),
        Case("completion_logprobs", completions, GREEDY | {"prompt": PROMPT, "logprobs": 3}),
        Case("completion_logprob_token_ids", completions,
             GREEDY | {"prompt": PROMPT, "logprobs": 0, "logprob_token_ids": greedy.listed_ids()}),
        Case("completion_logprob_token_ids_echo", completions,
             GREEDY | {"prompt": PROMPT, "logprobs": 2, "logprob_token_ids": greedy.listed_ids()[:2], "echo": True,
                       "max_tokens": 4}, streams=False),
        Case("completion_echo_logprobs", completions, GREEDY | {"prompt": PROMPT, "echo": True, "logprobs": 1,
                                                                "max_tokens": 4}, streams=False),
        Case("completion_echo", completions, GREEDY | {"prompt": PROMPT, "echo": True, "max_tokens": 4},
             streams=False),
        Case("completion_echo_without_generation", completions, GREEDY | {"prompt": PROMPT, "echo": True,
                                                                          "max_tokens": 0, "logprobs": 2}),
        Case("completion_echo_without_generation_ids", completions, GREEDY | {"prompt": PROMPT, "echo": True,
                                                                              "max_tokens": 0,
                                                                              "return_token_ids": True}),
        Case("completion_token_ids", completions, GREEDY | {"prompt": prompt_ids}),
        Case("completion_prompt_list", completions, GREEDY | {"prompt": [PROMPT, "Rivers run"], "max_tokens": 6}),
        Case("completion_json_schema", completions,
             GREEDY | {"prompt": PROMPT, "max_tokens": 24,
                       "response_format": {"type": "json_schema",
                                           "json_schema": {"name": "person", "schema": JSON_SCHEMA}}}),
        Case("chat_greedy", chat, GREEDY | {"messages": CHAT}),
        Case("chat_usage_in_stream", chat, GREEDY | {"messages": CHAT},
             stream_extra={"stream_options": {"include_usage": True}}),
        Case("chat_text_parts", chat, GREEDY | {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "about rivers."}]}]}),
        Case("chat_seeded", chat, SEEDED | {"messages": CHAT}),
        Case("chat_logprobs", chat, GREEDY | {"messages": CHAT, "logprobs": True, "top_logprobs": 2}),
        Case("chat_logprob_token_ids", chat, GREEDY | {"messages": CHAT, "logprobs": True, "top_logprobs": 2,
                                                       "logprob_token_ids": greedy.listed_ids()}),
        Case("chat_prompt_logprobs", chat, GREEDY | {"messages": CHAT, "prompt_logprobs": 2}, streams=False),
        Case("chat_prompt_logprobs_zero", chat, GREEDY | {"messages": CHAT, "prompt_logprobs": 0}),
        Case("chat_prompt_logprobs_echo", chat, GREEDY | {"messages": CHAT, "echo": True, "logprobs": True,
                                                         "top_logprobs": 1, "prompt_logprobs": 3}, streams=False),
        Case("chat_structured_outputs", chat, GREEDY | {"messages": CHAT, "max_tokens": 24,
                                                        "structured_outputs": {"json": JSON_SCHEMA}}),
        Case("chat_max_completion_tokens", chat, {"model": MODEL, "temperature": 0.0, "messages": CHAT,
                                                  "max_completion_tokens": 5}),
        Case("completion_default_max_tokens", completions, {"model": MODEL, "prompt": PROMPT, "temperature": 0.0}),
        Case("completion_max_tokens_past_context", completions, GREEDY | {"prompt": near_context, "max_tokens": 50}),
        Case("chat_default_max_tokens", chat, {"model": MODEL, "temperature": 0.0,
                                               "messages": [{"role": "user", "content": known.long_message}]}),
        Case("completion_greedy_n2", completions, GREEDY | {"prompt": PROMPT, "n": 2}, streams=False),
        Case("completion_best_of", completions, GREEDY | {"prompt": PROMPT, "best_of": 2}, streams=False),
        Case("completion_truncate_prompt_tokens", completions,
             GREEDY | {"prompt": PROMPT, "truncate_prompt_tokens": 4}),
        Case("completion_truncate_right", completions, GREEDY | {"prompt": PROMPT, "truncate_prompt_tokens": 4,
                                                                 "truncation_side": "right"}, streams=False),
        Case("completion_truncate_token_ids", completions, GREEDY | {"prompt": prompt_ids, "truncate_prompt_tokens": 3,
                                                                     "echo": True, "max_tokens": 4}, streams=False),
        Case("completion_truncate_to_context", completions,
             GREEDY | {"prompt": (prompt_ids * CONTEXT_TOKENS)[:CONTEXT_TOKENS + 10], "truncate_prompt_tokens": -1,
                       "max_tokens": 5}, streams=False),
        Case("completion_no_special_tokens", completions, GREEDY | {"prompt": PROMPT, "add_special_tokens": False}),
        Case("completion_bad_words", completions, GREEDY | {"prompt": PROMPT, "bad_words": greedy.words()}),
        Case("completion_special_tokens_unspaced", completions,
             GREEDY | {"prompt": PROMPT, "max_tokens": 6, "allowed_token_ids": [2, 3, 300],
                       "skip_special_tokens": False, "spaces_between_special_tokens": False}),
        Case("completion_return_token_ids", completions, GREEDY | {"prompt": [PROMPT, "Rivers run"], "max_tokens": 6,
                                                                   "return_token_ids": True}),
        Case("completion_return_token_ids_echo", completions, GREEDY | {"prompt": PROMPT, "return_token_ids": True,
                                                                        "echo": True, "max_tokens": 4}, streams=False),
        Case("completion_priority", completions, GREEDY | {"prompt": PROMPT, "priority": 5}, streams=False),
        Case("completion_cache_salt", completions, GREEDY | {"prompt": PROMPT, "cache_salt": "tenant-a"}),
        Case("chat_cache_salt", chat, GREEDY | {"messages": CHAT, "cache_salt": "tenant-b"}, streams=False),
        Case("chat_no_generation_prompt", chat, GREEDY | {"messages": CHAT, "add_generation_prompt": False}),
        Case("chat_continue_final_message", chat,
             GREEDY | {"messages": CHAT + [{"role": "assistant", "content": "Rivers are"}], "echo": True,
                       "continue_final_message": True, "add_generation_prompt": False}),
        Case("chat_template_kwargs", chat, GREEDY | {"messages": CHAT, "chat_template_kwargs": {
            "bos_token": "Hello", "add_generation_prompt": False, "not_in_template": 1}}),
        Case("chat_add_special_tokens", chat, GREEDY | {"messages": CHAT, "add_special_tokens": True}, streams=False),
        Case("chat_bad_words", chat, GREEDY | {"messages": CHAT, "bad_words": ["the", "river"]}),
        Case("chat_return_token_ids", chat, GREEDY | {"messages": CHAT, "return_token_ids": True}),
        Case("chat_truncate_prompt_tokens", chat, GREEDY | {"messages": CHAT, "truncate_prompt_tokens": 10,
                                                           "truncation_side": "left"}, streams=False),
        # beam search (vLLM's serving layer runs it; pdserve's router, each step a request)
        Case("completion_beam_search", completions, BEAM | {"prompt": PROMPT}),   # streamed: vLLM refuses it
        Case("completion_beam_search_logprobs", completions, BEAM | {"prompt": PROMPT, "n": 3, "logprobs": 2,
                                                                     "length_penalty": 0.5, "return_token_ids": True},
             streams=False),
        Case("completion_beam_search_prompts_echo", completions, BEAM | {"prompt": [PROMPT, "Rivers run"],
                                                                         "echo": True, "max_tokens": 5},
             streams=False),
        Case("completion_beam_search_ignores_sampling", completions,
             BEAM | {"prompt": PROMPT, "ignore_eos": True, "include_stop_str_in_output": True,
                     "stop": [greedy.stop_string()], "seed": 3, "top_p": 0.5, "presence_penalty": 1.0},
             streams=False),
        Case("completion_beam_search_widest", completions, BEAM | {"prompt": PROMPT, "n": 10, "max_tokens": 3,
                                                                   "logprobs": 0}, streams=False),   # 20 logprobs
        Case("completion_beam_search_max_tokens_zero", completions, BEAM | {"prompt": PROMPT, "max_tokens": 0},
             streams=False),
        Case("chat_beam_search", chat, BEAM | {"messages": CHAT},
             stream_extra={"stream_options": {"include_usage": True}}),
        Case("chat_beam_search_logprobs", chat, BEAM | {"messages": CHAT, "logprobs": True, "top_logprobs": 2,
                                                        "max_tokens": 6, "return_token_ids": True}),
        Case("beam_search_logprob_token_ids", completions, BEAM | {"prompt": PROMPT, "logprobs": 1,
                                                                   "logprob_token_ids": [11]}, streams=False),
        Case("beam_search_too_wide", completions, BEAM | {"prompt": PROMPT, "n": 11}, streams=False),   # 22 logprobs
        Case("beam_search_echo_logprobs", completions, BEAM | {"prompt": PROMPT, "echo": True, "logprobs": 1},
             streams=False),
        # tools: both servers run vLLM's hermes parser with auto tool choice (TOOL_PARSER_FLAGS)
        Case("chat_tools_none", chat, GREEDY | {"messages": CHAT, "tools": [WEATHER_TOOL], "tool_choice": "none"}),
        Case("chat_tools_auto", chat, GREEDY | {"messages": CHAT, "tools": [WEATHER_TOOL, TIME_TOOL]}),
        Case("chat_tools_required", chat, GREEDY | {"messages": CHAT, "tools": [WEATHER_TOOL, TIME_TOOL],
                                                    "tool_choice": "required", "max_tokens": 48}),
        Case("chat_tools_named", chat, GREEDY | {"messages": CHAT, "tools": [WEATHER_TOOL, TIME_TOOL], "max_tokens": 48,
                                                 "tool_choice": {"type": "function",
                                                                 "function": {"name": "get_time"}}}),
        Case("chat_tools_one_call", chat, GREEDY | {"messages": CHAT, "tools": [WEATHER_TOOL, TIME_TOOL],
                                                    "tool_choice": "required", "parallel_tool_calls": False,
                                                    "max_tokens": 48}, streams=False),
        Case("chat_tool_history", chat, GREEDY | {"messages": TOOL_HISTORY, "tools": [WEATHER_TOOL]}),
        Case("chat_developer_role", chat, GREEDY | {"messages": [{"role": "developer", "content": "Be brief."}] + CHAT}),
        Case("tokenize_developer_role", "/tokenize", {"model": MODEL, "messages": [
            {"role": "user", "content": "Hi"}, {"role": "developer", "content": "Be brief."}]}, streams=False),
        Case("chat_message_other_fields", chat, GREEDY | {"messages": [
            {"role": "user", "content": "Hi", "refusal": None, "task": "greet"},
            {"role": "assistant", "content": "Hello", "refusal": "no", "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "user", "content": "Rivers?"}]}, streams=False),
        Case("chat_image_part", chat, GREEDY | {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, streams=False),
        Case("tools_empty", chat, GREEDY | {"messages": CHAT, "tools": []}, streams=False),
        Case("tool_choice_without_tools", chat, GREEDY | {"messages": CHAT, "tool_choice": "required"}, streams=False),
        Case("tool_choice_unknown_function", chat, GREEDY | {"messages": CHAT, "tools": [WEATHER_TOOL], "tool_choice": {
            "type": "function", "function": {"name": "get_time"}}}, streams=False),
        Case("tool_choice_unknown_word", chat, GREEDY | {"messages": CHAT, "tools": [WEATHER_TOOL],
                                                         "tool_choice": "sometimes"}, streams=False),
        Case("completion_logprobs_too_many", completions, GREEDY | {"prompt": PROMPT, "logprobs": 21}, streams=False),
        Case("stream_options_unknown_key", completions, GREEDY | {"prompt": PROMPT, "stream": True,
                                                                  "stream_options": {"no_such_option": 1}},
             streams=False),
        Case("chat_message_unknown_key", chat, GREEDY | {"messages": [{"role": "user", "content": "Hi", "mood": 1}]},
             streams=False),
        Case("prompt_at_context", completions, GREEDY | {"prompt": (prompt_ids * CONTEXT_TOKENS)[:CONTEXT_TOKENS],
                                                         "max_tokens": 5}, streams=False),
        Case("models", "/v1/models"),
        Case("tokenize_prompt", "/tokenize", {"model": MODEL, "prompt": PROMPT}, streams=False),
        Case("tokenize_chat", "/tokenize", {"model": MODEL, "messages": CHAT}, streams=False),
        Case("tokenize_chat_tools", "/tokenize", {"model": MODEL, "messages": TOOL_HISTORY, "tools": [WEATHER_TOOL],
                                                  "chat_template_kwargs": {"bos_token": "Hello"}}, streams=False),
        Case("detokenize", "/detokenize", {"model": MODEL, "tokens": prompt_ids}, streams=False),
        # refusals: status and error body
        Case("unknown_model", completions, GREEDY | {"prompt": PROMPT, "model": "nonexistent"}),
        Case("unknown_model_chat", chat, GREEDY | {"messages": CHAT, "model": "nonexistent"}, streams=False),
        Case("temperature_negative", completions, GREEDY | {"prompt": PROMPT, "temperature": -1}, streams=False),
        Case("max_tokens_zero", completions, GREEDY | {"prompt": PROMPT, "max_tokens": 0}, streams=False),
        Case("n_zero", completions, GREEDY | {"prompt": PROMPT, "n": 0}, streams=False),
        Case("top_p_zero", completions, GREEDY | {"prompt": PROMPT, "top_p": 0}, streams=False),
        Case("logprobs_wrong_type", completions, GREEDY | {"prompt": PROMPT, "logprobs": "many"}, streams=False),
        Case("top_logprobs_without_logprobs", chat, GREEDY | {"messages": CHAT, "top_logprobs": 2}, streams=False),
        Case("logprob_token_ids_without_logprobs", completions,
             GREEDY | {"prompt": PROMPT, "logprob_token_ids": [300]}, streams=False),
        Case("chat_logprob_token_ids_without_logprobs", chat,
             GREEDY | {"messages": CHAT, "logprob_token_ids": [300]}, streams=False),
        Case("logprob_token_ids_echo_without_tokens", completions,
             GREEDY | {"prompt": PROMPT, "logprobs": 0, "logprob_token_ids": [300], "echo": True, "max_tokens": 0},
             streams=False),
        Case("logprob_token_ids_with_beam_search", completions,
             GREEDY | {"prompt": PROMPT, "logprobs": 0, "logprob_token_ids": [300], "use_beam_search": True},
             streams=False),
        Case("logprob_token_ids_out_of_vocab", chat,
             GREEDY | {"messages": CHAT, "logprobs": True, "logprob_token_ids": [300, 5000]}, streams=False),
        Case("logprob_token_ids_too_many", completions,
             GREEDY | {"prompt": PROMPT, "logprobs": 0, "logprob_token_ids": list(range(129))}, streams=False),
        Case("logprob_token_ids_not_a_list", completions,
             GREEDY | {"prompt": PROMPT, "logprobs": 0, "logprob_token_ids": "300"}, streams=False),
        Case("chat_prompt_logprobs_streamed", chat, GREEDY | {"messages": CHAT, "prompt_logprobs": 1, "stream": True},
             streams=False),
        Case("chat_prompt_logprobs_negative", chat, GREEDY | {"messages": CHAT, "prompt_logprobs": -2}, streams=False),
        Case("chat_prompt_logprobs_too_many", chat, GREEDY | {"messages": CHAT, "prompt_logprobs": 21}, streams=False),
        Case("prompt_missing", completions, GREEDY, streams=False),
        Case("messages_empty", chat, GREEDY | {"messages": []}, streams=False),
        Case("wrong_type", completions, GREEDY | {"prompt": PROMPT, "max_tokens": "ten"}, streams=False),
        Case("prompt_too_long", completions, GREEDY | {"prompt": prompt_ids * 400}, streams=False),
        Case("truncate_past_context", completions, GREEDY | {"prompt": PROMPT, "truncate_prompt_tokens": 5000},
             streams=False),
        Case("truncate_below_minus_one", completions, GREEDY | {"prompt": PROMPT, "truncate_prompt_tokens": -2},
             streams=False),
        Case("truncation_side_unknown", completions, GREEDY | {"prompt": PROMPT, "truncate_prompt_tokens": 2,
                                                               "truncation_side": "middle"}, streams=False),
        Case("max_tokens_past_context", completions, GREEDY | {"prompt": PROMPT, "max_tokens": 5000}, streams=False),
        Case("suffix_text_prompt", completions, GREEDY | {"prompt": PROMPT, "suffix": " and so on."}, streams=False),
        Case("suffix_token_prompt", completions, GREEDY | {"prompt": prompt_ids, "suffix": "x"}, streams=False),
        Case("suffix_with_echo", completions, GREEDY | {"prompt": PROMPT, "suffix": "x", "echo": True}, streams=False),
        Case("suffix_with_truncate", completions, GREEDY | {"prompt": PROMPT, "suffix": "x",
                                                            "truncate_prompt_tokens": 3}, streams=False),
        Case("cache_salt_empty", completions, GREEDY | {"prompt": PROMPT, "cache_salt": ""}, streams=False),
        Case("cache_salt_forbidden_char", chat, GREEDY | {"messages": CHAT, "cache_salt": "a/b"}, streams=False),
        Case("cache_salt_not_a_string", completions, GREEDY | {"prompt": PROMPT, "cache_salt": 7}, streams=False),
        Case("bad_words_empty_word", completions, GREEDY | {"prompt": PROMPT, "bad_words": [""]}, streams=False),
        Case("continue_with_generation_prompt", chat, GREEDY | {"messages": CHAT, "continue_final_message": True,
                                                                "add_generation_prompt": True}, streams=False),
        Case("continue_final_message_alone", chat, GREEDY | {"messages": CHAT, "continue_final_message": True},
             streams=False),
        Case("chat_template_untrusted", chat, GREEDY | {"messages": CHAT, "chat_template": "{{ messages }}"},
             streams=False),
        Case("stream_options_without_stream", completions, GREEDY | {"prompt": PROMPT, "stream_options":
                                                                     {"include_usage": True}}, streams=False),
        *vllm_extra_field_cases(),
        Case("unknown_field", completions, GREEDY | {"prompt": PROMPT, "no_such_field": 1}),
        Case("unknown_route", "/v1/nothing", {"model": MODEL}, streams=False),
    ]


REPETITION = {"max_pattern_size": 4, "min_count": 2}   # any n-gram up to 4 tokens twice in a row ends it
INERT = {"session_id": "session-1", "watermarking": True, "return_token_offsets": True,
         "vllm_xargs": {"session_id": "session-2", "note": ["a", 1, 0.5]}, "thinking_token_budget": -1}


# vLLM's render, MoE and connector fields: unused on a text-only model without a connector
UNUSED = {"mm_payload": "none", "return_mm_kwargs": True, "routed_experts_prompt_start": 0,
          "kv_transfer_params": {"do_remote_prefill": True}, "ec_transfer_params": {"x": 1}}


def vllm_extra_field_cases() -> list[Case]:
    """vLLM's extra fields (router/openai_vllm_extras.py): served ones, the ones that change
    nothing on vLLM's server as shipped, and vLLM's refusals of their bad values."""
    completions, chat = "/v1/completions", "/v1/chat/completions"
    return [
        Case("completion_stream_interval", completions, GREEDY | {"prompt": PROMPT, "stream_interval": 4}),
        Case("completion_stream_interval_logprobs", completions,
             GREEDY | {"prompt": PROMPT, "stream_interval": 5, "logprobs": 2},
             stream_extra={"stream_options": {"include_usage": True}}),
        Case("chat_stream_interval_n2", chat, SEEDED | {"messages": CHAT, "n": 2, "stream_interval": 3,
                                                         "logprobs": True, "top_logprobs": 1}),
        # one token allowed: it repeats from the first, so the third (the decode engine's second) ends it
        Case("completion_repetition_detection", completions,
             GREEDY | {"prompt": PROMPT, "allowed_token_ids": [300],
                       "repetition_detection": {"max_pattern_size": 2, "min_count": 3}}),
        # three tokens allowed: a pattern of up to 4 of them twice in a row, not before the 6th token
        Case("chat_repetition_detection", chat, GREEDY | {"messages": CHAT, "max_tokens": 40,
                                                          "allowed_token_ids": [300, 301, 302], "min_tokens": 6,
                                                          "repetition_detection": REPETITION}),
        Case("completion_repetition_not_met", completions, GREEDY | {"prompt": PROMPT,
                                                                     "repetition_detection": REPETITION}),
        Case("chat_return_prompt_text", chat, GREEDY | {"messages": CHAT, "return_prompt_text": True}),
        Case("chat_reasoning_effort", chat, GREEDY | {"messages": CHAT, "reasoning_effort": "low"}),
        Case("chat_reasoning_effort_none", chat, GREEDY | {"messages": CHAT, "reasoning_effort": "none",
                                                           "include_reasoning": False}, streams=False),
        Case("completion_inert_fields", completions, GREEDY | {"prompt": PROMPT} | INERT),
        Case("chat_inert_fields", chat, GREEDY | {"messages": CHAT, "include_reasoning": False} | INERT),
        Case("completion_mm_and_connector_fields", completions, GREEDY | {"prompt": PROMPT} | UNUSED),
        Case("chat_mm_and_connector_fields", chat, GREEDY | {"messages": CHAT} | UNUSED, streams=False),
        Case("mm_payload_unknown", completions, GREEDY | {"prompt": PROMPT, "mm_payload": "all"}, streams=False),
        Case("routed_experts_prompt_start_negative", chat, GREEDY | {"messages": CHAT,
                                                                     "routed_experts_prompt_start": -1}, streams=False),
        Case("mm_processor_kwargs_untrusted", chat, GREEDY | {"messages": CHAT, "mm_processor_kwargs": {"x": 1}},
             streams=False),
        Case("media_io_kwargs_untrusted", chat, GREEDY | {"messages": CHAT, "media_io_kwargs": {"image": {"x": 1}}},
             streams=False),
        Case("prompt_embeds_disabled", completions, GREEDY | {"prompt": PROMPT, "prompt_embeds": "AAAA"},
             streams=False),
        Case("prompt_embeds_alone", completions, GREEDY | {"prompt_embeds": "AAAA"}, streams=False),
        Case("thinking_token_budget", completions, GREEDY | {"prompt": PROMPT, "thinking_token_budget": 16}),
        Case("thinking_token_budget_chat", chat, GREEDY | {"messages": CHAT, "thinking_token_budget": 0}),
        # vLLM's refusals of bad values
        Case("stream_interval_zero", completions, GREEDY | {"prompt": PROMPT, "stream": True, "stream_interval": 0},
             streams=False),
        Case("repetition_detection_one_count", completions,
             GREEDY | {"prompt": PROMPT, "repetition_detection": {"max_pattern_size": 2, "min_count": 1}},
             streams=False),
        Case("repetition_detection_sizes_crossed", chat,
             GREEDY | {"messages": CHAT, "repetition_detection": {"max_pattern_size": 2, "min_pattern_size": 3,
                                                                 "min_count": 2}}, streams=False),
        Case("repetition_detection_wrong_type", completions,
             GREEDY | {"prompt": PROMPT, "repetition_detection": {"max_pattern_size": "many"}}, streams=False),
        Case("thinking_token_budget_negative", completions, GREEDY | {"prompt": PROMPT, "thinking_token_budget": -2},
             streams=False),
        Case("thinking_token_budget_float", chat, GREEDY | {"messages": CHAT, "thinking_token_budget": 1.5},
             streams=False),
        Case("vllm_xargs_past_64_bits", completions, GREEDY | {"prompt": PROMPT, "vllm_xargs": {"n": 2**64}},
             streams=False),
        Case("vllm_xargs_nested", chat, GREEDY | {"messages": CHAT, "vllm_xargs": {"n": {"deeper": 1}}},
             streams=False),
        Case("session_id_not_a_string", completions, GREEDY | {"prompt": PROMPT, "session_id": 7}, streams=False),
        Case("watermarking_not_a_bool", chat, GREEDY | {"messages": CHAT, "watermarking": "perhaps"}, streams=False),
        Case("reasoning_effort_unknown", chat, GREEDY | {"messages": CHAT, "reasoning_effort": "extreme"},
             streams=False),
        Case("include_reasoning_not_a_bool", chat, GREEDY | {"messages": CHAT, "include_reasoning": "perhaps"},
             streams=False),
    ]
