"""The prompt step's stretch by the decode batch streaming beside it (`SimSettings.prompt_stretch`,
a what-if), on a hand schedule of the round model, and the simulated prompt steps read by that batch
as a validation sets them beside the traced ones."""

from __future__ import annotations

import numpy as np
import pytest

from planner.simulator import SimulationError, Topology, simulate
from planner_testkit import ROUND_MODEL, round_settings, spec

PROMPT_S = 0.1 + 0.001 * 50 + 1e-6 * 50 * 50   # a 50-token prompt: 0.1525 s
# the first request's pull (5 blocks of 1,000 bytes: 0.055 s) ends at 0.2075; it then decodes 19
# more tokens in steps of 20.1-21.9 ms, past 0.6 s: the second request's prompt, at 0.3 s, starts
# beside a batch of one


def first_tokens(**overrides) -> list[float]:
    result = simulate([spec(0.0, 50, 20), spec(0.3, 50, 2)], Topology.disaggregated(1, 1),
                      round_settings(**overrides), ROUND_MODEL)
    return [float(t) for t in result.timeline["first_token_s"]]


def test_a_prompt_beside_a_streaming_batch_takes_that_batchs_stretch():
    assert first_tokens() == pytest.approx([PROMPT_S, 0.3 + PROMPT_S])
    # idle decode: 1x; one stream or more: 2x. Only the second prompt starts beside a stream
    assert first_tokens(prompt_stretch=((0, 1.0), (1, 2.0))) == pytest.approx([PROMPT_S, 0.3 + 2 * PROMPT_S])
    # a row for the idle decode worker stretches the first prompt too; a row past the batch is not reached
    assert first_tokens(prompt_stretch=((0, 1.5), (8, 3.0))) == pytest.approx([1.5 * PROMPT_S, 0.3 + 1.5 * PROMPT_S])
    # below the host model's stretch (1 here, no host modelled) the table changes nothing
    assert first_tokens(prompt_stretch=((0, 0.5),)) == pytest.approx(first_tokens())
    # a fixed loss a step: 20 ms + 1.5x beside the stream; idle, 0.5x + 20 ms stays under the model's step
    assert first_tokens(prompt_stretch=((0, 0.5, 0.02), (1, 1.5, 0.02))) == pytest.approx(
        [PROMPT_S, 0.3 + 0.02 + 1.5 * PROMPT_S])


def test_the_table_is_read_at_the_largest_batch_not_above_and_checked():
    settings = round_settings(prompt_stretch=((0, 1.4), (4, 2.3), (16, 3.0)))
    assert [settings.prompt_loss_at(b)[0] for b in (0, 3, 4, 15, 16, 200)] == [1.4, 1.4, 2.3, 2.3, 3.0, 3.0]
    assert round_settings(prompt_stretch=((2, 2.0),)).prompt_loss_at(1)[0] == 1.0
    mixed = round_settings(prompt_stretch=((0, 1.2), (8, 1.8, 0.012)))
    assert [mixed.prompt_loss_at(b) for b in (0, 7, 8, 40)] == [(1.2, 0.0), (1.2, 0.0), (1.8, 0.012), (1.8, 0.012)]
    for bad in (((4, 2.0), (0, 1.0)), ((0, 1.0), (0, 2.0)), ((-1, 1.0),), ((0, 0.0),), ((0, 1.0, -0.001),),
                ((0,),)):
        with pytest.raises(SimulationError, match="prompt_stretch"):
            round_settings(prompt_stretch=bad)


def test_the_validation_takes_the_table_from_its_command_line_and_says_so_in_its_help():
    from bench_scripts import bench_functions, bench_help

    text = " ".join(bench_help("validate_planner.py").split())
    assert "--prompt-stretch BATCH:STRETCH[+LOST_MS]" in text and "--refine N" in text and "90% (the goodput lies past" in text
    parse = bench_functions("validate_planner.py")["prompt_stretch_arg"]
    assert parse("0:1.43,4:2.35") == ((0, 1.43, 0.0), (4, 2.35, 0.0))
    assert parse("0:1.3,8:1.9+12") == ((0, 1.3, 0.0), (8, 1.9, pytest.approx(0.012)))
    import argparse
    for bad in ("4:2,0:1", "0-1.4", "a:1", "0:1+x", "0:1+-3"):
        with pytest.raises(argparse.ArgumentTypeError, match="BATCH:STRETCH"):
            parse(bad)


def test_the_result_keeps_each_prompt_step_with_the_decode_batch_beside_it():
    result = simulate([spec(0.0, 50, 20), spec(0.3, 50, 2)], Topology.disaggregated(1, 1),
                      round_settings(prompt_stretch=((0, 1.0), (1, 2.0))), ROUND_MODEL)
    # (start, duration, the model's step, decode batch): the first prompt alone, the second beside
    # the first request's stream, at the table's 2x
    assert result.prefill_steps == pytest.approx(np.array([[0.0, PROMPT_S, PROMPT_S, 0], [0.3, 2 * PROMPT_S, PROMPT_S, 1]]))
    # and each decode step: the first request's 19 (its first its join), then the second's one, alone;
    # unstretched, each at the model's step (the round model has no served line)
    decode = result.decode_steps
    assert decode[:, 4].tolist() == [1] + [0] * 18 + [1] and set(decode[:, 3]) == {1}
    assert decode[:, 1] == pytest.approx(decode[:, 2]) and decode[0, 2] == pytest.approx(0.01 + 0.005 + 1e-4 * 51)


def test_the_simulated_prompt_steps_are_read_by_decode_batch_as_the_traced_ones_are():
    from planner.validation_steps import decode_batch_label, simulated_prompt_stretch_by_decode_batch

    assert [decode_batch_label(b) for b in (0, 1, 3, 8, 40, 64, 500)] == ["0", "1", "2-3", "8-15", "32-63", "64+", "64+"]
    # idle: five steps of 10 ms at 1.5x; beside 8-15 streams five of 10-40 ms model at 10 ms + 2x
    idle = [(i, 0.015, 0.010, 0) for i in range(5)]
    beside = [(10 + i, 0.010 + 2 * m, m, 9) for i, m in enumerate((0.010, 0.015, 0.020, 0.030, 0.040))]
    rows = simulated_prompt_stretch_by_decode_batch(idle + beside + [(20, 0.05, 0.01, 2)])   # one 2-3 step: too few
    assert list(rows) == ["0", "8-15"]
    assert rows["0"] == {"steps": 5, "median_stretch": 1.5}                      # one length: no line
    assert rows["8-15"]["median_stretch"] == pytest.approx(2 + 0.010 / 0.020)
    assert rows["8-15"]["lost_ms"] == pytest.approx(10.0, abs=1e-3) and rows["8-15"]["slope"] == pytest.approx(2.0, abs=1e-4)
    assert simulated_prompt_stretch_by_decode_batch(np.zeros((0, 4))) == {}
