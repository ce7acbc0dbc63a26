"""Routing decisions: pure functions over the registry's view of the workers. No I/O here.

- `least_loaded`: the pick among a role's workers when a placed worker fails (retries);
- `placement/`: SLO-driven placement, Filter -> Scorer -> Picker over predicted costs;
- `admission`: admit, or refuse with a retry-after (the predicted drain time);
- `ordering`: the order of the router's dispatch queue (SLO class, shortest first, aging);
- `prefix_index`: which worker caches which prompt prefix (chained block hashes, LRU).

Nothing here imports asyncio, Redis, gRPC, protobuf, vLLM or the router's I/O modules
(tests/unit/router/policies/test_policies_are_pure.py).
"""
