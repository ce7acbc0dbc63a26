"""Transfer faults injected on purpose: for tests and the `bench/` chaos runs, never for production.

A `FaultPlan` is plain data: which faults, triggered on the n-th transfer of a side or with a
probability per transfer, drawn from a seed. `FaultPlan.decide` is a pure function of the plan and
the transfer's index, so a test names exactly which pull breaks. A `FaultInjector` counts the
transfers of one side (producer or consumer) and asks the plan; the transports consult it at their
send and receive points (`kv_transfer.transports`) through `next_fault()`, the one narrow door.
Without a plan there is no injector (`None`), and the transports pay one `is None` test.

The faults, each at the side that can cause it:

    producer  drop_connection_mid_block  sends the SENDING header and half the bytes (mid-block),
                                         then closes; one-sided (shm): closes instead of replying
    producer  producer_silent            never answers; waits for the consumer to give up and close
    consumer  flip_bytes                 flips one byte of what it received or copied, before the
                                         checksum is taken over it
    consumer  stall_reader               stops reading for `stall_s` halfway through the bytes (the
                                         producer's send then times out and it drops the connection)

Every one of them must end in a load error (vLLM recomputes) or a clean `TransferError` within the
transfer timeout, with no lease left pinned and no flipped byte reported loaded.

Processes get a plan through `ConnectorConfig.fault_plan`, which the environment variable
`FAULTS_ENV` fills at the config's entry point (`ConnectorConfig.from_extra`), loudly logged: the
text form is `kind@n` (the n-th transfer) or `kind~p` (probability p), comma-separated, with an
optional `seed=N` and `stall_s=S`, e.g. `flip_bytes@1,producer_silent~0.1,seed=7`.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Literal, get_args

FaultKind = Literal["drop_connection_mid_block", "flip_bytes", "stall_reader", "producer_silent"]
Side = Literal["producer", "consumer"]
KINDS: tuple[str, ...] = get_args(FaultKind)
SIDE_OF: dict[str, Side] = {"drop_connection_mid_block": "producer", "producer_silent": "producer",
                            "flip_bytes": "consumer", "stall_reader": "consumer"}
FAULTS_ENV = "PDSERVE_TEST_ONLY_KV_FAULTS"   # tests and chaos runs only; see the module docstring


@dataclass(frozen=True)
class FaultRule:
    """One fault: on the `nth` transfer of its side (1-based), or, with `nth` 0, on each transfer
    with `probability`."""

    kind: FaultKind
    nth: int = 0
    probability: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}: choose one of {', '.join(KINDS)}")
        if self.nth < 0 or not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"fault {self.kind}: nth must be >= 1 (or 0 with a probability in [0, 1]), "
                             f"got nth={self.nth}, probability={self.probability}")
        if (self.nth == 0) == (self.probability == 0.0):
            raise ValueError(f"fault {self.kind}: give exactly one trigger, `nth` or `probability`")

    @property
    def side(self) -> Side:
        return SIDE_OF[self.kind]


@dataclass(frozen=True)
class Fault:
    """A decision: this transfer gets `kind`. `fraction` in [0, 1) says where in the bytes it
    strikes (the flipped byte, the byte the drop or stall happens at), `stall_s` how long a stall lasts."""

    kind: FaultKind
    fraction: float
    stall_s: float


@dataclass(frozen=True)
class FaultPlan:
    rules: tuple[FaultRule, ...] = ()
    seed: int = 0
    stall_s: float = 2.0

    def __post_init__(self) -> None:
        if self.stall_s <= 0:
            raise ValueError(f"stall_s must be positive seconds, not {self.stall_s}")

    def __bool__(self) -> bool:
        return bool(self.rules)

    def decide(self, side: Side, index: int) -> Fault | None:
        """The fault of the `index`-th transfer (1-based) of `side`, or None; the first rule of that
        side that fires wins. Pure: the same plan, side and index always decide alike."""
        for number, rule in enumerate(self.rules):
            if rule.side != side:
                continue
            fires = rule.nth == index if rule.nth else _uniform(self.seed, side, index, number, "fire") < rule.probability
            if fires:
                return Fault(rule.kind, _uniform(self.seed, side, index, number, "where"), self.stall_s)
        return None

    @classmethod
    def parse(cls, text: str) -> "FaultPlan":
        """`kind@n` / `kind~p` items, `seed=N`, `stall_s=S`, comma-separated ("" is no plan)."""
        rules, seed, stall_s = [], 0, 2.0
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            try:
                if item.startswith("seed="):
                    seed = int(item.removeprefix("seed="))
                elif item.startswith("stall_s="):
                    stall_s = float(item.removeprefix("stall_s="))
                elif "@" in item:
                    kind, nth = item.split("@", 1)
                    rules.append(FaultRule(kind, nth=int(nth)))
                elif "~" in item:
                    kind, probability = item.split("~", 1)
                    rules.append(FaultRule(kind, probability=float(probability)))
                else:
                    raise ValueError("expected kind@n, kind~p, seed=N or stall_s=S")
            except ValueError as error:
                raise ValueError(f"bad fault plan item {item!r} in {text!r}: {error}") from None
        return cls(tuple(rules), seed, stall_s)


def _uniform(seed: int, side: str, index: int, rule: int, purpose: str) -> float:
    """A number in [0, 1) fixed by its arguments (no shared random state between threads)."""
    digest = hashlib.blake2b(f"{seed}/{side}/{index}/{rule}/{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class FaultInjector:
    """One side's counter of transfers over a plan. Thread-safe."""

    def __init__(self, plan: FaultPlan, side: Side):
        self.plan, self.side = plan, side
        self._count = 0
        self._lock = threading.Lock()
        self.fired: list[tuple[int, FaultKind]] = []   # (transfer index, kind), for tests and logs

    def next_fault(self) -> Fault | None:
        """Counts one transfer of this side; the fault it gets, if any."""
        with self._lock:
            self._count += 1
            fault = self.plan.decide(self.side, self._count)
            if fault is not None:
                self.fired.append((self._count, fault.kind))
            return fault


def injector(plan: FaultPlan | None, side: Side) -> FaultInjector | None:
    """An injector for `side` when `plan` has rules for it, else None (no cost at all)."""
    if plan is None or not any(rule.side == side for rule in plan.rules):
        return None
    return FaultInjector(plan, side)


__all__ = ["FAULTS_ENV", "Fault", "FaultInjector", "FaultKind", "FaultPlan", "FaultRule", "KINDS", "injector"]
