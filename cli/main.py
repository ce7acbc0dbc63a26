"""The `pdserve` command line: one subcommand per job, each defined in its own module.

A subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func=<callable(args) -> int>` as the parser default. Modules are imported lazily by name so
`pdserve --help` stays fast and a subcommand's heavy imports (vLLM, torch) load only when used.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pdserve.process_exit import exit_without_teardown

# (subcommand module, one-line summary shown before the module is imported)
SUBCOMMANDS: dict[str, str] = {
    "cli.commands.make_model": "write a small Hugging Face checkpoint (tiny or bench) to a folder",
    "cli.commands.up": "start a local cluster: redis, router, prefill and decode workers",
    "cli.commands.worker": "run one prefill or decode worker (used by `up`, Ray and Kubernetes)",
    "cli.commands.router": "run the router (gRPC + OpenAI-compatible HTTP)",
    "cli.commands.demo": "send a few prompts through a running cluster and print timings",
    "cli.commands.load": "measure an endpoint under load (latency, throughput, SLO attainment) or sweep for goodput",
    "cli.commands.plan": "choose prefill/decode pool sizes for a workload and SLOs by simulation",
    "cli.commands.profile": "measure prefill, decode and KV transfer times on this host into a profile",
    "cli.commands.planner": "the online SLA planner: resize the pools from live load every interval",
}

DESCRIPTION = """\
pdserve serves an LLM with prefill and decode on separate vLLM workers: a router sends each
prompt to a prefill worker, the KV cache travels to a decode worker, which streams the tokens.

Start here:
  pdserve make-model --size tiny --out models/tiny   # a small model to serve
  pdserve up --model models/tiny                     # a local cluster, until Ctrl-C
  pdserve demo --target 127.0.0.1:50051              # a few prompts through it
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdserve", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as missing:
            if missing.name and module_name.startswith(missing.name):
                continue  # a subcommand not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.from_command_line = argv is None   # this process is the command (`pdserve worker` may re-execute it)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    code = int(args.func(args) or 0)
    if ends_process(args):
        exit_without_teardown(code)   # stopped in order: vLLM's modules' teardown (~2-5 s of CPU) is not waited for
    return code


def ends_process(args: argparse.Namespace) -> bool:
    """Whether a command that returned ends its process without the interpreter's teardown: it asks
    for it (`skips_teardown`: the commands that imported vLLM and stopped it in order) and this
    process is the command itself, not a program calling `main(argv)` (`pdserve.process_exit`)."""
    return bool(args.from_command_line and getattr(args, "skips_teardown", False))


if __name__ == "__main__":
    sys.exit(main())
