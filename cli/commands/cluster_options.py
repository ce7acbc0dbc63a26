"""The options that describe a local cluster (pools, transport, ports, cores, engine), shared by
`pdserve up`, `pdserve up --ray` and `pdserve demo`, and the `ClusterSpec` they build."""

from __future__ import annotations

import argparse
import os

from cli.commands.engine_options import add_engine_options, engine_settings
from cli.commands.chat_parsing_options import add_chat_parsing_options, chat_parsing_argv
from cli.commands.placement_options import add_placement_options, router_flags


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill", type=int, default=None, help="prefill workers (default: 1; 0 when aggregated)")
    parser.add_argument("--decode", type=int, default=1, help="decode workers (default: %(default)s)")
    parser.add_argument("--transport", choices=["tcp", "torch", "shm", "auto"], default="auto",
                        help="KV transport: tcp, torch (gloo/nccl), shm (one-sided, same host) or auto (shm on one "
                             "host, else tcp) (default: %(default)s)")
    parser.add_argument("--kv-encryption", choices=["off", "auto", "on"], default="auto",
                        help="encrypt KV bytes between workers (AES-256-GCM, keys from the cluster secret): auto, on links between hosts; on, always (a worker set to off is refused); off, never (default: %(default)s)")
    parser.add_argument("--grpc-port", type=int, default=50051, help="router gRPC port (0: any free port)")
    parser.add_argument("--http-port", type=int, default=8000, help="router HTTP port (0: any free port)")
    parser.add_argument("--prefill-cores", default=None, help="CPU cores for prefill engines (default: first half)")
    parser.add_argument("--decode-cores", default=None, help="CPU cores for decode engines (default: second half)")
    parser.add_argument("--router-cores", default=None,
                        help="CPU cores for the router ('' = any core; default: the prefill workers' cores when "
                             "they are apart from the decode workers', else any). Every token the router relays "
                             "costs CPU, which on a decode core lengthens the decode steps")
    parser.add_argument("--log-dir", default="", help="where process logs go (default: a temporary folder)")
    add_placement_options(parser)
    add_chat_parsing_options(parser)
    add_engine_options(parser)


def split_cores(num_cores: int, topology: str = "disaggregated") -> dict[str, str]:
    """Prefill gets the first half of the cores, decode the rest; aggregated: decode gets them all;
    one core: no binding."""
    if num_cores < 2:
        return {}
    if topology == "aggregated":
        return {"decode": f"0-{num_cores - 1}"}
    half = num_cores // 2
    as_range = lambda lo, hi: str(lo) if lo == hi else f"{lo}-{hi}"  # noqa: E731
    return {"prefill": as_range(0, half - 1), "decode": as_range(half, num_cores - 1)}


def cluster_spec(args: argparse.Namespace):
    from launch.local import ClusterSpec

    num_prefill = args.prefill if args.prefill is not None else 0 if args.topology == "aggregated" else 1
    cores = split_cores(os.cpu_count() or 1, args.topology)
    if args.prefill_cores is not None:
        cores["prefill"] = args.prefill_cores
    if args.decode_cores is not None:
        cores["decode"] = args.decode_cores
    probe_cores = cores.get("prefill") or cores.get("decode") or ""  # one worker's share of the cores
    return ClusterSpec(engine=engine_settings(args, probe_cores=probe_cores), num_prefill=num_prefill, num_decode=args.decode,
                       transport=args.transport, kv_encryption=args.kv_encryption, grpc_port=args.grpc_port, http_port=args.http_port,
                       cpu_cores=cores, local_prefill_max_tokens=args.local_prefill_max_tokens, log_dir=args.log_dir,
                       topology=args.topology, router_flags=(*router_flags(args), *chat_parsing_argv(args)),
                       router_cores=args.router_cores)
