"""`pdserve load`: measure a serving endpoint (pdserve or any OpenAI-compatible server) under load,
and `pdserve load sweep`: find its goodput. Argument parsing only; the work is in `loadgen`."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

DESCRIPTION = """\
Send a workload to a serving endpoint and report latency (TTFT, TPOT, ITL, end-to-end),
throughput and SLO attainment with `vllm bench serve`'s definitions. Every request that errors
or times out is counted and listed. Writes a summary table, <output-dir>/<label>.json (vLLM's
result keys) and <output-dir>/<label>_latency_cdf.png.

Targets:
  --backend openai       http://HOST:PORT of any OpenAI-compatible server (vLLM, pdserve's router);
                         streaming /v1/completions, token-id prompts (--prompt-format text: text
                         prompts of the same token lengths, made with --tokenizer).
  --backend openai-chat  the same server's streaming /v1/chat/completions (text prompts: needs
                         --tokenizer, or --model naming a tokenizer).
  --backend pdserve      HOST:PORT of pdserve's gRPC API; adds the per-phase breakdown
                         (queued, prefill, KV transfer, decode) each response carries.
  (default: openai when --target starts with http, else pdserve)
OpenAI requests add vLLM's min_tokens and ignore_eos so outputs have exactly the requested length;
--no-vllm-extensions leaves them out for servers that reject unknown fields.

Workloads: random lengths (--input-len/--output-len/--range-ratio), the Azure conversation
trace (--workload trace), or K shared system prompts + unique suffixes (--workload shared-prefix).
Arrivals: Poisson at --request-rate, gamma (--arrival gamma --cv), constant, the trace's own
timestamps, or a fixed number of requests in flight (--concurrency N).
"""

EPILOG = """\
examples:
  pdserve load --target http://127.0.0.1:8000 --request-rate 2 --num-prompts 200 --ttft-slo-ms 500 --tpot-slo-ms 50
  pdserve load --target 127.0.0.1:50051 --workload trace --max-input-len 1536 --time-scale 0.5
  pdserve load --target http://127.0.0.1:8000 --concurrency 8 --duration 60
  pdserve load sweep --target http://127.0.0.1:8000 --workload trace --ttft-slo-ms 1000 --tpot-slo-ms 100

