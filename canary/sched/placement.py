"""Placement of a job's tasks on workers (Sparrow, Ousterhout et al., SOSP 2013).

Every policy is a pure object modelled on Sparrow's ``TaskPlacer``: it never
touches the network or global state.  A scheduler asks the policy for a *plan*
for one job; the plan says which workers to probe (or where to put
reservations) and turns the probe replies into decisions.  Randomness comes
only from the :class:`numpy.random.Generator` passed to :meth:`plan`, so a run
with the same seed makes the same decisions.

Two plan shapes exist:

* :class:`EarlyBindingPlan` (random, per-task sampling, batch sampling):
  ``plan.probes`` are the workers to probe; ``plan.assign(loads)`` maps the
  probed queue lengths to one worker per task.
* :class:`LateBindingPlan` (batch sampling + late binding, constrained
  late binding): ``plan.reservations`` are the workers that get a reservation;
  a worker whose slot frees calls ``plan.request(worker)`` and receives a task
  index or ``None`` (Sparrow's "no task left" no-op).  Once every task is
  launched ``plan.cancellations()`` names the workers whose reservations are
  still outstanding so the scheduler can cancel them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "PLACEMENT_POLICIES",
    "BatchLateBinding",
    "BatchSampling",
    "ConstrainedPlan",
    "ConstrainedSampling",
    "EarlyBindingPlan",
    "LateBindingPlan",
    "PerTaskSampling",
    "RandomPlacement",
    "make_placement",
]


def _check_counts(num_tasks: int, num_workers: int) -> None:
    if num_tasks < 1:
        raise ValueError(f"a job needs at least one task, got num_tasks={num_tasks}")
    if num_workers < 1:
        raise ValueError(f"placement needs at least one worker, got num_workers={num_workers}")


#: the largest probe ratio: ceil(d m) probes a job, and far beyond Sparrow's 2 they only cost
#: (an infinite one crashed a pool's rank 0; 1e9 grew it to 3.6 GB before a job was placed)
MAX_PROBE_RATIO = 64.0


def _check_probe_ratio(d: float) -> float:
    if not 1 <= d <= MAX_PROBE_RATIO:  # also rejects NaN
        raise ValueError(f"probe ratio d must be between 1 and {MAX_PROBE_RATIO:g}, got d={d}")
    return float(d)


@dataclass
class EarlyBindingPlan:
    """Probes for one job plus the rule that turns replies into a placement.

    ``probes`` lists worker ids to probe (may be empty, may repeat for per-task
    sampling).  :meth:`assign` is deterministic given ``loads``: all the
    randomness (tie-breaking) was drawn when the plan was made.
    """

    num_tasks: int
    probes: np.ndarray
    mode: str
    d: int = 1
    _fixed: np.ndarray | None = None

    def assign(self, loads: np.ndarray | Sequence[int]) -> np.ndarray:
        """Return an int array of length ``num_tasks``: the worker of each task.

        ``loads[i]`` is the queue length reported by ``probes[i]``.  Raises
        ValueError if the number of loads differs from the number of probes or
        a load is negative.
        """
        if self._fixed is not None:
            return self._fixed.copy()
        lo = np.asarray(loads, dtype=np.int64)
        if lo.shape != self.probes.shape:
            raise ValueError(f"expected {self.probes.size} probe replies, got {lo.size}")
        if lo.size and lo.min() < 0:
            raise ValueError("a worker reported a negative load")
        if self.mode == "per-task":
            # Each task sees only its own d probes; the first least-loaded wins
            # (probes were shuffled at plan time, so that is a random tie-break).
            per = lo.reshape(self.num_tasks, self.d)
            best = np.argmin(per, axis=1)
            return self.probes.reshape(self.num_tasks, self.d)[np.arange(self.num_tasks), best]
        # Batch sampling: the m least-loaded probed workers, one task each.
        # Stable sort keeps the plan-time shuffle as the tie-break.
        order = np.argsort(lo, kind="stable")
        m = self.num_tasks
        if m <= lo.size:
            return self.probes[order[:m]]
        # Fewer probed workers than tasks (tiny clusters): water-fill, always
        # adding the next task to the currently least-loaded probed worker.
        cur = lo.copy()
        out = np.empty(m, dtype=np.int64)
        for t in range(m):
            i = int(np.argmin(cur))
            out[t] = self.probes[i]
            cur[i] += 1
        return out


class RandomPlacement:
    """Each task goes to a worker drawn uniformly at random (with replacement)."""

    name = "random"
    late_binding = False

    def plan(self, num_tasks: int, num_workers: int, rng: np.random.Generator) -> EarlyBindingPlan:
        """Plan with no probes; ``assign([])`` returns the random workers."""
        _check_counts(num_tasks, num_workers)
        fixed = rng.integers(0, num_workers, size=num_tasks, dtype=np.int64)
        return EarlyBindingPlan(num_tasks, np.empty(0, dtype=np.int64), "random", _fixed=fixed)


class PerTaskSampling:
    """Power of d choices per task: probe d workers, use the least loaded.

    The d probes of one task are distinct workers (all workers if d exceeds
    the cluster); probes of different tasks are independent.
    """

    name = "per-task"
    late_binding = False

    def __init__(self, d: int = 2) -> None:
        self.d = int(_check_probe_ratio(d))

    def plan(self, num_tasks: int, num_workers: int, rng: np.random.Generator) -> EarlyBindingPlan:
        _check_counts(num_tasks, num_workers)
        d = min(self.d, num_workers)
        if d == num_workers:
            probes = np.tile(np.arange(num_workers, dtype=np.int64), (num_tasks, 1))
            probes = rng.permuted(probes, axis=1)
        elif d == 1:
            probes = rng.integers(0, num_workers, size=(num_tasks, 1), dtype=np.int64)
        else:
            # Distinct within a task: redraw the (rare) rows with duplicates.
            probes = rng.integers(0, num_workers, size=(num_tasks, d), dtype=np.int64)
            while True:
                s = np.sort(probes, axis=1)
                bad = np.nonzero((s[:, 1:] == s[:, :-1]).any(axis=1))[0]
                if bad.size == 0:
                    break
                probes[bad] = rng.integers(0, num_workers, size=(bad.size, d), dtype=np.int64)
        return EarlyBindingPlan(num_tasks, probes.reshape(-1), "per-task", d=d)


def _batch_workers(
    num_tasks: int, num_workers: int, d: float, rng: np.random.Generator
) -> np.ndarray:
    """ceil(d*m) probe/reservation targets, distinct while the cluster allows.

    With more reservations than workers every worker gets ``r // n`` and a
    random ``r % n`` of them one more, as Sparrow's UnconstrainedTaskPlacer does.
    """
    r = math.ceil(d * num_tasks)
    if r <= num_workers:
        if r * 8 < num_workers:
            # Sparse draw: far cheaper than permuting 10,000 ids per job.
            picked = rng.choice(num_workers, size=r, replace=False, shuffle=True)
            return np.asarray(picked, dtype=np.int64)
        return rng.permutation(num_workers)[:r].astype(np.int64)
    base = np.repeat(np.arange(num_workers, dtype=np.int64), r // num_workers)
    extra = rng.permutation(num_workers)[: r % num_workers].astype(np.int64)
    return rng.permutation(np.concatenate([base, extra]))


class BatchSampling:
    """Probe ceil(d*m) distinct workers, place the m tasks on the m least loaded."""

    name = "batch"
    late_binding = False

    def __init__(self, d: float = 2) -> None:
        self.d = _check_probe_ratio(d)

    def plan(self, num_tasks: int, num_workers: int, rng: np.random.Generator) -> EarlyBindingPlan:
        _check_counts(num_tasks, num_workers)
        probes = np.unique(_batch_workers(num_tasks, num_workers, self.d, rng))
        # unique() sorts; reshuffle so the stable sort in assign breaks ties randomly.
        return EarlyBindingPlan(num_tasks, rng.permutation(probes), "batch")


@dataclass
class LateBindingPlan:
    """Reservations for one job; tasks are handed out on request (late binding).

    Guarantees: the first ``num_tasks`` calls to :meth:`request` return the task
    indices ``0..num_tasks-1`` in order; every later call returns ``None``.
    Each worker may request at most as many times as it holds reservations;
    more raises ValueError (a protocol error by the caller).
    """

    num_tasks: int
    reservations: np.ndarray
    _outstanding: dict[int, int] = field(default_factory=dict)
    _cancelled: set[int] = field(default_factory=set)
    _launched: int = 0

    def __post_init__(self) -> None:
        ws, cs = np.unique(self.reservations, return_counts=True)
        self._outstanding = dict(zip(ws.tolist(), cs.tolist()))

    @property
    def all_launched(self) -> bool:
        return self._launched >= self.num_tasks

    @property
    def launched(self) -> int:
        return self._launched

    def request(self, worker: int) -> int | None:
        """A worker with a free slot asks for work; return a task index or None.

        A worker whose reservations were cancelled but whose request crossed
        the cancellation on the wire gets None.  Any other request without a
        reservation raises ValueError.
        """
        left = self._outstanding.get(worker, 0)
        if left <= 0:
            if worker in self._cancelled:
                return None
            raise ValueError(f"worker {worker} holds no outstanding reservation for this job")
        if left == 1:
            del self._outstanding[worker]
        else:
            self._outstanding[worker] = left - 1
        if self._launched >= self.num_tasks:
            return None
        self._launched += 1
        return self._launched - 1

    def cancellations(self) -> list[int]:
        """Workers still holding reservations, once all tasks are launched.

        Returns an empty list while tasks remain unlaunched (reservations are
        still needed).  Calling it clears the outstanding set, so each worker
        is cancelled at most once.
        """
        if not self.all_launched:
            return []
        out = sorted(self._outstanding)
        self._cancelled.update(out)
        self._outstanding.clear()
        return out

    def outstanding(self, worker: int) -> int:
        return self._outstanding.get(worker, 0)


class BatchLateBinding:
    """Batch sampling with late binding: ceil(d*m) reservations, first m requests win."""

    name = "batch-late"
    late_binding = True

    def __init__(self, d: float = 2) -> None:
        self.d = _check_probe_ratio(d)

    def plan(self, num_tasks: int, num_workers: int, rng: np.random.Generator) -> LateBindingPlan:
        _check_counts(num_tasks, num_workers)
        return LateBindingPlan(num_tasks, _batch_workers(num_tasks, num_workers, self.d, rng))


@dataclass
class ConstrainedPlan:
    """Per-task sampling over each task's allowed workers, with shared probes.

    ``probes`` is the union of the workers sampled for all tasks (each probed
    once, as Sparrow shares probe information across a job's tasks).  For
    early binding :meth:`assign` gives every task the least-loaded probed
    worker it is allowed on, counting tasks already placed by this job.  For
    late binding each sampled (task, worker) pair is one reservation and
    :meth:`request` hands a requesting worker any unlaunched task allowed
    there, even one whose own probes went elsewhere.
    """

    allowed: list[frozenset[int]]
    probes: np.ndarray
    reservations: np.ndarray
    _unlaunched: list[int] = field(default_factory=list)
    _outstanding: dict[int, int] = field(default_factory=dict)
    _cancelled: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._unlaunched = list(range(len(self.allowed)))
        ws, cs = np.unique(self.reservations, return_counts=True)
        self._outstanding = dict(zip(ws.tolist(), cs.tolist()))

    @property
    def num_tasks(self) -> int:
        return len(self.allowed)

    @property
    def all_launched(self) -> bool:
        return not self._unlaunched

    def assign(self, loads: np.ndarray | Sequence[int]) -> np.ndarray:
        """Worker per task from probe replies (``loads[i]`` for ``probes[i]``)."""
        lo = np.asarray(loads, dtype=np.int64)
        if lo.shape != self.probes.shape:
            raise ValueError(f"expected {self.probes.size} probe replies, got {lo.size}")
        if lo.size and lo.min() < 0:
            raise ValueError("a worker reported a negative load")
        cur = dict(zip(self.probes.tolist(), lo.tolist()))
        out = np.empty(self.num_tasks, dtype=np.int64)
        for t, allowed in enumerate(self.allowed):
            cands = [w for w in self.probes.tolist() if w in allowed]
            best = min(cands, key=cur.__getitem__)  # probes order = random tie-break
            out[t] = best
            cur[best] += 1
        return out

    def request(self, worker: int) -> int | None:
        """Late binding: an unlaunched task allowed on ``worker``, else None."""
        left = self._outstanding.get(worker, 0)
        if left <= 0:
            if worker in self._cancelled:
                return None
            raise ValueError(f"worker {worker} holds no outstanding reservation for this job")
        if left == 1:
            del self._outstanding[worker]
        else:
            self._outstanding[worker] = left - 1
        for i, t in enumerate(self._unlaunched):
            if worker in self.allowed[t]:
                del self._unlaunched[i]
                return t
        return None

    def cancellations(self) -> list[int]:
        """Workers with outstanding reservations once every task launched (else [])."""
        if self._unlaunched:
            return []
        out = sorted(self._outstanding)
        self._cancelled.update(out)
        self._outstanding.clear()
        return out


class ConstrainedSampling:
    """Per-task sampling restricted to each task's allowed workers (Sparrow §4.3)."""

    name = "constrained"

    def __init__(self, d: int = 2) -> None:
        self.d = int(_check_probe_ratio(d))

    def plan(self, allowed: Sequence[Sequence[int]], rng: np.random.Generator) -> ConstrainedPlan:
        """Sample d allowed workers per task; raises ValueError on an empty set."""
        if len(allowed) < 1:
            raise ValueError("a job needs at least one task")
        sets: list[frozenset[int]] = []
        res: list[int] = []
        for t, a in enumerate(allowed):
            ws = np.unique(np.asarray(list(a), dtype=np.int64))
            if ws.size == 0:
                raise ValueError(f"task {t} has no allowed worker")
            if ws.min() < 0:
                raise ValueError(f"task {t} names a negative worker id")
            sets.append(frozenset(ws.tolist()))
            k = min(self.d, ws.size)
            res.extend(rng.choice(ws, size=k, replace=False).tolist())
        reservations = np.asarray(res, dtype=np.int64)
        probes = rng.permutation(np.unique(reservations))
        return ConstrainedPlan(sets, probes, reservations)


PLACEMENT_POLICIES = ("random", "per-task", "batch", "batch-late")


def make_placement(
    name: str, d: float = 2
) -> RandomPlacement | PerTaskSampling | BatchSampling | BatchLateBinding:
    """Build a placement policy by name; raises ValueError for unknown names or d<1."""
    _check_probe_ratio(d)
    if name == "random":
        return RandomPlacement()
    if name == "per-task":
        return PerTaskSampling(int(d))
    if name == "batch":
        return BatchSampling(d)
    if name == "batch-late":
        return BatchLateBinding(d)
    raise ValueError(
        f"unknown placement policy {name!r}; choose from {', '.join(PLACEMENT_POLICIES)}"
    )
