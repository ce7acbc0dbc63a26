"""Greedy outputs of one colocated vLLM engine (no connector): the reference for correctness.

    python colocated_reference.py SETTINGS_JSON PROMPTS_JSON OUT_JSON
Prompts run one at a time, as the cluster tests send them, so batch composition is the same.
"""

import asyncio
import json
import sys

from pdserve.engine import EngineSettings, start_engine


async def main(settings_path: str, prompts_path: str, out_path: str) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    settings = EngineSettings(**json.load(open(settings_path)))
    prompts = json.load(open(prompts_path))
    engine = start_engine(settings, "colocated", fork_safe=True)   # started under engine_start_env
    outputs = []
    for index, entry in enumerate(prompts):
        params = SamplingParams(max_tokens=entry["max_tokens"], temperature=0.0, ignore_eos=True)
        final = None
        async for output in engine.generate(TokensPrompt(prompt_token_ids=entry["token_ids"]), params, f"ref-{index}"):
            final = output
        outputs.append(list(final.outputs[0].token_ids))
    engine.shutdown()
    json.dump(outputs, open(out_path, "w"))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
