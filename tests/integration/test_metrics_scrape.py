"""Every metrics endpoint of a real cluster, scraped before and after real traffic: the router counts
each request once by outcome and status code with its latencies, and each worker serves vLLM's own
`vllm:*` series beside pdserve's gauges (on by default in a LocalCluster, as in `pdserve up`)."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdserve.client import Client

pytestmark = pytest.mark.integration

MAX_TOKENS = 6
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "pdserve-dashboard.json"
DASHBOARD_VLLM_SERIES = sorted(set(re.findall(r"vllm:[a-z_:]+", DASHBOARD.read_text())))


def scrape(url: str) -> dict[str, dict[frozenset, float]]:
    """Sample name -> {frozenset of label pairs -> value}, from one GET of a Prometheus endpoint."""
    text = httpx.get(url, timeout=10).raise_for_status().text
    samples: dict[str, dict[frozenset, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name][frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get(name, {}).get(frozenset(labels.items()), 0.0)


def total(samples, name: str) -> float:
    return sum(samples.get(name, {}).values())


def test_router_and_workers_count_real_traffic_by_outcome_code_and_phase(tcp_cluster):
    cluster = tcp_cluster
    router_url = f"{cluster.http_url}/metrics"
    assert set(cluster.metrics_urls) == set(cluster.workers)
    router_before = scrape(router_url)
    workers_before = {w: scrape(url) for w, url in cluster.metrics_urls.items()}

    body = {"prompt": "Metrics count what happened.", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    served = httpx.post(f"{cluster.http_url}/v1/completions", json=body, timeout=60)
    bad = httpx.post(f"{cluster.http_url}/v1/completions", json=body | {"temperature": -1.0}, timeout=60)  # vLLM: >= 0
    with Client(cluster.grpc_target) as client:
        chunks = list(client.generate("And over gRPC.", max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))

    assert (served.status_code, bad.status_code) == (200, 400)
    assert sum(len(c.token_ids) for c in chunks) == MAX_TOKENS
    router = scrape(router_url)

    def grew(name: str, **labels) -> float:
        return value(router, name, **labels) - value(router_before, name, **labels)

    assert grew("pdserve_requests_total", api="http", outcome="ok", code="200") == 1
    assert grew("pdserve_requests_total", api="http", outcome="failed", code="400") == 1
    assert grew("pdserve_requests_total", api="grpc", outcome="ok", code="200") == 1
    assert total(router, "pdserve_requests_total") - total(router_before, "pdserve_requests_total") == 3
    for histogram in ("ttft", "tpot", "e2e", "router_queue"):
        assert grew(f"pdserve_{histogram}_seconds_count") == 2, histogram  # the two served requests
    assert grew("pdserve_itl_seconds_count") >= 2  # at least one gap per served stream of 6 tokens
    for phase in ("queue", "prefill", "decode"):
        assert grew("pdserve_request_phase_seconds_count", phase=phase) == 2, phase
    for worker_id in cluster.workers:   # the router's view of each worker's load, one series per worker
        labels = {"worker": worker_id, "role": worker_id.split("-")[0]}
        assert frozenset(labels.items()) in router["pdserve_router_worker_kv_usage_ratio"], worker_id
        assert value(router, "pdserve_router_worker_inflight", **labels) == 0   # nothing in flight now

    for worker_id, url in cluster.metrics_urls.items():
        after, before = scrape(url), workers_before[worker_id]
        assert any(name.startswith("vllm:") for name in after), f"{worker_id} serves no vllm:* series"
        assert "pdserve_worker_kv_blocks_total" in after
        # each served request ran on both workers (prefill: its first token; decode: the rest), the 400 on none
        finished = total(after, "vllm:request_success_total") - total(before, "vllm:request_success_total")
        assert finished == 2, worker_id
        assert set(DASHBOARD_VLLM_SERIES) <= set(after), f"{worker_id} lacks series the Grafana dashboard queries"
