"""bench/hop_in_by_load.py explains itself, reads a validation's way in and loads, and recovers the
weights of a processor-sharing loss from way-ins made with known ones."""

import pytest

from bench_scripts import bench_functions, bench_help

BENCH = bench_functions("hop_in_by_load.py")


def test_the_script_explains_itself():
    shown = bench_help("hop_in_by_load.py")
    assert "--resimulated" in shown and "left out" in shown and "resimulate_kept.py" in shown


def test_a_validation_gives_one_row_per_rate_that_traced_its_way_in_and_its_loads():
    validation = {
        "workload": {"shape": "bursty"},
        "runs": [{"rate_rps": 5.0, "handoff_ms": {"measured": {"hop_in": 15.7}, "simulated": {"hop_in": 7.8}}},
                 {"rate_rps": 10.0, "handoff_ms": {"measured": {"hops": 20.0}, "simulated": {"hop_in": 9.0}}},  # untraced
                 {"rate_rps": 12.0, "handoff_ms": {"measured": {"hop_in": 28.0}}}],   # no loads read at 12
        "cpu_cores_by_process": {"5.0": {"router": 0.13, "client": 0.09}, "10.0": {"router": 0.2, "client": 0.1}},
        "engine_steps": {"5.0": {"prefill_workers": {"prefill-0": {"busy_share": 0.14}}}},
    }
    rows = BENCH["hop_rows"]("zen3-s71", validation)
    assert len(rows) == 1
    row = rows[0]
    assert (row.kind, row.shape, row.rate_rps, row.measured_ms) == ("zen3", "bursty", 5.0, 15.7)
    assert row.unbound_cores == pytest.approx(0.22) and row.prefill_busy == 0.14
    assert BENCH["simulated_hop_in"](validation) == {5.0: 7.8, 10.0: 9.0}


def test_the_fit_recovers_known_weights_and_the_stretch_puts_the_way_in_back():
    HopRow = BENCH["HopRow"]
    a, b = 0.6, 0.35
    loads = [(0.1, 0.2), (0.3, 0.1), (0.5, 0.6), (0.2, 0.8), (0.45, 0.3)]
    rows, simulated = [], []
    for i, (unbound, busy) in enumerate(loads):
        sim_ms = 6.0 + i
        rows.append(HopRow("zen4-s69", "trace", float(i), sim_ms / (1 - a * unbound - b * busy), unbound, busy))
        simulated.append(sim_ms)
    fitted = BENCH["fit_loss_weights"](rows, simulated)
    assert fitted == pytest.approx((a, b))
    back = BENCH["stretched_ms"](rows, simulated, *fitted)
    assert back == pytest.approx([r.measured_ms for r in rows])
    assert BENCH["errors"]([r.measured_ms for r in rows], back) == pytest.approx((0.0, 0.0), abs=1e-9)
    size, signed = BENCH["errors"]([10.0, 20.0], [5.0, 30.0])
    assert (size, signed) == pytest.approx((0.5, 0.0))
    with pytest.raises(ValueError, match="two or more rows"):
        BENCH["fit_loss_weights"](rows[:1], simulated[:1])
