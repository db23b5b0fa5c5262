"""What every worker queue policy queues (:class:`Item`) and the protocol they share.

Its own module so that the size-based policies (:mod:`canary.sched.hfsp`) and the simple ones
(:mod:`canary.sched.queues`) both build on it without importing each other both ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(slots=True)
class Item:
    """One queued unit of work.

    ``priority``: 0 is the most urgent level (strict priority serves lower
    numbers first).  ``cost``: service the item is expected to need, used by
    weighted fair queuing (1 means "count tasks").  ``job_tasks`` and
    ``size_hint`` feed the size-based policy (see :mod:`canary.sched.hfsp`).
    """

    job: int
    user: int = 0
    priority: int = 0
    cost: float = 1.0
    job_tasks: int = 1
    size_hint: float | None = None
    payload: Any = None


class WorkerQueue(Protocol):
    def push(self, item: Item, now: float) -> None: ...

    def pop(self, now: float) -> Item | None: ...

    def __len__(self) -> int: ...

    def task_finished(self, item: Item, now: float, duration: float) -> None: ...
