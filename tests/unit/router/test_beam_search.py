"""Beam search's decisions on plain values (`router.beam_search`), and the search loop over a
scripted step compared with vLLM's own online beam search over the same scripted model."""

from __future__ import annotations

import asyncio
import math

import pytest
from vllm.logprobs import Logprob
from vllm.sampling_params import BeamSearchParams

from pdserve.errors import InvalidRequest
from router.beam_search import advance, best_beams, finished_beam, first_beam, search
from router.openai_beam import beam_params, step_sampling
from router.openai_chat import ChatCompletionRequest
from router.openai_schema import CompletionRequest

EOS = 2
PROMPT = [10, 11]


def position(*entries: tuple[int, float]) -> dict[int, Logprob]:
    """A step's logprobs in the engine's order: the sampled token first, then the top ones."""
    return {token_id: Logprob(logprob, rank) for rank, (token_id, logprob) in enumerate(entries, start=1)}


def params(width: int = 2, max_tokens: int = 4, **fields) -> BeamSearchParams:
    return BeamSearchParams(beam_width=width, max_tokens=max_tokens, temperature=0.0, **fields)


def test_advance_keeps_the_width_best_continuations_best_first():
    start = first_beam(PROMPT)
    advanced = advance([start], [position((5, -0.5), (6, -1.0), (7, -2.0), (8, -3.0))], params(), EOS)
    assert [beam.tokens for beam in advanced.beams] == [[10, 11, 5], [10, 11, 6]]
    assert [beam.cum_logprob for beam in advanced.beams] == [-0.5, -1.0]
    assert advanced.completed == []


def test_advance_scores_continuations_of_every_beam_together():
    beams = advance([first_beam(PROMPT)], [position((5, -0.1), (6, -0.2))], params(), EOS).beams
    advanced = advance(beams, [position((7, -3.0), (8, -4.0)), position((9, -0.3), (3, -0.4))], params(), EOS)
    assert [beam.tokens[2:] for beam in advanced.beams] == [[6, 9], [6, 3]]
    assert [beam.cum_logprob for beam in advanced.beams] == pytest.approx([-0.5, -0.6])
    assert len(advanced.beams[0].logprobs) == 2


def test_eos_completes_its_beam_without_the_eos_token_unless_kept():
    step = [position((EOS, -0.1), (5, -0.2), (6, -0.3))]
    advanced = advance([first_beam(PROMPT)], step, params(), EOS)
    assert [beam.tokens for beam in advanced.completed] == [PROMPT]
    assert (advanced.completed[0].finish_reason, advanced.completed[0].stop_reason) == ("stop", EOS)
    assert len(advanced.completed[0].logprobs) == 1   # the EOS step's position, though EOS is not a token
    assert [beam.tokens[2:] for beam in advanced.beams] == [[5], [6]]
    kept = advance([first_beam(PROMPT)], step, params(include_stop_str_in_output=True), EOS)
    assert kept.completed[0].tokens == PROMPT + [EOS]


def test_ignore_eos_makes_eos_a_token_like_any_other():
    advanced = advance([first_beam(PROMPT)], [position((EOS, -0.1), (5, -0.2))], params(ignore_eos=True), EOS)
    assert advanced.completed == []
    assert [beam.tokens[2:] for beam in advanced.beams] == [[EOS], [5]]


def test_best_beams_divide_by_length_to_the_length_penalty():
    short = advance([first_beam(PROMPT)], [position((EOS, -1.0), (5, -0.1))], params(width=1), EOS)
    longer = advance(short.beams, [position((6, -1.2))], params(width=1), EOS).beams
    # scores: the completed beam -1.0 / 2 tokens; the live one -1.3 / 4 tokens (length_penalty 1)
    assert best_beams(short.completed, longer, params(width=1), EOS)[0].tokens == PROMPT + [5, 6]
    # with length_penalty 0 the cumulative logprob alone decides
    assert best_beams(short.completed, longer, params(width=1, length_penalty=0.0), EOS)[0].tokens == PROMPT


def test_finished_beam_reports_as_vllm_s_completion_output():
    kept = params(include_stop_str_in_output=True)
    advanced = advance([first_beam(PROMPT)], [position((5, -0.1), (EOS, -0.2))], kept, EOS)
    beam = finished_beam(advanced.completed[0], len(PROMPT), kept, EOS)
    assert (beam.token_ids, beam.text_token_ids, beam.finish_reason, beam.stop_reason) == ([EOS], [], "stop", EOS)
    live = finished_beam(advanced.beams[0], len(PROMPT), kept, EOS)
    assert (live.token_ids, live.text_token_ids, live.finish_reason, live.stop_reason) == ([5], [5], "length", None)


def scripted_model(tokens: list[int]) -> dict[int, Logprob]:
    """A deterministic model over a vocabulary of 8: the next token's logprobs depend on the last
    two tokens; EOS becomes likely as the sequence grows."""
    seed = (tokens[-1] * 31 + tokens[-2] * 7 + len(tokens)) % 97
    raw = [((seed * (i + 3)) % 11) / 3.0 + (2.5 if i == EOS and len(tokens) > 5 else 0.0) for i in range(8)]
    norm = math.log(sum(math.exp(x) for x in raw))
    ranked = sorted(range(8), key=lambda i: -raw[i])
    return {i: Logprob(raw[i] - norm, rank) for rank, i in enumerate(ranked, start=1)}


