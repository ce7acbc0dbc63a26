"""`pdserve load` and `pdserve load sweep` end to end against the real local SSE server."""

import json

import pytest
from loadgen_sse_server import SSEServer

from loadgen.harness import WorkloadConfig
from loadgen.jobs import OutputConfig, burstiness, sweep_job
from loadgen.metrics import SLO
from loadgen.prompts import PromptSynthesizer
from loadgen.runner import RunConfig
from loadgen.sweep import SearchConfig
from loadgen.targets.openai_http import OpenAITarget
from cli.main import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def server():
    with SSEServer() as running:
        yield running


def test_help_explains_targets_arrivals_workloads_slos_output_and_sweep(capsys):
    with pytest.raises(SystemExit):
        main(["load", "--help"])
    text = capsys.readouterr().out
    for needle in ("--backend {openai,openai-chat,pdserve}", "--prompt-format {token-ids,text}", "--tokenizer",
                   "--no-vllm-extensions", "HOST:PORT", "--request-rate", "--arrival", "--concurrency",
                   "--workload {random,trace,shared-prefix}", "--ttft-slo-ms", "--tpot-slo-ms", "--output-dir",
                   "sweep"):
        assert needle in text
    with pytest.raises(SystemExit):
        main(["load", "sweep", "--help"])
    assert "--attainment-target" in capsys.readouterr().out


def _load(server, tmp_path, *extra, label="run"):
    argv = ["load", "--target", server.url, "--num-prompts", "6", "--input-len", "16", "--output-len", "4",
            "--warmup", "1", "--output-dir", str(tmp_path), "--label", label, *extra]
    return main(argv), tmp_path / f"{label}.json"


