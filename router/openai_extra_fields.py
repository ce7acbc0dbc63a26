"""vLLM's extra fields of both generation bodies (completions and chat), with vLLM's own types
and checks: what each means, and why it is served or changes nothing, is
`router.openai_vllm_extras` (its rules, pure). A mixin of `router.openai_schema.SamplingFields`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from pdserve.errors import InvalidRequest
from router.openai_fields import vllm_field_type
from router.openai_vllm_extras import check_vllm_xargs, thinking_budget_refusal, thinking_token_budget

# vLLM's own types of its extra fields (with their constraints), so pydantic checks them as vLLM does
VllmXargs = vllm_field_type("completion", "vllm_xargs")
StreamIntervalField = vllm_field_type("completion", "stream_interval")
RepetitionDetection = vllm_field_type("completion", "repetition_detection")
MMPayload = vllm_field_type("completion", "mm_payload")


class VllmExtraFields(BaseModel):
    # vLLM's fields that change nothing on its server as shipped
    session_id: str | None = None
    watermarking: bool | None = None
    return_token_offsets: bool | None = False
    vllm_xargs: VllmXargs = None
    thinking_token_budget: int | None = Field(default=None, description="vLLM's; refused as vLLM's engine refuses "
                                                                        "it without a reasoning config (-1: unset)")
    # a multimodal, MoE or KV-connector model's (vLLM's render endpoints read the first two); on a
    # text-only model and a server without a KV connector they change nothing on vLLM's server
    mm_payload: MMPayload = "tensors"
    return_mm_kwargs: bool | None = None
    routed_experts_prompt_start: int = Field(default=0, ge=0)   # vLLM's constraint is on its field, not its type
    kv_transfer_params: dict[str, Any] | None = Field(
        default=None, description="vLLM's parameters for its own KV connector; vLLM's server without one (its "
                                  "default) ignores them, and pdserve moves KV itself: taken and unused")
    ec_transfer_params: dict[str, Any] | None = None
    # vLLM's fields the router serves
    stream_interval: StreamIntervalField = Field(
        default=None, description="vLLM's: a stream's tokens batched this many to an event (the first and last "
                                  "events at once); ignored when not streamed")
    repetition_detection: RepetitionDetection = Field(
        default=None, description="vLLM's: the request ends (finish_reason \"repetition\") when its output ends "
                                  "with an n-gram repeated min_count times; checked by the router over the whole "
                                  "output")

    @model_validator(mode="before")
    @classmethod
    def _thinking_token_budget_check(cls, data):
        """vLLM's reading of the field (its validator runs before the field's type, and -1 is unset)."""
        if isinstance(data, dict) and data.get("thinking_token_budget") is not None:
            data = data | {"thinking_token_budget": thinking_token_budget(data["thinking_token_budget"])}
        return data

    @field_validator("repetition_detection", mode="wrap")
    @classmethod
    def _repetition_detection_check(cls, value, handler):
        """vLLM's type (a wrong type is the body's schema error), and its own check of the values
        (`RepetitionDetectionParams.__post_init__`), whose refusal is the request's 400 with vLLM's
        message."""
        from vllm.exceptions import VLLMClientError

        try:
            return handler(value)
        except VLLMClientError as error:
            raise InvalidRequest(str(error), field=getattr(error, "parameter", None)) from error

    @model_validator(mode="after")
    def _vllm_xargs_check(self):
        check_vllm_xargs(self.vllm_xargs)
        return self

    def engine_refusal(self) -> InvalidRequest | None:
        """What vLLM's engine refuses when the request reaches it (after the body is read and the
        prompt made): a stream gets it as its first event, a whole answer as its status."""
        return thinking_budget_refusal(self.thinking_token_budget)
