"""What the worker's state machine is made of: tasks, local partitions, fused stretches, and the
worker's own instruction :class:`RunTask`."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from canary.errors import CanaryError
from canary.messages import Instruction
from canary.program import Stage
from canary.sites import user_traceback

# Task kinds (a scatter-gather instance has scatter tasks and gather tasks).
K_LOAD = "load"
K_COMPUTE = "compute"
K_SCATTER = "scatter"
K_GATHER = "gather"
K_SIGNAL = "signal"
K_REPORT = "report"
K_FUSED = "fused"  # a stretch of compute stage instances run back to back (see Stretch)


class Task:
    """One task: stage instance ``seq`` (of ``stage``, at loop ``iteration``) on partition
    ``part``; ``tid`` is unique on its worker."""

    __slots__ = ("tid", "seq", "stage", "kind", "part", "iteration", "waiting", "pieces",
                 "accesses", "reads", "writes", "stretch")

    def __init__(self, tid: int, seq: int, stage: Stage, kind: str, part: int,
                 iteration: tuple[int, ...], accesses: tuple[tuple[Partition, int], ...] = (),
                 reads: tuple[Partition, ...] = (), writes: tuple[Partition, ...] = ()) -> None:
        self.tid = tid
        self.seq = seq
        self.stage = stage
        self.kind = kind
        self.part = part
        self.iteration = iteration
        self.waiting = len(accesses)
        self.pieces: dict[int, np.ndarray] | None = None
        # Shared per-(stage, kind, partition) tables, built once (see AccessQueues._plan).
        self.accesses = accesses  # (partition, READ/WRITE) in grant order
        self.reads = reads  # the partitions whose values are the task's arguments
        self.writes = writes  # the partitions its outputs replace (compute, load)
        self.stretch: Stretch | None = None  # K_FUSED only

    def label(self) -> str:
        if self.stretch is not None:
            return self.stretch.describe()
        return f"{self.stage.label(self.iteration)}, {self.kind} task on partition {self.part}"

    def __repr__(self) -> str:
        return f"Task({self.tid}, seq={self.seq}, {self.stage.name}/{self.kind}[{self.part}])"


def failure_text(rank: int, worker: int, label: str, exc: BaseException) -> str:
    """What a failed task says: where (rank, worker, the task's ``label``), then the user
    code's traceback, or only the message of canary's own errors, whose frames would say
    nothing to the user; the traceback begins at the user's code, not at the runtime that
    called it (:func:`canary.sites.user_traceback`)."""
    why = str(exc) if isinstance(exc, CanaryError) else user_traceback(exc)
    return f"{task_place(rank, worker, label)} failed:\n{why}"


def task_place(rank: int, worker: int, label: str) -> str:
    """How a failed task's message begins: ``rank R (worker W): LABEL``. Not
    :func:`canary.ranks.role`: in a pool, a job's worker W need not be rank W + 1."""
    return f"rank {rank} (worker {worker}): {label}"


class Partition:
    """A local partition of one dataset and its access metadata: the last stage instance that
    finished an access (``last_seq``), the accesses waiting for it in program order
    (``queue``), those granted (``readers``, ``writer``), and ``frozen`` ("spawn nothing on
    it": a partition about to move)."""

    __slots__ = ("dataset", "index", "value", "last_seq", "queue", "readers", "writer", "frozen")

    def __init__(self, dataset: int, index: int) -> None:
        self.dataset = dataset
        self.index = index
        self.value: np.ndarray | None = None
        self.last_seq = -1
        self.queue: deque[tuple[Task, int]] = deque()
        self.readers = 0
        self.writer = False
        self.frozen = False


class Stretch:
    """What a fused task runs: compute stage ``instances`` ``(stage, seq, iteration)`` in program
    order, on every local partition index in ``idxs`` of one co-location group.

    ``parts[k]`` maps a dataset id to this worker's :class:`Partition` of index ``idxs[k]``, for
    every dataset the instances touch. Compute stages read and write only same-index partitions,
    so running all instances on one index, then the next index, gives the same result as program
    order; the fused task holds a write access on every partition, so nothing else touches them
    meanwhile. ``tasks`` is the number of ordinary tasks this stands for; ``limited`` whether
    the worker's size limit, not the program's next communication, ended the stretch.
    """

    __slots__ = ("instances", "idxs", "parts", "tasks", "written", "limited")

    def __init__(self, instances: list[tuple[Stage, int, tuple[int, ...]]], idxs: list[int],
                 parts: list[dict[int, Partition]], limited: bool = False) -> None:
        self.instances = instances
        self.limited = limited
        self.idxs = idxs
        self.parts = parts
        self.tasks = len(instances) * len(idxs)
        self.written = sorted({d.id for st, _, _ in instances for d in st.writes})

    def describe(self) -> str:
        first, last = self.instances[0], self.instances[-1]
        return (f"fused stretch of {len(self.instances)} compute stage instance(s) "
                f"(seq {first[1]}..{last[1]}) on partitions {self.idxs}")


class RunTask(Instruction):
    """Worker: run ``task`` now, then feed the state its ``TaskDone`` (or ``TaskFailed``).

    The state hands out one task at a time (a worker rank is one core): the next comes with the
    instructions of that ``TaskDone``. ``WorkerState.task_call`` says what to call. Equal to
    another RunTask of the same task (id, stage instance, kind, partition) and cause; ``tid``,
    ``seq``, ``stage`` (its name), ``kind`` and ``part`` can be matched
    (``RunTask.match(kind="load", part=1)``).
    """

    __slots__ = ("task", "cause")

    def __init__(self, task: Task, cause: int = 0) -> None:
        self.task = task
        self.cause = cause

    @property
    def tid(self) -> int:
        return self.task.tid

    @property
    def seq(self) -> int:
        return self.task.seq

    @property
    def stage(self) -> str:
        return self.task.stage.name

    @property
    def kind(self) -> str:
        return self.task.kind

    @property
    def part(self) -> int:
        return self.task.part

    def _key(self) -> tuple[Any, ...]:
        t = self.task
        return (t.tid, t.seq, t.stage.id, t.kind, t.part, self.cause)

    def __eq__(self, other: object) -> Any:
        if type(other) is not RunTask:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"RunTask({self.task!r}, cause={self.cause})"


def is_urgent(task: Task, max_bytes: int) -> bool:
    """Whether ``task`` should run before the compute tasks already queued: a signal, or a
    scatter whose source arrays total at most ``max_bytes``.

    A reduce's small piece then leaves right after its partition's kernel instead of after every
    other queued kernel, and the worker that can do nothing until the last piece is in waits
    that much less. Large pieces (PageRank's mirror blocks, MBs) are not hurried: moving them is
    bandwidth-bound anyway, and sending them early keeps more of them alive at once.
    """
    kind = task.kind
    if kind is K_SIGNAL:
        return True
    if kind is not K_SCATTER:
        return False
    size = 0
    for p in task.reads:
        v = p.value
        size += v.nbytes if isinstance(v, np.ndarray) else max_bytes + 1
    return size <= max_bytes
