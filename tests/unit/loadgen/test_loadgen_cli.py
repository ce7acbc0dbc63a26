"""`pdserve load` and `pdserve load sweep` end to end against the real local SSE server."""

import json

import pytest
from loadgen_sse_server import SSEServer

from pdserve.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def server():
    with SSEServer() as running:
        yield running


def test_help_explains_targets_arrivals_workloads_slos_output_and_sweep(capsys):
    with pytest.raises(SystemExit):
        main(["load", "--help"])
    text = capsys.readouterr().out
    for needle in ("--backend {openai,pdserve}", "HOST:PORT", "--request-rate", "--arrival", "--concurrency",
                   "--workload {random,trace,shared-prefix}", "--ttft-slo-ms", "--tpot-slo-ms", "--output-dir",
                   "sweep"):
        assert needle in text
    with pytest.raises(SystemExit):
        main(["load", "sweep", "--help"])
    assert "--attainment-target" in capsys.readouterr().out


def test_load_writes_vllm_style_json_and_a_cdf_plot(server, tmp_path):
    code = main(["load", "--target", server.url, "--num-prompts", "6", "--request-rate", "20", "--input-len", "16",
                 "--output-len", "4", "--warmup", "1", "--ttft-slo-ms", "500", "--tpot-slo-ms", "100",
                 "--output-dir", str(tmp_path), "--label", "run", "--no-progress"])
    assert code == 0
    result = json.loads((tmp_path / "run.json").read_text())
    assert (result["backend"], result["completed"], result["failed"], result["timed_out"]) == ("openai", 6, 0, 0)
    assert result["model_id"] == "test-model" and result["slo_attainment"] == 1.0 and result["goodput"] == {"ttft": 500.0, "tpot": 100.0}
    assert result["output_lens"] == [4] * 6 and result["input_lens"] == [16] * 6
    assert {"mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "p90_e2el_ms", "request_goodput"} <= result.keys()
    assert (tmp_path / "run_latency_cdf.png").read_bytes()[:8] == PNG_MAGIC


def test_sweep_probes_rates_and_plots_attainment(server, tmp_path):
    code = main(["load", "sweep", "--target", server.url, "--num-prompts", "4", "--input-len", "8",
                 "--output-len", "3", "--warmup", "0", "--start-rate", "8", "--max-rate", "16",
                 "--ttft-slo-ms", "500", "--output-dir", str(tmp_path), "--label", "s", "--no-progress"])
    assert code == 0
    sweep = json.loads((tmp_path / "s_sweep.json").read_text())
    assert [p["rate_rps"] for p in sweep["probes"]] == [8.0, 16.0]
    assert (sweep["goodput_rps"], sweep["bracketed"]) == (16.0, False)  # the fake server never saturates
    assert (tmp_path / "s_attainment.png").read_bytes()[:8] == PNG_MAGIC


def test_bad_arguments_exit_with_the_reason():
    with pytest.raises(SystemExit, match="--target is required"):
        main(["load"])
    with pytest.raises(SystemExit, match="gRPC address is host:port"):
        main(["load", "--target", "grpc://x:1", "--backend", "pdserve"])
