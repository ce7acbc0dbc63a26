"""The router's least-loaded pick: fresh in-flight counts lead, stale reports only nudge."""

from router.policies.least_loaded import Candidate, load_score, pick_least_loaded


def _pick_many(candidates: dict[str, Candidate], requests: int) -> dict[str, int]:
    """Sends `requests` one after another with no report refresh in between, as within one heartbeat."""
    sent = {name: 0 for name in candidates}
    for _ in range(requests):
        current = [Candidate(c.worker_id, c.reported_requests, c.kv_usage, c.router_inflight + sent[c.worker_id])
                   for c in candidates.values()]
        sent[pick_least_loaded(current).worker_id] += 1
    return sent


def test_a_stale_report_of_a_burst_does_not_send_the_next_burst_all_elsewhere():
    # decode-1 reported the 16 requests it just finished; nothing is in flight anywhere now
    candidates = {"decode-1": Candidate("decode-1", 16, 0.0, 0), "decode-2": Candidate("decode-2", 0, 0.0, 0)}
    sent = _pick_many(candidates, 16)
    assert sent["decode-1"] >= 4 and sent["decode-2"] <= 12


def test_equal_workers_split_a_burst_evenly():
    candidates = {w: Candidate(w, 0, 0.0, 0) for w in ("a", "b")}
    assert _pick_many(candidates, 16) == {"a": 8, "b": 8}


def test_other_routers_load_still_counts():
    busy_elsewhere = Candidate("a", reported_requests=10, kv_usage=0.0, router_inflight=0)
    idle = Candidate("b", reported_requests=0, kv_usage=0.0, router_inflight=2)
    assert pick_least_loaded([busy_elsewhere, idle]).worker_id == "b"
    assert load_score(busy_elsewhere) == 5.0


def test_kv_pressure_breaks_ties_and_excluded_workers_are_skipped():
    full = Candidate("a", 1, 0.9, 1)
    roomy = Candidate("b", 1, 0.1, 1)
    assert pick_least_loaded([full, roomy]).worker_id == "b"
    assert pick_least_loaded([full, roomy], exclude=frozenset({"b"})).worker_id == "a"
    assert pick_least_loaded([full], exclude=frozenset({"a"})) is None
