"""The load generator: workloads in, `vllm bench serve`-compatible measurements out.

- `workload`: `RequestSpec` and the arrival processes / length distributions / traces that build them
- `prompts`: token-id prompts for a spec (shared prefixes, deterministic per seed), and with a
  tokenizer the same as text of exact token length (`text_prompts`)
- `seeds`: one seed, an independent random stream per purpose (arrivals, lengths, groups, prompts)
- `targets/`: the systems under test behind one `Target` protocol (OpenAI HTTP, pdserve gRPC)
- `runner`: sends a workload (open loop at arrival times, or fixed concurrency) and records every request
- `metrics`: TTFT, TPOT, ITL, E2EL, throughput, SLO attainment, goodput (pure)
- `sweep`: the goodput search over offered rates, and goodput from a fixed rate grid (pure)
- `vllm_server`: vLLM's own OpenAI server as a child process, the colocated baseline
- `harness`, `jobs`, `report`, `plots`: progress bars, tables, JSON and PNGs for `pdserve load`
"""
