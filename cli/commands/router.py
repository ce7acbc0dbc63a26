"""`pdserve router`: the cluster's front door."""

from __future__ import annotations

import argparse
import asyncio
import logging

HELP = """\
Runs the router: the public gRPC API (pdserve.v1.Generation, grpc.health.v1) and an OpenAI-compatible
HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics). It finds workers in
the Redis registry, sends each prompt to the least-loaded prefill worker, streams the first token at
once, and has the least-loaded decode worker pull the KV and stream the rest.
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser("router", help="run the router (gRPC + OpenAI-compatible HTTP)",
                                   description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the model directory (its tokenizer is used here)")
    parser.add_argument("--redis-url", required=True, help="the cluster's registry, e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--cluster", default="default", help="cluster name: the registry key prefix")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in containers)")
    parser.add_argument("--grpc-port", type=int, default=50051, help="gRPC port (0: any free port)")
    parser.add_argument("--http-port", type=int, default=8000, help="HTTP port (0: any free port)")
    parser.add_argument("--max-model-len", type=int, default=2048, help="must match the workers' --max-model-len")
    parser.add_argument("--max-inflight", type=int, default=256, help="admission limit; beyond it: 429/RESOURCE_EXHAUSTED")
    parser.add_argument("--local-prefill-max-tokens", type=int, default=0,
                        help="prompts this short skip the prefill pool and run on a decode worker alone (0: never)")
    parser.add_argument("--drain-timeout-s", type=float, default=30.0,
                        help="on SIGTERM, how long streams in flight may run before they are cancelled")
    parser.add_argument("--ready-file", default=None, help="write the addresses here once serving")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from router.lifecycle import RouterConfig
    from router.main import RouterProcessConfig, run_router
    from router.policies.disaggregation import DisaggregationPolicy

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    router = RouterConfig(max_model_len=args.max_model_len, max_inflight=args.max_inflight,
                          policy=DisaggregationPolicy(args.local_prefill_max_tokens))
    config = RouterProcessConfig(model=args.model, redis_url=args.redis_url, cluster=args.cluster, host=args.host,
                                 grpc_port=args.grpc_port, http_port=args.http_port, router=router,
                                 drain_timeout_s=args.drain_timeout_s)
    asyncio.run(run_router(config, ready_file=args.ready_file))
    return 0