def test_load_writes_vllm_style_json_and_a_cdf_plot(server, tmp_path, capsys):
    # SLOs a stalled host still meets: the test is about the file's shape, not the stub's speed
    code, path = _load(server, tmp_path, "--request-rate", "20", "--ttft-slo-ms", "5000", "--tpot-slo-ms", "1000",
                       "--no-progress")
    assert code == 0
    result = json.loads(path.read_text())
    assert (result["backend"], result["completed"], result["failed"], result["timed_out"]) == ("openai", 6, 0, 0)
    assert result["model_id"] == "test-model" and result["slo_attainment"] == 1.0 and result["goodput"] == {"ttft": 5000.0, "tpot": 1000.0}
    assert result["output_lens"] == [4] * 6 and result["input_lens"] == [16] * 6
    assert {"mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "p90_e2el_ms", "request_goodput"} <= result.keys()
    assert (result["endpoint_type"], result["tokenizer_id"], result["request_rate"], result["burstiness"]) == (
        "openai", None, 20.0, 1.0)
    assert result["max_concurrent_requests"] >= 1 and result["max_output_tokens_per_s"] >= 4.0
    assert result["achieved_request_rate"] == pytest.approx(20.0, rel=0.15)  # the last of 6 sent at 6 / 20 s
    assert result["max_concurrency"] is None and "mean_client_queue_time_ms" not in result
    assert (tmp_path / "run_latency_cdf.png").read_bytes()[:8] == PNG_MAGIC
    assert "ok 6" not in capsys.readouterr().out  # --no-progress: no bar


@pytest.mark.parametrize("env", [{}, {"FORCE_COLOR": "1", "COLUMNS": "160"}])
def test_the_progress_bar_renders_with_its_counts(server, tmp_path, capsys, monkeypatch, env):
    """Captured output is not a terminal: the bar is drawn once at the end; FORCE_COLOR makes it a live bar."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, _ = _load(server, tmp_path, "--request-rate", "50", "--label", "bar")
    assert code == 0
    out = capsys.readouterr().out
    assert "ok 6 · refused 0 · failed 0 · timed out 0" in out and "6/6" in out
    assert ("\x1b[" in out) == bool(env)  # a terminal gets escape codes (colour, cursor moves)


def test_constant_arrivals_and_a_closed_loop_record_vllms_traffic_keys(server, tmp_path):
    code, path = _load(server, tmp_path, "--arrival", "constant", "--request-rate", "30", "--max-concurrency", "2",
                       "--no-progress", label="constant")
    result = json.loads(path.read_text())
    assert code == 0 and (result["request_rate"], result["burstiness"], result["max_concurrency"]) == (30.0, "inf", 2)
    assert {"mean_client_queue_time_ms", "p99_e2el_including_client_queue_ms"} <= result.keys()
    code, path = _load(server, tmp_path, "--concurrency", "3", "--no-progress", label="closed")
    result = json.loads(path.read_text())
    assert code == 0 and (result["request_rate"], result["burstiness"], result["max_concurrency"]) == ("inf", None, 3)
    assert result["queue_times"] == [0.0] * 6 and result["mean_client_queue_time_ms"] == 0.0


def test_burstiness_is_vllms_gamma_shape_per_arrival_process():
    arrivals = RunConfig()
    assert burstiness(WorkloadConfig(arrival="poisson"), arrivals) == 1.0
    assert burstiness(WorkloadConfig(arrival="gamma", cv=2.0), arrivals) == 0.25
    assert burstiness(WorkloadConfig(arrival="constant"), arrivals) == "inf"
    assert burstiness(WorkloadConfig(arrival="constant"), RunConfig(mode="concurrency", max_concurrency=2)) is None


def test_text_prompts_without_vllm_extensions_through_the_cli(server, tmp_path, tiny_model):
    before = len(server.state.received)
    code, path = _load(server, tmp_path, "--backend", "openai-chat", "--tokenizer", str(tiny_model),
                       "--no-vllm-extensions", "--request-rate", "50", "--no-progress", label="chat")
    result = json.loads(path.read_text())
    assert code == 0 and (result["endpoint_type"], result["tokenizer_id"]) == ("openai-chat", str(tiny_model))
    assert result["input_lens"] == [16] * 6 and result["completed"] == 6
    bodies = server.state.received[before:]
    assert len(bodies) == 7 and {frozenset(b) for b in bodies} == {frozenset(
        {"model", "messages", "max_completion_tokens", "temperature", "stream", "stream_options"})}
    with pytest.raises(SystemExit, match="pass --tokenizer"):
        main(["load", "--target", server.url, "--prompt-format", "text"])


def test_sweep_probes_rates_and_plots_attainment(server, tmp_path):
    code = main(["load", "sweep", "--target", server.url, "--num-prompts", "4", "--input-len", "8",
                 "--output-len", "3", "--warmup", "0", "--start-rate", "8", "--max-rate", "16",
                 "--ttft-slo-ms", "500", "--output-dir", str(tmp_path), "--label", "s", "--no-progress"])
    assert code == 0
    sweep = json.loads((tmp_path / "s_sweep.json").read_text())
    assert [p["rate_rps"] for p in sweep["probes"]] == [8.0, 16.0]
    assert (sweep["goodput_rps"], sweep["bracketed"]) == (16.0, False)  # the fake server never saturates
    assert (sweep["complete"], sweep["error"], sweep["endpoint_type"]) == (True, None, "openai")
    assert (tmp_path / "s_attainment.png").read_bytes()[:8] == PNG_MAGIC


def test_a_sweep_that_fails_midway_keeps_and_writes_its_earlier_probes(server, tmp_path, capsys):
    made = []

    def make():  # the third probe's server is gone: opening it fails
        made.append(len(made))
        return OpenAITarget(server.url if len(made) < 3 else "http://127.0.0.1:9")

    workload = WorkloadConfig(rate_rps=1.0, num_requests=4, prompt_mean=8, output_mean=3)
    # an SLO every probe meets unless the host stalls for seconds (one stalled 0.6 s under a full suite)
    code = sweep_job(make, workload, RunConfig(), SLO(ttft_s=5.0), PromptSynthesizer(),
                     OutputConfig(tmp_path, "s", show_progress=False), SearchConfig(start_rps=8.0, max_rps=64.0))
    assert code == 1 and len(made) == 3
    sweep = json.loads((tmp_path / "s_sweep.json").read_text())
    assert [p["rate_rps"] for p in sweep["probes"]] == [8.0, 16.0]
    assert (sweep["goodput_rps"], sweep["bracketed"], sweep["complete"]) == (16.0, False, False)
    assert sweep["error"].startswith("TargetError: unreachable: GET http://127.0.0.1:9/v1/models")
    assert (tmp_path / "s_attainment.png").read_bytes()[:8] == PNG_MAGIC
    out = capsys.readouterr().out
    assert "incomplete" in out and "the sweep stopped after 2 probe(s): TargetError: unreachable" in out


def test_bad_arguments_exit_with_the_reason():
    with pytest.raises(SystemExit, match="--target is required"):
        main(["load"])
    with pytest.raises(SystemExit, match="gRPC address is host:port"):
        main(["load", "--target", "grpc://x:1", "--backend", "pdserve"])