def step_of(calls: list[list[int]]):
    async def step(tokens: list[int], index: int) -> dict[int, Logprob]:
        calls.append(list(tokens))
        model = scripted_model(tokens)
        return dict(list(model.items())[:4])   # the top 2 * width (width 2), the sampled (greedy) token first
    return step


def vllm_s_beams(prompt: list[int], beam_params: BeamSearchParams):
    """vLLM's own online beam search over the scripted model: its `CompletionOutput`s."""
    from vllm import CompletionOutput, RequestOutput
    from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin

    class Engine:
        class input_processor:
            @staticmethod
            def resolve_watermarking(_params):
                return None

        async def generate(self, prompt, sampling_params, request_id, **_):
            model = scripted_model(prompt["prompt_token_ids"])
            logprobs = dict(list(model.items())[:sampling_params.logprobs])
            yield RequestOutput(request_id, None, prompt["prompt_token_ids"], None,
                                [CompletionOutput(0, "", [next(iter(logprobs))], None, [logprobs], "length")],
                                finished=True)

    class Tokenizer:
        eos_token_id = EOS

        @staticmethod
        def decode(ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    class Serving(BeamSearchOnlineMixin):
        engine_client = Engine()

        class renderer:
            @staticmethod
            def get_tokenizer():
                return Tokenizer

    async def run():
        outputs = [output async for output in Serving().beam_search({"type": "token", "prompt_token_ids": prompt},
                                                                    "beam", beam_params)]
        return outputs[-1].outputs
    return asyncio.run(run())


@pytest.mark.parametrize("fields", [{}, {"include_stop_str_in_output": True}, {"ignore_eos": True},
                                    {"length_penalty": 0.3}])
def test_search_finds_the_beams_vllm_s_own_beam_search_finds(fields):
    beam_params = params(width=2, max_tokens=9, **fields)
    calls: list[list[int]] = []
    ours = asyncio.run(search(PROMPT, beam_params, EOS, step_of(calls)))
    theirs = vllm_s_beams(PROMPT, beam_params)
    assert [(b.token_ids, b.finish_reason, b.stop_reason) for b in ours] == \
        [(list(o.token_ids), o.finish_reason, o.stop_reason) for o in theirs]
    assert [b.cum_logprob for b in ours] == [o.cumulative_logprob for o in theirs]
    assert [b.logprobs for b in ours] == [o.logprobs for o in theirs]
    assert calls[0] == PROMPT and len(calls) <= 1 + 2 * 8   # one step of the prompt, then one per live beam


def test_search_stops_when_every_beam_has_met_eos():
    async def step(tokens, index):
        return position((EOS, -0.1), (EOS + 1, -0.2)) if len(tokens) > 2 else position((5, -0.1), (6, -0.2))
    beams = asyncio.run(search(PROMPT, params(width=1, max_tokens=50), EOS, step))
    assert [(b.token_ids, b.finish_reason) for b in beams] == [([5], "stop")]


def test_a_failed_step_fails_the_search():
    async def step(tokens, index):
        raise InvalidRequest("no")
    with pytest.raises(InvalidRequest):
        asyncio.run(search(PROMPT, params(), EOS, step))


def test_beam_params_are_vllm_s_to_beam_search_params():
    body = CompletionRequest.model_validate({"prompt": "x", "use_beam_search": True, "n": 3, "max_tokens": 50,
                                             "length_penalty": 0.5, "ignore_eos": True, "top_p": 0.2})
    assert beam_params(body, room=20) == BeamSearchParams(beam_width=3, max_tokens=20, ignore_eos=True,
                                                          temperature=1.0, length_penalty=0.5)
    assert step_sampling(beam_params(body, room=20)).logprobs == 6
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                                 "use_beam_search": True, "temperature": 0})
    assert beam_params(chat, room=30).max_tokens == 30   # a chat without max_tokens: the rest of the context
    with pytest.raises(InvalidRequest, match="beam_width must be at least 1"):
        beam_params(CompletionRequest.model_validate({"prompt": "x", "use_beam_search": True, "n": 0}), room=5)


@pytest.mark.parametrize("body, message", [
    ({"prompt": "x", "use_beam_search": True, "logprob_token_ids": [1]}, "`logprob_token_ids` is not supported"),
    ({"prompt": "x", "use_beam_search": True, "echo": True, "logprobs": 0}, "`echo` with `logprobs`"),
    ({"messages": [{"role": "user", "content": "hi"}], "use_beam_search": True, "logprob_token_ids": [1],
      "logprobs": True}, "`logprob_token_ids` is not supported"),
])
def test_beam_search_refuses_what_vllm_s_refuses_with_its_message(body, message):
    model = ChatCompletionRequest if "messages" in body else CompletionRequest
    with pytest.raises(InvalidRequest, match=message):
        model.model_validate(body)
