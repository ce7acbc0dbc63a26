"""The Redis registry: which workers are alive, where they listen, and how loaded they are.

    pdserve:{cluster}:worker:{worker_id}   hash, see `WorkerRecord`; expires after `ttl_s`
                                           (the key's format, with every other, in `pdserve.keys`)

A worker re-writes its hash and its TTL on every heartbeat, so its entry is a lease: a worker
that dies (even by SIGKILL) disappears on its own within `ttl_s`, and a router that reads the
registry stops routing to it. Redis is the only state the cluster shares.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
import redis.asyncio as aioredis

from pdserve.keys import topology_key, worker_key
from pdserve.roles import Role, Topology


@dataclass(frozen=True)
class WorkerRecord:
    worker_id: str
    role: str
    model: str
    grpc_address: str
    kv_address: str = ""
    engine_id: str = ""
    max_model_len: int = 0
    block_size: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_inflight: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    pending_transfers: int = 0
    draining: int = 0
    updated_at_s: float = 0.0

    def to_hash(self) -> dict[str, str]:
        return {key: str(value) for key, value in asdict(self).items()}

    @classmethod
    def from_hash(cls, data: dict) -> "WorkerRecord":
        decoded = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                   for k, v in data.items()}
        values = {}
        for f in fields(cls):
            if f.name in decoded:
                raw = decoded[f.name]
                values[f.name] = int(float(raw)) if f.type == "int" else float(raw) if f.type == "float" else raw
        return cls(**values)


# Every call to Redis answers within this or fails with redis' TimeoutError (a RedisError, which the
# heartbeat, the pool's refresh, the live load and the online planner each log and retry): a server
# that stops answering without closing the connection (paused, or behind a silent network) costs a
# retry, never a call that waits forever. Every command pdserve sends is a short, non-blocking one.
REDIS_TIMEOUT_S = 5.0


def connect_redis(redis_url: str) -> aioredis.Redis:
    """pdserve's asyncio Redis client for `redis_url`, its connect and every call bounded by
    `REDIS_TIMEOUT_S`."""
    return aioredis.from_url(redis_url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)


class Registry:
    def __init__(self, redis_url: str, cluster: str):
        self.cluster = cluster
        self.redis = connect_redis(redis_url)

    async def heartbeat(self, record: WorkerRecord, ttl_s: float) -> None:
        """Writes the record and renews its lease for `ttl_s`."""
        key = worker_key(self.cluster, record.worker_id)
        stamped = record.to_hash() | {"updated_at_s": str(time.time())}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=stamped)
            pipe.pexpire(key, int(ttl_s * 1000))
            await pipe.execute()

    async def deregister(self, worker_id: str) -> None:
        await self.redis.delete(worker_key(self.cluster, worker_id))

    async def workers(self, role: Role | None = None) -> list[WorkerRecord]:
        keys = [key async for key in self.redis.scan_iter(match=worker_key(self.cluster, "*"), count=500)]
        if not keys:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hgetall(key)
            hashes = await pipe.execute()
        records = [WorkerRecord.from_hash(h) for h in hashes if h]
        return sorted((r for r in records if role is None or r.role == role), key=lambda r: r.worker_id)

    async def topology(self) -> str | None:
        """The topology published for the cluster (`pdserve.keys.topology_key`), unchecked; None when unset."""
        raw = await self.redis.get(topology_key(self.cluster))
        return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)

    async def set_topology(self, topology: Topology) -> None:
        """Publishes the topology every router places for (the online planner's switch)."""
        await self.redis.set(topology_key(self.cluster), topology)

    async def close(self) -> None:
        await self.redis.aclose()
