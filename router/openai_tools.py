"""A chat's tools, and its answer's tool calls and reasoning, as vLLM's OpenAI server serves them
(`chat_completion/protocol.py`, `renderers/online_renderer.py`, `chat_completion/serving.py`).

The request: `tools` are vLLM's `ChatCompletionToolsParam`s, checked by vLLM's own
`check_tool_usage` (a `tool_choice` defaults to "auto" when tools come without one), and reach the
chat template as vLLM gives them, whatever the choice.

Without a parser (vLLM's default and pdserve's), a chat with `tool_choice` "none" is answered as
text; "auto" is refused unless the router runs with `--enable-auto-tool-choice` and
`--tool-call-parser`, "required" or a named function unless it runs with `--tool-call-parser`
(`ChatParsing.check_tool_choice`, vLLM's messages). With a tool or reasoning parser (vLLM's names:
`hermes`, `pythonic`, ...; `--reasoning-parser`), vLLM's own parser does the work, as in vLLM's
server: its `adjust_request` before the walk (the constraint that forces a call, special tokens
kept), its `parse` on a whole answer and `parse_delta` on each streamed chunk (`ChoiceParser`), with
vLLM's finish reason ("tool_calls" when an auto or required choice called a tool), its
`parallel_tool_calls` filter and, with a reasoning parser, the reasoning tokens in `usage`. The parser runs in the router, on the text the router made; the
workers only ever see the constraint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from pdserve.errors import InvalidRequest

ToolChoice = Literal["none", "auto", "required"] | dict[str, Any] | None
NAMED_PARAM = "tool_choice"


def check_tool_fields(data):
    """vLLM's checks of a raw chat body's `tools` and `tool_choice`, with its messages and `param`:
    each tool's shape (vLLM's `ChatCompletionToolsParam`), a named choice's shape, then vLLM's own
    `check_tool_usage` (no empty `tools`; a choice needs tools; a named choice must name one of
    them; "auto" when tools come without a choice). Returns the body with that default set."""
    if not isinstance(data, dict) or (data.get("tools") is None and data.get("tool_choice") in (None, "none")):
        return data   # every chat without tools: nothing to check
    from pydantic import TypeAdapter, ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedToolChoiceParam, ChatCompletionRequest, ChatCompletionToolsParam,
    )

    from router.openai_prompt import vllm_checked

    checks = [("tools", list[ChatCompletionToolsParam] | None, data.get("tools"))]
    if isinstance(data.get("tool_choice"), dict):
        checks.append((NAMED_PARAM, ChatCompletionNamedToolChoiceParam, data["tool_choice"]))
    for field, shape, value in checks:
        try:
            TypeAdapter(shape).validate_python(value)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in (field, *first["loc"]))
            raise InvalidRequest(f"{where}: {first['msg']}", field=field) from None
    return vllm_checked(lambda: ChatCompletionRequest.check_tool_usage(dict(data)))


def tool_dicts(tools: list[dict] | None) -> list[dict] | None:
    """The tools as vLLM gives them to the chat template: each `ChatCompletionToolsParam`'s dump."""
    if tools is None:
        return None
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam

    return [ChatCompletionToolsParam.model_validate(tool).model_dump() for tool in tools]


