"""A stopped server process ends without the interpreter's teardown, having flushed what it owes:
its trace spans, its log handlers and its stdio (pdserve/process_exit.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from argparse import Namespace

from cli.main import build_parser, ends_process

SCRIPT = textwrap.dedent("""
    import atexit, logging, sys
    from pathlib import Path
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from pdserve import tracing
    from pdserve.process_exit import exit_without_teardown

    folder = Path(sys.argv[1])

    class ToFile(SpanExporter):
        def export(self, spans):
            with open(folder / "spans", "a") as out:
                out.writelines(span.name + "\\n" for span in spans)
            return SpanExportResult.SUCCESS

    logging.basicConfig(filename=folder / "log", level=logging.INFO)
    logging.getLogger("worker").info("drained in 0.0 s")
    atexit.register(lambda: (folder / "teardown").write_text("ran"))
    tracing.start(BatchSpanProcessor(ToFile(), schedule_delay_millis=60_000), "pdserve-test")
    tracing.request_trace("r-1", 5).end("served", 200)   # buffered: the batch goes out in a minute
    sys.stdout.write("still buffered")                     # a pipe: block-buffered, no newline
    exit_without_teardown(7)
""")


def test_the_process_ends_with_its_code_after_flushing_spans_logs_and_stdout_and_runs_no_atexit(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}   # stdout buffered, as a server's
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 7, done.stderr
    assert done.stdout == "still buffered"
    assert "drained in 0.0 s" in (tmp_path / "log").read_text()
    assert (tmp_path / "spans").read_text().split() == ["request"]
    assert not (tmp_path / "teardown").exists()   # the teardown was skipped: what the exit is for


def test_the_commands_that_stop_vllm_end_their_process_and_a_caller_of_main_keeps_its_interpreter():
    commands = next(action for action in build_parser()._actions if action.dest == "command").choices
    asking = {name for name, parser in commands.items() if parser.get_default("skips_teardown")}
    assert asking == {"worker", "router", "profile"}
    for name, parser in commands.items():
        defaults = {"skips_teardown": parser.get_default("skips_teardown")} if name in asking else {}
        assert ends_process(Namespace(from_command_line=True, **defaults)) == (name in asking), name
        # cli.main.main(argv) called by another program
        assert not ends_process(Namespace(from_command_line=False, **defaults)), name
