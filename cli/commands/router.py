"""`pdserve router`: the cluster's front door."""

from __future__ import annotations

import argparse
import asyncio
import logging

HELP = """\
Runs the router: the public gRPC API (pdserve.v1.Generation, grpc.health.v1) and an OpenAI-compatible
HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics). It finds workers in
the Redis registry and places each request from live state: it predicts the time to first token on
every path (a prefill worker then a KV transfer to a decode worker, or, in hybrid and aggregated
clusters, the decode worker computing the prompt itself), and takes the path that meets the SLOs
with the most headroom. Requests wait in the router's queue (interactive before batch, shorter
prompts first, with aging) while the workers are busy; with --slo-ttft-ms set, a request predicted
to miss it by more than the policy's slack is refused at once (429 / RESOURCE_EXHAUSTED with a
retry time).

Beyond 127.0.0.1 (--host 0.0.0.0 in containers) it serves only with TLS (--tls-cert-file,
--tls-key-file; mTLS with --tls-client-ca-file) and API keys (--api-key-file), or with --insecure
when a gateway or mesh in front of it does that work. /health, /metrics and grpc.health.v1 stay
open for probes; everything else needs the key (SECURITY.md).
"""


from cli.commands.chat_parsing_options import add_chat_parsing_options, chat_parsing
from cli.commands.credential_options import add_cluster_secret_option, add_redis_password_option, redis_connection_url
from cli.commands.placement_options import add_placement_options, scheduler_config
from cli.commands.public_api_options import add_public_api_options, public_api_config
from cli.commands.tracing_options import add_tracing_option, start_tracing
from pdserve.cpu_placement import bind_this_process


def register(subparsers) -> None:
    parser = subparsers.add_parser("router", help="run the router (gRPC + OpenAI-compatible HTTP)",
                                   description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the model directory (its tokenizer is used here)")
    parser.add_argument("--redis-url", required=True, help="the cluster's registry, e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--cluster", default="default", help="cluster name: the registry key prefix")
    add_cluster_secret_option(parser, "the router proves on every call to a worker")
    add_redis_password_option(parser)
    parser.add_argument("--grpc-port", type=int, default=50051, help="gRPC port (0: any free port)")
    parser.add_argument("--http-port", type=int, default=8000, help="HTTP port (0: any free port)")
    parser.add_argument("--max-model-len", type=int, default=2048, help="must match the workers' --max-model-len")
    parser.add_argument("--max-inflight", type=int, default=256, help="admission limit; beyond it: 429/RESOURCE_EXHAUSTED")
    parser.add_argument("--enable-prompt-tokens-details", action="store_true",
                        help="OpenAI API: usage.prompt_tokens_details.cached_tokens in answers (vLLM's flag; off as in vLLM)")
    add_placement_options(parser)
    add_chat_parsing_options(parser)
    parser.add_argument("--drain-timeout-s", type=float, default=30.0,
                        help="on SIGTERM, how long streams in flight may run before they are cancelled")
    parser.add_argument("--ready-file", default=None, help="write the addresses here once serving")
    parser.add_argument("--cpu-cores", default="",
                        help="CPU hosts: bind the router to these cores, e.g. 0 or 0-1 (default '': any core). On a "
                             "small host keep it off the decode workers' cores: every token it relays there "
                             "lengthens their steps (`pdserve up` puts it on the prefill workers' cores)")
    add_tracing_option(parser)
    add_public_api_options(parser, host_help="address to listen on (0.0.0.0 in containers: needs TLS and API keys, "
                                             "or --insecure)")
    parser.set_defaults(func=run, skips_teardown=True)


def run(args: argparse.Namespace) -> int:
    from router.lifecycle import RouterConfig
    from router.main import RouterProcessConfig, run_router

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        bind_this_process(args.cpu_cores)  # before gRPC and asyncio start their threads
        scheduler = scheduler_config(args)
    except (ValueError, OSError) as bad:
        raise SystemExit(f"pdserve router: {bad}") from None
    router = RouterConfig(max_model_len=args.max_model_len, max_inflight=args.max_inflight, scheduler=scheduler,
                          enable_prompt_tokens_details=args.enable_prompt_tokens_details)
    public = public_api_config(args, "router")
    try:
        config = RouterProcessConfig(model=args.model, redis_url=redis_connection_url(args, "router"),
                                     cluster=args.cluster, host=args.host, grpc_port=args.grpc_port,
                                     http_port=args.http_port, router=router, drain_timeout_s=args.drain_timeout_s,
                                     cluster_secret_file=args.cluster_secret_file, public=public,
                                     chat_parsing=chat_parsing(args, "router", check_names=False))
    except ValueError as bad:
        raise SystemExit(f"pdserve router: {bad}") from None
    from kv_transfer.auth import SecretFileError

    start_tracing(args, "router", "pdserve-router")
    try:
        asyncio.run(run_router(config, ready_file=args.ready_file))
    except SecretFileError as bad:
        raise SystemExit(f"pdserve router: {bad}") from None
    return 0

