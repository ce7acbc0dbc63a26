"""`--otlp-traces-endpoint`, shared by `pdserve router` and `pdserve worker` (pdserve.tracing)."""

from __future__ import annotations

import argparse
import os

ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"   # OpenTelemetry's standard variable


def add_tracing_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--otlp-traces-endpoint", default=os.environ.get(ENV, ""), metavar="URL",
                        help="export OpenTelemetry spans of each request's walk to this OTLP/HTTP URL, e.g. "
                             f"http://collector:4318/v1/traces (default: env {ENV}; unset: no tracing)")


def start_tracing(args: argparse.Namespace, command: str, service_name: str, instance_id: str = "") -> None:
    """Turns tracing on when an endpoint is given; a malformed one stops the command with why."""
    from pdserve.tracing import TracingConfig, configure

    try:
        configure(TracingConfig(args.otlp_traces_endpoint, service_name, instance_id))
    except ValueError as bad:
        raise SystemExit(f"pdserve {command}: {bad}") from None
