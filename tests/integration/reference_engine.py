"""One colocated vLLM engine (no connector) answering requests one at a time: the reference a
cluster's answers are compared with, its text and stop handling vLLM's own.

    python reference_engine.py SETTINGS_JSON
Reads one JSON request a line from stdin, {"token_ids": [...], "sampling": {SamplingParams
fields}}, and answers each with a line `RESULT {"token_ids", "text", "finish_reason",
"stop_reason", "logprobs", "prompt_logprobs"}` on stdout (vLLM logs there too: read only the RESULT
lines). Logprobs are vLLM's positions in its dicts' order, each entry [token_id, logprob, rank,
decoded_token] (a prompt's first position: null); null when not asked for. Ends at end of input.
"""

import asyncio
import json
import sys

from pdserve.engine import EngineSettings, start_engine
from pdserve.process_exit import exit_without_teardown

PREFIX = "RESULT "


async def main(settings_path: str) -> None:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.inputs import TokensPrompt

    settings = EngineSettings(**json.load(open(settings_path)))
    engine = start_engine(settings, "colocated", fork_safe=True)   # started under engine_start_env
    loop = asyncio.get_running_loop()
    index = 0
    print(PREFIX + json.dumps({"ready": True}), flush=True)
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        entry = json.loads(line)
        if "logit_bias" in entry["sampling"]:  # JSON keys are strings; vLLM's are token ids
            entry["sampling"]["logit_bias"] = {int(k): v for k, v in entry["sampling"]["logit_bias"].items()}
        if "structured_outputs" in entry["sampling"]:
            entry["sampling"]["structured_outputs"] = StructuredOutputsParams(**entry["sampling"]["structured_outputs"])
        final = None
        async for output in engine.generate(TokensPrompt(prompt_token_ids=entry["token_ids"]),
                                            SamplingParams(**entry["sampling"]), f"ref-{index}"):
            final = output
        index += 1
        completion = final.outputs[0]
        print(PREFIX + json.dumps({"token_ids": list(completion.token_ids), "text": completion.text,
                                   "finish_reason": completion.finish_reason,
                                   "stop_reason": completion.stop_reason,
                                   "logprobs": _positions(completion.logprobs),
                                   "prompt_logprobs": _positions(final.prompt_logprobs)}), flush=True)
    engine.shutdown()
    exit_without_teardown(0)   # the session's teardown need not wait out vLLM's (seconds of CPU)


def _positions(positions):
    if positions is None:
        return None
    return [None if position is None else [[token_id, logprob.logprob, logprob.rank, logprob.decoded_token]
                                           for token_id, logprob in position.items()] for position in positions]


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
