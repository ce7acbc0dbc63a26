"""`pdserve make-model`: write the tiny or bench checkpoint to a folder (see pdserve.make_model)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

HELP = """\
Write a small Llama checkpoint (Hugging Face format) that vLLM and `pdserve up` can serve:
config.json, model.safetensors (random bfloat16 weights from --seed) and a byte-level BPE
tokenizer trained on the English text shipped with pdserve. Nothing is downloaded.

  tiny   4 layers, hidden 256, 2048-token vocab, 2k context: ~3.4M params, builds in ~2 s (tests)
  bench  12 layers, hidden 768, 8192-token vocab, 16k context: ~88M params, builds in ~8 s (benchmarks)

The same --size and --seed always give byte-identical files. Running it again on a folder that
already holds that build returns at once (pdserve_model.json records what was built).
The model is random: its text is gibberish, but its speed and memory are those of a real model.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "make-model", help="write a small Hugging Face checkpoint (tiny or bench) to a folder",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", choices=["tiny", "bench"], default="tiny",
                        help="which model to build (default: tiny)")
    parser.add_argument("--out", type=Path, required=True,
                        help="folder to write; created if missing, must be empty or hold an earlier build")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights (default: 0)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from pdserve.make_model import MODEL_FILES, build_model, is_up_to_date, spec_for

    console = Console()

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    spec = spec_for(args.size)
    if is_up_to_date(args.size, args.out, seed=args.seed):
        say(f"{args.out} already holds the {args.size} model (seed {args.seed}); nothing to do")
        return 0
    start_s = time.perf_counter()
    try:
        with DelayedProgress(console) as progress:
            build_model(args.size, args.out, seed=args.seed, progress=progress)
    except ValueError as error:
        print(f"pdserve make-model: {error}", file=sys.stderr)
        return 2
    build_s = time.perf_counter() - start_s
    table = Table(title=f"{args.size} model in {args.out}", title_justify="left")
    table.add_column("file")
    table.add_column("bytes", justify="right")
    for name in MODEL_FILES:
        table.add_row(name, f"{(args.out / name).stat().st_size:,}")
    console.print(table)
    say(f"{spec.num_params / 1e6:.1f}M parameters, {spec.num_layers} layers, "
        f"vocab {spec.vocab_size}, built in {build_s:.1f} s")
    return 0


class DelayedProgress:
    """A rich progress bar that appears only if the build is still running after `delay_s`.

    Implements pdserve.make_model.BuildProgress; safe to update before it has appeared.
    """

    def __init__(self, console, delay_s: float = 2.0) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=console)
        self._timer = threading.Timer(delay_s, self._progress.start)
        self._timer.daemon = True

    def __enter__(self) -> DelayedProgress:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        self._timer.join()
        self._progress.stop()

    def add_task(self, description: str, total: int) -> object:
        return self._progress.add_task(description, total=total)

    def advance(self, task: object, steps: int = 1) -> None:
        self._progress.advance(task, steps)
