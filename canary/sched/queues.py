"""Worker queue policies: which queued item a free slot serves next.

A worker keeps one queue object; items are tasks (early binding) or
reservations (late binding).  Every policy implements the same small protocol:

* ``push(item, now)`` -- enqueue; O(1) or O(log n).
* ``pop(now)`` -- remove and return the next item, or ``None`` when empty.
* ``len(queue)`` -- number of queued items.
* ``task_finished(item, now, duration)`` -- feedback used by size-based
  policies (a no-op for the others).

Policies hold no randomness and no global state: the same pushes and pops in
the same order always give the same decisions.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Any

from canary.sched.hfsp import HfspQueue
from canary.sched.item import Item, WorkerQueue

__all__ = [
    "QUEUE_POLICIES",
    "FifoQueue",
    "Item",
    "PriorityQueue",
    "WeightedFairQueue",
    "WorkerQueue",
    "make_queue",
]


class FifoQueue:
    """First in, first out."""

    name = "fifo"

    def __init__(self) -> None:
        self._q: deque[Item] = deque()

    def push(self, item: Item, now: float) -> None:
        self._q.append(item)

    def pop(self, now: float) -> Item | None:
        return self._q.popleft() if self._q else None

    def __len__(self) -> int:
        return len(self._q)

    def task_finished(self, item: Item, now: float, duration: float) -> None:
        pass


class PriorityQueue:
    """Strict priorities: one FIFO per level, the lowest level number first.

    A lower-priority item is served only when every higher level is empty;
    items of one level keep their arrival order.  Levels must be integers
    >= 0 (ValueError otherwise).
    """

    name = "priority"

    def __init__(self) -> None:
        self._levels: dict[int, deque[Item]] = {}
        self._heap: list[int] = []  # non-empty levels, for O(log L) pop
        self._n = 0

    def push(self, item: Item, now: float) -> None:
        if item.priority < 0:
            raise ValueError(f"priority levels are >= 0, got {item.priority}")
        q = self._levels.get(item.priority)
        if q is None:
            q = self._levels[item.priority] = deque()
        if not q:
            heapq.heappush(self._heap, item.priority)
        q.append(item)
        self._n += 1

    def pop(self, now: float) -> Item | None:
        if not self._heap:
            return None
        lvl = self._heap[0]
        q = self._levels[lvl]
        item = q.popleft()
        if not q:
            heapq.heappop(self._heap)
        self._n -= 1
        return item

    def __len__(self) -> int:
        return self._n

    def task_finished(self, item: Item, now: float, duration: float) -> None:
        pass

    def discard(self, job: int) -> int:
        """Drop every queued item of ``job`` (a job that ended); the others keep their order.
        Returns how many were dropped."""
        dropped = 0
        for lvl, q in self._levels.items():
            kept = deque(it for it in q if it.job != job)
            dropped += len(q) - len(kept)
            self._levels[lvl] = kept
        self._heap = [lvl for lvl, q in self._levels.items() if q]
        heapq.heapify(self._heap)
        self._n -= dropped
        return dropped


@dataclass(slots=True, eq=False)
class _Queued:
    """An item in a :class:`WeightedFairQueue` charged by cost, and what its push charged."""

    item: Item
    seq: int  # push order
    charge: float  # what its push added to its user's finish tag
    dropped: bool = False


class WeightedFairQueue:
    """Weighted fair sharing across users (start-time fair queuing).

    Each user has a FIFO; an item of user u gets start tag
    ``S = max(V, F_u)`` and finish tag ``F_u = S + cost / w_u``; pop serves the
    smallest start tag and sets the virtual time ``V`` to it.  While users are
    backlogged each gets service proportional to its weight; a user that was
    idle restarts at ``V`` and so gains no credit for the idle time.  O(log n)
    per push/pop.  ``weights`` maps user -> weight (> 0, ValueError otherwise);
    users not named get ``default_weight``.

    ``charge="cost"`` (the default) charges each item its ``cost``, known when it is pushed.
    ``charge="measured"`` charges what the item really took: ``task_finished(item, now,
    duration)`` moves the user's finish tag by ``(duration - item.cost) / w``, so ``cost``
    is only an estimate for ordering the items pushed before it finished (a pool's worker
    knows a task's seconds only once it ran).

    Charged by cost, a user's queued items follow one another without a gap: each starts where
    the one before it ends, the first no earlier than ``V``. So only each user's first item is
    kept by tag, the others in push order, and :meth:`discard` costs the items it drops, not
    the length of the queue. Charged as measured, a finished item moves its user's finish tag
    and the next push may start before items already queued, so every item is kept by its tag.
    """

    name = "fair"

    def __init__(
        self, weights: dict[int, float] | None = None, default_weight: float = 1.0,
        charge: str = "cost",
    ) -> None:
        if charge not in ("cost", "measured"):
            raise ValueError(f"charge is 'cost' or 'measured', got {charge!r}")
        self.charge = charge
        self.weights = dict(weights or {})
        for u, w in [*self.weights.items(), (-1, default_weight)]:
            if not w > 0:
                raise ValueError(f"weights must be > 0, got {w} for user {u}")
        self.default_weight = default_weight
        # charge="measured": (start tag, push order, item, what its push added to its user's
        # finish tag)
        self._heap: list[tuple[float, int, Item, float]] = []
        # charge="cost": each user's queued items in push order, its first one not dropped (a
        # dropped one stays in place until it comes first); each user's first item's (start
        # tag, push order), and those in a heap with the user, where stale ones are skipped;
        # each job's queued items, for discard
        self._chains: dict[int, deque[_Queued]] = {}
        self._first: dict[int, tuple[float, int]] = {}
        self._firsts: list[tuple[float, int, int]] = []
        self._of_job: dict[int, list[_Queued]] = {}
        self._queued = 0
        self._finish: dict[int, float] = {}
        self._v = 0.0
        self._seq = 0

    def push(self, item: Item, now: float) -> None:
        if item.cost < 0:
            raise ValueError(f"item cost must be >= 0, got {item.cost}")
        w = self.weights.get(item.user, self.default_weight)
        start = max(self._v, self._finish.get(item.user, 0.0))
        self._finish[item.user] = start + item.cost / w
        self._seq += 1
        if self.charge == "measured":
            heapq.heappush(self._heap, (start, self._seq, item, item.cost / w))
            return
        queued = _Queued(item, self._seq, item.cost / w)
        chain = self._chains.setdefault(item.user, deque())
        if not chain:
            self._set_first(item.user, start, self._seq)
        # else it starts where the user's queued items end: at its finish tag, as computed
        chain.append(queued)
        self._of_job.setdefault(item.job, []).append(queued)
        self._queued += 1

    def pop(self, now: float) -> Item | None:
        if self.charge == "measured":
            if not self._heap:
                return None
            start, _, item, _ = heapq.heappop(self._heap)
            self._v = start
            return item
        while self._firsts:
            start, seq, user = heapq.heappop(self._firsts)
            if self._first.get(user) != (start, seq):
                continue
            queued = self._chains[user].popleft()
            of_job = self._of_job[queued.item.job]
            of_job.remove(queued)
            if not of_job:
                del self._of_job[queued.item.job]
            self._queued -= 1
            self._v = start
            self._next_first(user, start + queued.charge)
            return queued.item
        return None

    def _set_first(self, user: int, start: float, seq: int) -> None:
        self._first[user] = (start, seq)
        heapq.heappush(self._firsts, (start, seq, user))

    def _next_first(self, user: int, start: float) -> None:
        """The user's first item is gone: the next one not dropped comes first, at ``start``."""
        chain = self._chains[user]
        while chain and chain[0].dropped:
            chain.popleft()
        if chain:
            self._set_first(user, start, chain[0].seq)
        else:
            del self._chains[user], self._first[user]

    def __len__(self) -> int:
        return len(self._heap) if self.charge == "measured" else self._queued

    def task_finished(self, item: Item, now: float, duration: float) -> None:
        if self.charge == "measured" and item.user in self._finish:
            w = self.weights.get(item.user, self.default_weight)
            self._finish[item.user] += (max(duration, 0.0) - item.cost) / w

    def release(self, item: Item, now: float) -> None:
        """``item``, popped, ran nothing (a late-binding reservation answered with no task): what
        its push charged comes off its user's finish tag, and that user's queued items all move
        forward by as much, or less so that none goes before the virtual time ``V`` (the finish
        tag then by as little). Every other user's items keep their tags."""
        # Why: charged, every reservation that found its job's tasks gone cost its user a turn
        # (2-3% of the reservations in the fair-share experiment), more for users whose jobs
        # had more reservations than tasks left.
        user = item.user
        charge = item.cost / self.weights.get(user, self.default_weight)
        if user not in self._finish or charge == 0.0:
            return
        # the user's queued items all move by one amount, so they keep their order and spacing
        # and its next push still comes after them: the first goes back by the charge, to V
        # at most, and the finish tag by as much
        if self.charge == "measured":
            starts = [start for start, _, it, _ in self._heap if it.user == user]
            shift = charge if not starts else min(charge, min(starts) - self._v)
            if starts:
                self._heap = [(start - shift, seq, it, c) if it.user == user
                              else (start, seq, it, c) for start, seq, it, c in self._heap]
                heapq.heapify(self._heap)
        elif user in self._first:
            start, seq = self._first[user]
            shift = min(charge, start - self._v)
            self._set_first(user, start - shift, seq)
        else:
            shift = charge
        self._finish[user] -= shift

    def discard(self, job: int) -> int:
        """Drop every queued item of ``job`` (a job that ended) and release what they were
        charged; returns how many were dropped.

        A dropped item never ran, so the ``cost / w`` its push added comes off its user's
        finish tag, and that user's items pushed after it move forward by as much (their tags
        were stacked behind it), each no earlier than the current virtual time ``V``: the tags
        are those the user's items would have had were the dropped ones never pushed, except
        that none goes back before ``V`` (``V`` never decreases). Every other user's items keep
        their tags (popping and pushing them again would charge each its cost a second time).
        An item already popped stays charged: it holds the core until it ends, cancelled or
        not.
        """
        # Why: left charged, each cancel of a job with a task queued cost its user one task's
        # turn; under churn the users whose jobs were cancelled more fell below their weights.
        if self.charge == "cost":
            return self._discard_from_chains(job)
        entries = sorted(self._heap, key=lambda e: e[1])  # push order: a user's chain of tags
        back: dict[int, float] = {}  # user -> charge of its items dropped so far in the walk
        kept: list[tuple[float, int, Item, float]] = []
        for start, seq, item, charge in entries:
            user = item.user
            if item.job == job:
                back[user] = back.get(user, 0.0) + charge
                continue
            if user in back:
                start = max(self._v, start - back[user])
            kept.append((start, seq, item, charge))
        for user, released in back.items():
            # a finish tag below V is harmless: the user's next push starts at max(V, F_u)
            self._finish[user] -= released
        heapq.heapify(kept)
        self._heap = kept
        return len(entries) - len(kept)

    def _discard_from_chains(self, job: int) -> int:
        # A dropped item is skipped when the items before it are popped, so the ones after it
        # start that much earlier; none can go before V, as the chain starts no earlier.
        dropped = self._of_job.pop(job, [])
        for queued in dropped:
            queued.dropped = True
            self._finish[queued.item.user] -= queued.charge
        self._queued -= len(dropped)
        for user in {queued.item.user for queued in dropped}:
            if self._chains[user][0].dropped:
                self._next_first(user, self._first[user][0])
        return len(dropped)


QUEUE_POLICIES = ("fifo", "priority", "fair", "hfsp")


def make_queue(name: str, **kwargs: Any) -> WorkerQueue:
    """Build a worker queue by name; raises ValueError for an unknown name."""
    if name == "fifo":
        return FifoQueue()
    if name == "priority":
        return PriorityQueue()
    if name == "fair":
        return WeightedFairQueue(**kwargs)
    if name == "hfsp":
        return HfspQueue(**kwargs)
    raise ValueError(f"unknown queue policy {name!r}; choose from {', '.join(QUEUE_POLICIES)}")
