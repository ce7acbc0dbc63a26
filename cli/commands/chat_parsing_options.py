"""`--tool-call-parser`, `--enable-auto-tool-choice`, `--reasoning-parser`: vLLM's server flags, taken
by `pdserve router` and by the launchers that start one (`pdserve up`, `pdserve up --ray`)."""

from __future__ import annotations

import argparse


def add_chat_parsing_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tool calls and reasoning (OpenAI chat API; vLLM's flags and parser names)")
    group.add_argument("--tool-call-parser", default=None, metavar="NAME",
                       help="parse tool calls out of a chat's answer with vLLM's parser NAME (e.g. hermes, "
                            "pythonic, llama3_json: the one the model was trained for); needed for tool_choice "
                            "\"required\" or a named function")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="let the model decide when to call a tool (tool_choice \"auto\", the default when "
                            "`tools` are sent); needs --tool-call-parser")
    group.add_argument("--reasoning-parser", default=None, metavar="NAME",
                       help="split a chat's answer into `reasoning` and `content` with vLLM's parser NAME "
                            "(e.g. qwen3, deepseek_r1)")


def chat_parsing(args: argparse.Namespace, command: str, check_names: bool = True):
    """The `ChatParsing` these flags ask for; a bad combination (or, with `check_names`, a parser
    vLLM does not know: that imports vLLM, which the router process does only after binding its
    port, where vLLM's own refusal stops it) stops `command` with the reason."""
    from router.openai_tools import ChatParsing

    try:
        parsing = ChatParsing(tool_call_parser=args.tool_call_parser, reasoning_parser=args.reasoning_parser,
                              enable_auto_tool_choice=args.enable_auto_tool_choice)
        if check_names and parsing.uses_parser:
            parsing.check_names()
        return parsing
    except ValueError as bad:
        raise SystemExit(f"pdserve {command}: {bad}") from None


def chat_parsing_argv(args: argparse.Namespace) -> list[str]:
    """The flags given to a launcher, as its router takes them (checked first)."""
    chat_parsing(args, "up")
    argv = ["--enable-auto-tool-choice"] if args.enable_auto_tool_choice else []
    for name in ("tool_call_parser", "reasoning_parser"):
        if getattr(args, name) is not None:
            argv += [f"--{name.replace('_', '-')}", getattr(args, name)]
    return argv
