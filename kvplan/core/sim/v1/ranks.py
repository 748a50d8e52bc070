"""What a data-parallel rank driven by a router (kvplan.core.sim.v1.dp) hands back: its view when it yields, and its
finished requests as it goes (kvplan.core.sim.v1.dp.rank_sim)."""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.sim.v1.state import ReqState


class FinishedLog:
    """A routed rank's recorder: the rows in the order they finish (RequestRecords.write's place)."""

    __slots__ = ("log",)

    def __init__(self) -> None:
        self.log: list[int] = []

    def write(self, r: ReqState) -> None:
        self.log.append(r.index)


@dataclass(frozen=True, slots=True)
class View:
    """What a router sees of a rank when it yields: its queues and free blocks of ``capacity`` (the requests it
    finished: the rank's ``finished`` rows)."""

    waiting: int
    running: int
    free: int
    capacity: int
