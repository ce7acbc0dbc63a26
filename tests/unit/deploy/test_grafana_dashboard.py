"""deploy/grafana/pdserve-dashboard.json cannot drift from the code: every metric name in every
PromQL query is one pdserve defines (pdserve.metrics, as its Prometheus registry exposes it) or one
vLLM's Prometheus stat logger defines (its source in this environment). The worker names are also
checked against a real scrape in tests/integration/test_metrics_scrape.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from pdserve import metrics

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "pdserve-dashboard.json"
# PromQL words and label names the queries use; anything else in a query is a metric name
PROMQL_WORDS = {"sum", "max", "by", "rate", "histogram_quantile", "le", "phase", "api", "outcome", "code", "role",
                "quantity", "worker", "instance"}
SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", ())]


def metric_names(expr: str) -> set[str]:
    """The metric names in one PromQL query: its identifiers less strings, range durations,
    Grafana variables, numbers and the PromQL words above."""
    bare = re.sub(r'"[^"]*"|\[[^\]]*\]|\$\w+', " ", expr)
    return {token for token in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)} - PROMQL_WORDS


def pdserve_sample_names() -> set[str]:
    """Every `pdserve_*` series `pdserve.metrics` registers (importing it registers them), with its samples' suffixes."""
    assert metrics.REGISTRY is REGISTRY
    return {family.name + suffix for family in REGISTRY.collect() if family.name.startswith("pdserve_")
            for suffix in SAMPLE_SUFFIXES.get(family.type, ("",))}


def vllm_sample_names() -> set[str]:
    """Every `vllm:*` series vLLM's Prometheus stat logger (vllm/v1/metrics/) defines, with its samples' suffixes."""
    import vllm

    source = "\n".join(p.read_text() for p in (Path(vllm.__file__).parent / "v1" / "metrics").glob("*.py"))
    defined = re.findall(r'_(gauge|counter|histogram)_cls\(\s*name="(vllm:[a-z_:]+)"', source)
    return {name + suffix for kind, name in defined for suffix in SAMPLE_SUFFIXES[kind]}


def test_the_dashboard_is_grafana_10_with_a_prometheus_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 38   # Grafana 10.0
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    queried = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert queried and all(p["datasource"]["uid"] == "${datasource}" for p in queried)
    assert all(t["datasource"]["uid"] == "${datasource}" for p in queried for t in p["targets"])


def test_every_metric_the_dashboard_queries_is_one_pdserve_or_vllm_defines():
    known = pdserve_sample_names() | vllm_sample_names()
    used = {name for expr in dashboard_queries() for name in metric_names(expr)}
    assert used and used - known == set()


def test_the_dashboard_covers_what_an_operator_watches():
    used = {name for expr in dashboard_queries() for name in metric_names(expr)}
    assert {"pdserve_requests_total", "pdserve_ttft_seconds_bucket", "pdserve_tpot_seconds_bucket",
            "pdserve_itl_seconds_bucket", "pdserve_e2e_seconds_bucket", "pdserve_router_queue_seconds_bucket",
            "pdserve_request_phase_seconds_bucket", "pdserve_kv_transfer_bytes_total", "pdserve_kv_load_failures_total",
            "pdserve_router_worker_running", "pdserve_router_worker_kv_usage_ratio", "vllm:num_requests_running",
            "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total"} <= used


@pytest.mark.parametrize("expr, names", [
    ('sum by (le) (rate(pdserve_ttft_seconds_bucket{api="http"}[$__rate_interval]))', {"pdserve_ttft_seconds_bucket"}),
    ("max by (instance) (vllm:kv_cache_usage_perc)", {"vllm:kv_cache_usage_perc"}),
    ("histogram_quantile(0.99, sum by (le, phase) (rate(made_up_seconds_bucket[5m])))", {"made_up_seconds_bucket"}),
])
def test_metric_names_are_read_from_promql(expr, names):
    assert metric_names(expr) == names


def test_a_name_nobody_defines_is_caught():
    assert "pdserve_ttft_bucket" not in pdserve_sample_names() | vllm_sample_names()
    assert "vllm:num_requests_running_total" not in vllm_sample_names()
