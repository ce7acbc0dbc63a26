"""Several servers measured as one: request i goes to server i mod n (client-side round robin,
no proxy process, so it adds no hop and no scheduling of its own).

Used to measure independent engines side by side, e.g. two colocated 1-core vLLM servers against
one 2-core server and against disaggregation. `open` opens every member (any failure closes the
ones already open and propagates); `close` closes all of them.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence

from loadgen.prompts import Prompt
from loadgen.targets.base import Delta, Target


class RoundRobinTarget:
    def __init__(self, members: Sequence[Target]) -> None:
        if not members:
            raise ValueError("round robin needs at least one target")
        self.members = tuple(members)
        self.name = f"round-robin({len(self.members)} x {self.members[0].name})"
        self._turn = itertools.cycle(range(len(self.members)))

    async def open(self) -> None:
        opened: list[Target] = []
        try:
            for member in self.members:
                await member.open()
                opened.append(member)
        except BaseException:
            for member in opened:
                await member.close()
            raise

    async def close(self) -> None:
        for member in self.members:
            await member.close()

    def generate(self, prompt: Prompt) -> AsyncIterator[Delta]:
        return self.members[next(self._turn)].generate(prompt)