@dataclass(frozen=True)
class ChatParsing:
    """The router's parsers of a chat's answer (vLLM's server flags, vLLM's parser names)."""

    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enable_auto_tool_choice: bool = False

    def __post_init__(self) -> None:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")   # vLLM's rule

    @property
    def uses_parser(self) -> bool:
        return bool(self.tool_call_parser or self.reasoning_parser)

    def check_names(self) -> None:
        """ValueError naming a parser vLLM does not know, with the names it knows (a launcher
        checks this before it starts a router, which would otherwise die at start)."""
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager

        for flag, name, manager in (("--tool-call-parser", self.tool_call_parser, ToolParserManager),
                                    ("--reasoning-parser", self.reasoning_parser, ReasoningParserManager)):
            known = sorted(manager.list_registered())
            if name and name not in known:
                raise ValueError(f"{flag} {name}: not one of vLLM's parsers ({', '.join(known)})")

    def check_tool_choice(self, tool_choice: ToolChoice) -> None:
        """vLLM's refusal of a tool choice that needs a parser this router was not given
        (`OnlineRenderer.render_chat`), with its messages."""
        if self.tool_call_parser or tool_choice in (None, "none"):
            return
        if tool_choice == "auto":
            raise InvalidRequest('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                                 'to be set')
        described = (f'function "{tool_choice.get("function", {}).get("name")}"' if isinstance(tool_choice, dict)
                     else f'"{tool_choice}"')
        raise InvalidRequest(f"tool_choice={described} requires --tool-call-parser to be set")


class ChatParsers:
    """vLLM's parser class for a router's `ChatParsing` (`ParserManager.get_parser`, checked against
    the tokenizer at start, as vLLM checks it), and each chat's `RequestParsing`."""

    def __init__(self, parsing: ChatParsing, tokenizer) -> None:
        self.parsing, self.tokenizer = parsing, tokenizer
        self.cls = None
        if parsing.uses_parser:
            from vllm.parser import ParserManager

            self.cls = ParserManager.get_parser(tool_parser_name=parsing.tool_call_parser,
                                                reasoning_parser_name=parsing.reasoning_parser,
                                                enable_auto_tools=parsing.enable_auto_tool_choice,
                                                model_name=None, tokenizer=tokenizer)

    def for_request(self, body, template_kwargs: dict) -> "RequestParsing | None":
        """The parsing of one chat (`body`: pdserve's `ChatCompletionRequest`), None without a
        parser. vLLM's request is made from the body's fields as sent and adjusted as vLLM's
        renderer adjusts it (when a reasoning parser is set or the tool choice is not "none")."""
        self.parsing.check_tool_choice(body.tool_choice)
        if self.cls is None:
            return None
        sent = body.model_dump(exclude_unset=True, exclude={"slo_class"})
        from pydantic import ValidationError
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        from router.openai_prompt import vllm_checked

        try:
            request = vllm_checked(lambda: ChatCompletionRequest.model_validate(sent))
        except ValidationError as error:   # a shape pdserve's body let through and vLLM's refuses
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise InvalidRequest(f"{where}: {first['msg']}", field=where or None) from None
        kwargs = {k: v for k, v in template_kwargs.items() if k not in ("tools", "tokenize")}
        if (self.cls.always_adjust_request or self.cls.reasoning_parser_cls is not None
                or request.tool_choice != "none"):
            request = vllm_checked(lambda: self.cls(self.tokenizer, request.tools, model_config=None,
                                                    chat_template_kwargs=kwargs).adjust_request(request=request))
        return RequestParsing(self, request, kwargs)


@dataclass
class RequestParsing:
    """One chat's parsing: vLLM's (adjusted) request and a parser per choice."""

    parsers: ChatParsers
    request: Any                 # vLLM's ChatCompletionRequest, after `adjust_request`
    template_kwargs: dict

    def sampling_overrides(self) -> dict[str, Any]:
        """What the adjustment changed that the workers must see, as pdserve's body fields: the
        constraint (vLLM's `StructuredOutputsParams`, as `structured_outputs`) and
        `skip_special_tokens` (a parser that reads special tokens keeps them)."""
        overrides: dict[str, Any] = {"skip_special_tokens": self.request.skip_special_tokens}
        constraint = self.request.structured_outputs
        if constraint is not None:
            overrides |= {"response_format": None,
                          "structured_outputs": {f.name: getattr(constraint, f.name)
                                                 for f in dataclasses.fields(constraint)
                                                 if f.init and getattr(constraint, f.name) not in (None, False)}}
        return overrides

    def choice(self, prompt_token_ids: list[int]) -> "ChoiceParser":
        parser = self.parsers.cls(self.parsers.tokenizer, self.request.tools, model_config=None,
                                  chat_template_kwargs=self.template_kwargs)
        parser.set_prompt_token_ids(prompt_token_ids)
        return ChoiceParser(parser, self.request, self.parsers.parsing.enable_auto_tool_choice,
                            self.parsers.cls.tool_parser_cls is not None, prompt_token_ids,
                            counts_reasoning=bool(self.parsers.parsing.reasoning_parser))


@dataclass
class ChoiceParser:
    """vLLM's parser over one choice's answer: `whole` for a whole answer, `delta` for each streamed
    chunk (in order), each with vLLM's message fields and finish reason
    (`chat_completion_full_generator`, `chat_completion_stream_generator`)."""

    parser: Any
    request: Any
    enable_auto_tools: bool
    has_tool_parser: bool
    prompt_token_ids: list[int]
    counts_reasoning: bool = False   # with a reasoning parser, usage counts the answer's reasoning tokens
    tools_streamed: bool = False
    token_ids: list[int] = dataclasses.field(default_factory=list)   # the answer's, so far

    def reasoning_tokens(self) -> int:
        """vLLM's `usage.completion_tokens_details.reasoning_tokens` of the answer so far."""
        return self.parser.count_reasoning_tokens(tuple(self.token_ids))

    @property
    def hides_metadata(self) -> bool:
        """vLLM hides logprobs and token ids when the reasoning is not to be included."""
        return not self.request.include_reasoning

    @property
    def _named(self) -> bool:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionNamedToolChoiceParam

        return type(self.request.tool_choice) is ChatCompletionNamedToolChoiceParam

    def whole(self, text: str, token_ids: list[int], finish_reason: str | None) -> tuple[dict, str]:
        """(the message's fields besides its role, the finish reason) of a whole answer."""
        from vllm.entrypoints.generate.base.protocol import ToolCall
        from vllm.entrypoints.serve.utils.tool_calls_utils import maybe_filter_parallel_tool_calls
        from vllm.renderers.chat_utils import make_tool_call_id

        self.token_ids = list(token_ids)
        reasoning, content, calls = self.parser.parse(text, self.request, enable_auto_tools=self.enable_auto_tools,
                                                      model_output_token_ids=token_ids)
        if not self.request.include_reasoning:
            reasoning = None
        required = self.request.tool_choice == "required"
        auto_called = False
        message: dict[str, Any] = {"content": content}
        if self._named or required:
            message = {"content": content or "",
                       "tool_calls": [ToolCall(id=call.id or make_tool_call_id(), function=call) for call in calls or []]}
        elif (self.request.tools and self.request.tool_choice in ("auto", None) and self.enable_auto_tools
              and self.has_tool_parser and calls):
            auto_called = True
            message["tool_calls"] = [ToolCall(id=call.id, function=call) for call in calls]
        if "tool_calls" in message:
            message["tool_calls"] = [call.model_dump() for call in
                                     maybe_filter_parallel_tool_calls(message["tool_calls"], self.request)]
            if not message["tool_calls"]:
                del message["tool_calls"]   # vLLM's message drops an empty list
        message["reasoning"] = reasoning
        tool_finish = auto_called or (required and finish_reason == "stop")
        return message, "tool_calls" if tool_finish else (finish_reason or "stop")

    def delta(self, text: str, token_ids: list[int], finish_reason: str | None) -> tuple[dict | None, str | None]:
        """(the delta's fields, or None when vLLM sends no event for this chunk's text alone; the
        finish reason) of the next streamed chunk."""
        from vllm.entrypoints.serve.utils.tool_calls_utils import maybe_filter_parallel_tool_calls

        self.token_ids += token_ids
        delta = self.parser.parse_delta(delta_text=text, delta_token_ids=list(token_ids), request=self.request,
                                        prompt_token_ids=self.prompt_token_ids, finished=finish_reason is not None)
        if delta is not None and delta.tool_calls:
            self.tools_streamed = True
        if finish_reason is not None and self.tools_streamed and not self._named and finish_reason == "stop":
            finish_reason = "tool_calls"
        if delta is None:
            return None, finish_reason
        delta = maybe_filter_parallel_tool_calls(delta, self.request)
        return delta.model_dump(exclude_unset=True), finish_reason