`pdserve load sweep --help` describes the goodput search.
"""

SWEEP_DESCRIPTION = """\
Find the goodput: the highest offered request rate at which >= --attainment-target (default 90%)
of requests meet every SLO given (DistServe's definition). One benchmark run per probed rate:
starting at --start-rate, the rate doubles while it passes (or halves while it fails) to bracket
the goodput, then bisects until the bracket is within --rel-tol. The workload keeps its lengths
and (for the trace) its burstiness; only the rate changes. Writes <label>_sweep.json,
<label>_attainment.png (attainment vs rate) and <label>_sweep_cdfs.png (latency CDF per probe).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "load", parents=[_common_options()], help="measure an endpoint under load; `load sweep` finds its goodput",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(func=run)
    nested = parser.add_subparsers(dest="load_command", metavar="{sweep}")
    # Options may come before or after `sweep`: the sweep parser's copies default to "not given"
    # so they never overwrite values parsed before the word `sweep` (argparse copies defaults).
    sweep_common = _common_options()
    for action in sweep_common._actions:
        action.default = argparse.SUPPRESS
    sweep = nested.add_parser("sweep", parents=[sweep_common], help="find the goodput by a search over request rates",
                              description=SWEEP_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    search = sweep.add_argument_group("search")
    search.add_argument("--start-rate", type=float, default=1.0, help="first rate probed, req/s (default 1)")
    search.add_argument("--min-rate", type=float, default=0.05, help="give up below this rate: goodput 0 (default 0.05)")
    search.add_argument("--max-rate", type=float, default=64.0, help="stop doubling at this rate (default 64)")
    search.add_argument("--attainment-target", type=float, default=0.9,
                        help="share of requests that must meet every SLO (default 0.9)")
    search.add_argument("--rel-tol", type=float, default=0.05, help="stop when the bracket is this narrow (default 0.05)")
    search.add_argument("--max-probes", type=int, default=10, help="at most this many runs (default 10)")
    sweep.set_defaults(func=run_sweep)


def _common_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("target")
    g.add_argument("--target", help="http://HOST:PORT (OpenAI-compatible) or HOST:PORT (pdserve gRPC); required")
    g.add_argument("--backend", choices=["openai", "openai-chat", "pdserve"],
                   help="protocol (vllm bench serve's names); default from --target's form")
    g.add_argument("--model", help="model name for OpenAI servers (default: the first of GET /v1/models)")
    g.add_argument("--prompt-format", choices=["token-ids", "text"],
                   help="OpenAI prompts as token ids (default for openai) or text (always for openai-chat)")
    g.add_argument("--tokenizer", help="Hugging Face tokenizer id or directory for text prompts (default: --model)")
    g.add_argument("--vllm-extensions", action=argparse.BooleanOptionalAction, default=True,
                   help="send vLLM's min_tokens and ignore_eos for exact output lengths (default: on)")
    g.add_argument("--api-key", default=os.environ.get("PDSERVE_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                   help="bearer token, for both backends (default $PDSERVE_API_KEY, else $OPENAI_API_KEY; prefer those "
                        "or --api-key-file: a command line is readable by every user of the host)")
    g.add_argument("--api-key-file", default=None, help="a file whose first key line is the bearer token (# comments "
                   "skipped; pdserve's --api-key-file format)")
    g.add_argument("--tls", action="store_true", help="pdserve gRPC over TLS, trusting the system's CAs "
                   "(an OpenAI --target says https:// instead)")
    g.add_argument("--tls-ca-file", default=None, help="PEM certificates to trust (a self-signed router's): "
                   "gRPC over TLS, or https:// verified against them")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    g = p.add_argument_group("workload")
    g.add_argument("--workload", choices=["random", "trace", "shared-prefix"], default="random",
                   help="random lengths, Azure trace replay, or shared system prompts (default random)")
    g.add_argument("--num-prompts", type=int, default=100, help="requests to send (default 100)")
    g.add_argument("--input-len", type=int, default=512, help="mean prompt tokens (random; suffix for shared-prefix)")
    g.add_argument("--output-len", type=int, default=128,
                   help="mean output tokens (generated exactly with vLLM's ignore_eos; see --no-vllm-extensions)")
    g.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in [mean*(1-r), mean*(1+r)], as vllm bench's random dataset (default 0)")
    g.add_argument("--trace", type=Path, help="trace CSV (default <repo>/../shared/data/traces/AzureLLMInferenceTrace_conv.csv)")
    g.add_argument("--time-scale", type=float, default=1.0, help="multiply trace gaps by this (0.5 = twice as fast)")
    g.add_argument("--max-input-len", type=int, help="clip trace prompt lengths to this (the model's context)")
    g.add_argument("--max-output-len", type=int, help="clip trace output lengths to this")
    g.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: number of system prompts K (default 4)")
    g.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: system prompt tokens L (default 256)")
    g.add_argument("--token-id-range",
                   help="prompt token ids are drawn from LOW:HIGH (default 10:250, valid for any byte-level vocab; "
                        "text prompts: the tokenizer's whole vocabulary, less special and partial-character tokens)")
    g.add_argument("--seed", type=int, default=0, help="seed for arrivals, lengths and prompts (default 0)")
    g = p.add_argument_group("arrivals and run mode")
    g.add_argument("--arrival", choices=["poisson", "gamma", "constant", "trace"],
                   help="arrival process (default poisson; trace timestamps for --workload trace)")
    g.add_argument("--request-rate", type=float, help="offered rate, req/s (trace: rescales its timestamps)")
    g.add_argument("--cv", type=float, default=1.0,
                   help="gamma: coefficient of variation of gaps, >1 bursty (vllm --burstiness b = cv 1/sqrt(b))")
    g.add_argument("--concurrency", type=int, help="closed loop: keep exactly N requests in flight, ignore arrivals")
    g.add_argument("--max-concurrency", type=int, help="open loop with a cap on requests in flight")
    g.add_argument("--duration", type=float, help="stop sending after this many seconds")
    g.add_argument("--warmup", type=int, default=2, help="uncounted warm-up requests first (default 2)")
    g.add_argument("--request-timeout", type=float, default=300.0, help="a request taking longer fails (default 300 s)")
    g = p.add_argument_group("SLOs (a request is good when it meets all given)")
    g.add_argument("--ttft-slo-ms", type=float, help="time to first token")
    g.add_argument("--tpot-slo-ms", type=float, help="time per output token after the first")
    g.add_argument("--e2el-slo-ms", type=float, help="end-to-end latency")
    g = p.add_argument_group("output")
    g.add_argument("--output-dir", type=Path, default=Path("out/load"), help="where JSON and PNGs go (default out/load)")
    g.add_argument("--label", help="file name stem and plot label (default: the backend)")
    g.add_argument("--no-progress", action="store_true", help="no live progress bar")
    return p


def run(args: argparse.Namespace) -> int:
    from loadgen.jobs import load_job

    return load_job(**_job_inputs(args))


def run_sweep(args: argparse.Namespace) -> int:
    from loadgen.jobs import sweep_job
    from loadgen.sweep import SearchConfig

    inputs = _job_inputs(args)
    try:
        search = SearchConfig(start_rps=args.start_rate, min_rps=args.min_rate, max_rps=args.max_rate,
                              target=args.attainment_target, rel_tol=args.rel_tol, max_probes=args.max_probes)
    except ValueError as bad:
        raise SystemExit(f"pdserve load sweep: {bad}") from bad
    return sweep_job(**inputs, search=search)


def _job_inputs(args: argparse.Namespace) -> dict:
    """Arguments -> the validated configs `loadgen.jobs` takes; a bad value exits with its reason."""
    from loadgen.harness import WorkloadConfig, make_target, requests_for_duration
    from loadgen.jobs import OutputConfig
    from loadgen.metrics import SLO
    from loadgen.runner import RunConfig

    if not args.target:
        raise SystemExit("pdserve load: --target is required (http://HOST:PORT, or HOST:PORT for pdserve gRPC)")
    backend = args.backend or ("openai" if args.target.startswith(("http://", "https://")) else "pdserve")
    protocol = "pdserve" if backend == "pdserve" else "openai"
    concurrency_mode = args.concurrency is not None
    arrival = args.arrival or ("trace" if args.workload == "trace" else "constant" if concurrency_mode else "poisson")
    rate = args.request_rate
    if rate is None and arrival != "trace":
        rate = math.inf if concurrency_mode else 1.0
    num_prompts = args.num_prompts
    if args.duration is not None and not concurrency_mode and rate is not None and math.isfinite(rate):
        num_prompts = max(num_prompts, requests_for_duration(rate, args.duration))
    try:
        workload = WorkloadConfig(
            kind=args.workload, arrival=arrival, rate_rps=rate, cv=args.cv, num_requests=num_prompts,
            prompt_mean=args.input_len, output_mean=args.output_len, range_ratio=args.range_ratio,
            trace_path=args.trace, time_scale=args.time_scale, max_prompt_tokens=args.max_input_len,
            max_output_tokens=args.max_output_len, num_groups=args.num_prefixes, prefix_tokens=args.prefix_len,
            seed=args.seed)
        run_config = RunConfig(
            mode="concurrency" if concurrency_mode else "arrivals",
            max_concurrency=args.concurrency if concurrency_mode else args.max_concurrency,
            duration_s=args.duration, warmup_requests=args.warmup, request_timeout_s=args.request_timeout)
        slo = SLO(*(None if ms is None else ms / 1000 for ms in (args.ttft_slo_ms, args.tpot_slo_ms, args.e2el_slo_ms)))
        shape = _request_shape(args, backend)
        prompts = _prompts(args, shape)
        api_key = _api_key(args)
        connection = {"tls": args.tls, "ca_file": args.tls_ca_file}
        make_target(protocol, args.target, args.model, args.temperature, api_key, shape, **connection)  # validates
    except (ValueError, OSError) as bad:
        raise SystemExit(f"pdserve load: {bad}") from bad
    return {
        "make": lambda: make_target(protocol, args.target, args.model, args.temperature, api_key, shape, **connection),
        "workload": workload, "run_config": run_config, "slo": slo, "prompts": prompts,
        "output": OutputConfig(args.output_dir, args.label or backend, show_progress=not args.no_progress),
    }


def _api_key(args: argparse.Namespace) -> str | None:
    """--api-key-file's first key, else --api-key (or its environment default)."""
    if not args.api_key_file:
        return args.api_key
    from router.public_access import parse_api_keys

    with open(args.api_key_file, encoding="utf-8") as file:
        keys = parse_api_keys(file.read(), args.api_key_file)
    if not keys:
        raise ValueError(f"--api-key-file {args.api_key_file} holds no key")
    return keys[0]


def _request_shape(args: argparse.Namespace, backend: str):
    """The OpenAI `RequestShape` from --backend, --prompt-format and --vllm-extensions."""
    from loadgen.targets.openai_http import RequestShape

    if backend == "pdserve":
        if args.prompt_format == "text":
            raise ValueError("--prompt-format text applies to the OpenAI backends; pdserve's gRPC API takes token ids")
        return RequestShape()
    chat = backend == "openai-chat"
    prompt_format = args.prompt_format or ("text" if chat else "token-ids")
    return RequestShape(endpoint="chat" if chat else "completions", prompt_format=prompt_format,
                      vllm_extensions=args.vllm_extensions)


def _prompts(args: argparse.Namespace, shape):
    """The `PromptSynthesizer`: token ids from --token-id-range (default 10:250); for text prompts
    also the tokenizer, and ids from the whole vocabulary unless a range is given."""
    from loadgen.prompts import PromptSynthesizer
    from loadgen.text_prompts import load_tokenizer

    text = shape.prompt_format == "text"
    tokenizer_id = args.tokenizer or args.model if text else None
    if text and tokenizer_id is None:
        raise ValueError("text prompts are made to exact token lengths with the model's tokenizer: "
                         "pass --tokenizer (a Hugging Face id or a local model directory) or --model")
    tokenizer = load_tokenizer(tokenizer_id) if text else None
    default_range = f"0:{tokenizer.vocab_size}" if text else "10:250"
    low, _, high = (args.token_id_range or default_range).partition(":")
    if not (low.isdigit() and high.isdigit()):
        raise ValueError(f"--token-id-range must be LOW:HIGH integers, got {args.token_id_range!r}")
    return PromptSynthesizer(seed=args.seed, token_id_low=int(low), token_id_high=int(high),
                             tokenizer=tokenizer, tokenizer_id=tokenizer_id)
