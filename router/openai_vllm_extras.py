"""vLLM's extra request fields whose meaning a cluster gives no engine: read with vLLM's own
validators, then either served by the router (`stream_interval`, `repetition_detection`,
`return_prompt_text`, `reasoning_effort`) or shown to change nothing on vLLM's server as shipped
(default flags), so pdserve takes them and answers the same:

- `session_id` names the request's session in vLLM's KV-cache events, off by default;
- `watermarking` asks for the engine's configured watermark, and vLLM's server has none by default
  (it logs a warning and samples unwatermarked);
- `return_token_offsets` is honoured only by vLLM's `/render` endpoints, ignored on generation;
- `vllm_xargs` are `SamplingParams.extra_args`, read only by custom logits processors and KV
  connectors (none by default); they are checked as vLLM checks them and reach no engine, so a
  client's keys never reach pdserve's own KV transfer;
- `include_reasoning` acts only through a reasoning parser, and none is configured by default;
- `thinking_token_budget` is refused as vLLM's engine refuses any budget without a reasoning
  config (its default): only -1 or null, "unlimited", is served;
- `mm_payload` and `return_mm_kwargs` shape vLLM's render endpoints' answers,
  `routed_experts_prompt_start` a mixture-of-experts model's routing data, `kv_transfer_params`
  and `ec_transfer_params` a KV or encoder-cache connector's (none by default: pdserve moves KV
  itself): taken, as vLLM's server takes them, and unused;
- a chat's `mm_processor_kwargs` and `media_io_kwargs` are refused by vLLM's own check
  (`check_mm_kwargs`: its server trusts neither without `--trust-request-mm-kwargs`, and pdserve
  serves a text-only model), a completion's `prompt_embeds` by vLLM's own loader
  (`check_no_prompt_embeds`: its server takes none without `--enable-prompt-embeds`).

Pure: values in, values (or InvalidRequest with vLLM's message) out. The fields themselves, with
vLLM's types, are `router.openai_extra_fields`.
"""

from __future__ import annotations

from typing import Sequence

from pdserve.errors import InvalidRequest
from router.openai_prompt import vllm_checked

# vLLM's engine refusal (`InputProcessor._validate_params`), with its message: the message is
# written inline there, so it is copied here.
THINKING_BUDGET_UNCONFIGURED = ("thinking_token_budget is set but reasoning_config is not configured. Please set "
                                "--reasoning-parser and/or --reasoning-config to use thinking_token_budget.")
REPETITION_FINISH_REASON = "repetition"              # vLLM's FinishReason.REPETITION
REPETITION_STOP_REASON = "repetition_detected"       # vLLM's stop_reason for it (`check_stop`)


def thinking_token_budget(value: object) -> int | None:
    """vLLM's reading of `thinking_token_budget` (`validate_thinking_token_budget`): None when unset
    or -1 (unlimited), else the budget; a value that is no non-negative integer is refused with
    vLLM's message, naming the field."""
    from vllm.sampling_params import validate_thinking_token_budget

    return vllm_checked(lambda: validate_thinking_token_budget(value))


def thinking_budget_refusal(budget: int | None) -> InvalidRequest | None:
    """The engine's refusal of a budget (`budget` as `thinking_token_budget` reads it): vLLM's
    engine refuses any when it runs without a reasoning config, as vLLM's server and pdserve's
    engines do. vLLM refuses it when the request reaches the engine, so a stream is refused in its
    first event (status 200), a whole answer with 400."""
    if budget is None:
        return None
    return InvalidRequest(THINKING_BUDGET_UNCONFIGURED, field="thinking_token_budget")


def check_vllm_xargs(xargs: dict | None) -> None:
    """vLLM's check of `vllm_xargs` as `SamplingParams.extra_args` (integers the engine's
    MessagePack carries), with its message and `param` ("extra_args")."""
    if not xargs:
        return
    from vllm.sampling_params import SamplingParams

    vllm_checked(lambda: SamplingParams.from_optional(extra_args=dict(xargs)))


def repetition_end(output_token_ids: Sequence[int], new_token_ids: Sequence[int], params,
                   min_tokens: int = 0) -> int | None:
    """How many of `new_token_ids` are kept when the output (`output_token_ids` so far, then
    `new_token_ids`) repeats itself as vLLM's `repetition_detection` (`params`, vLLM's
    RepetitionDetectionParams) finds it: the count up to and with the token after which vLLM's
    scheduler ends the request (`check_stop`: at no output shorter than `min_tokens`), None when it
    would not. vLLM checks after every token the engine samples; the router checks the whole output,
    which no engine of a disaggregated walk sees (the decode engine's starts after the prefill's
    token), so it runs vLLM's own `check_sequence_repetition` here."""
    from vllm.v1.core.sched.utils import check_sequence_repetition

    tokens = list(output_token_ids)
    for kept, token_id in enumerate(new_token_ids, start=1):
        tokens.append(token_id)
        if len(tokens) >= min_tokens and check_sequence_repetition(tokens, params):
            return kept
    return None


def reasoning_template_kwargs(reasoning_effort: str | None, chat_template_kwargs: dict | None) -> dict:
    """What `reasoning_effort` adds to the chat template's arguments (vLLM's `build_chat_params`):
    itself, and `enable_thinking` (false for "none") unless the request's `chat_template_kwargs`
    name it; nothing when unset (vLLM's merge drops a None)."""
    if reasoning_effort is None:
        return {}
    added = {"reasoning_effort": reasoning_effort}
    if "enable_thinking" not in (chat_template_kwargs or {}):
        added["enable_thinking"] = reasoning_effort != "none"
    return added


def check_mm_kwargs(data) -> None:
    """vLLM's refusal of a chat's per-request multimodal arguments (`validate_request_mm_kwargs`,
    untrusted by default), with its message and `param`."""
    if not isinstance(data, dict) or (not data.get("mm_processor_kwargs") and not data.get("media_io_kwargs")):
        return
    from vllm.entrypoints.generate.base.protocol import validate_request_mm_kwargs

    vllm_checked(lambda: validate_request_mm_kwargs(mm_processor_kwargs=data.get("mm_processor_kwargs"),
                                                    media_io_kwargs=data.get("media_io_kwargs"),
                                                    trust_request_mm_kwargs=False))


def check_no_prompt_embeds(data) -> None:
    """vLLM's refusal of a completion's `prompt_embeds` on a server without `--enable-prompt-embeds`
    (its loader's own check, given a model config that says so), with its message and `param`."""
    if not isinstance(data, dict) or data.get("prompt_embeds") is None:
        return
    from types import SimpleNamespace

    from vllm.renderers.embed_utils import safe_load_prompt_embeds

    vllm_checked(lambda: safe_load_prompt_embeds(SimpleNamespace(enable_prompt_embeds=False), b""))
