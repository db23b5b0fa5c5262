"""Messages, events and instructions of a pool of workers shared by several jobs.

A pool rank carries the messages of many jobs; on the wire each travels with its job's id
(:class:`Envelope`), so that a job's pieces, signals, reports and ``Done``s only ever reach
that job's own :class:`~canary.worker.state.WorkerState` and
:class:`~canary.controller.state.ControllerState`. Job ids start at 1; id 0 marks the pool's
own messages (placement, job start and end, the drivers' broadcasts).

Inside a job the engine's ranks are the job's own: 0 is the job's controller (always pool
rank 0), job worker ``w`` is job rank ``w + 1``, and :attr:`JobStart.ranks` says which pool
rank each job worker is. Every message and event carries ``eid``; every instruction ``cause``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from canary.errors import JobAborted
from canary.messages import Callback, Instruction, Message, _fields_equal

POOL = 0  # the job id of the pool's own messages


@dataclass(frozen=True)
class JobSpec:
    """What a submitter asked for: the driver and its arguments, and how the job is shared.

    ``priority``: 0 is the most urgent level. ``weight`` (> 0) is the fair share of the
    job's ``user`` (the latest job of a user sets it). ``workers``: the most workers the job
    may spread over (0: every worker of the pool).
    """

    script: str = ""
    args: tuple[str, ...] = ()
    user: str = ""
    priority: int = 0
    weight: float = 1.0
    workers: int = 0
    cwd: str = ""


@dataclass(slots=True)
class Envelope(Message):
    """Message ``message`` of job ``job`` (its own ``eid`` is the event's)."""

    job: int
    message: Any

    @property
    def eid(self) -> int:
        return int(self.message.eid)


# ---------------------------------------------------------------- controller -> worker
@dataclass(slots=True)
class Probe(Message):
    """Early binding: how loaded is this worker? (answered by :class:`ProbeReply`)."""

    eid: int
    job: int


@dataclass(slots=True)
class Reserve(Message):
    """Late binding: queue a reservation for ``job`` under the worker's queue policy; when it
    reaches the front, ask for the job (:class:`Request`)."""

    eid: int
    job: int
    spec: JobSpec


@dataclass(slots=True)
class Unreserve(Message):
    """The job needs no more workers (or was cancelled): drop its reservation here."""

    eid: int
    job: int


@dataclass(slots=True)
class JobStart(Message):
    """Run ``job`` here as its worker ``index``; ``ranks[w]`` is job worker ``w``'s pool rank."""

    eid: int
    job: int
    index: int
    ranks: tuple[int, ...]
    spec: JobSpec


@dataclass(slots=True)
class JobEnd(Message):
    """The job ended before its workers were told by its own controller (its driver on rank 0
    failed or returned before ``canary.run``, or it was cancelled before it was declared).
    ``reason`` None: every driver exited with status 0 without declaring a program."""

    eid: int
    job: int
    reason: str | None


@dataclass(slots=True)
class Bcast(Message):
    """The value rank 0's driver broadcast on its job communicator (``comm.bcast``)."""

    eid: int
    job: int
    value: Any


@dataclass(slots=True)
class StopPool(Message):
    """Every job is over: leave."""

    eid: int


# ---------------------------------------------------------------- worker -> controller
@dataclass(slots=True)
class ProbeReply(Message):
    """A probed worker's load: jobs running there plus reservations queued."""

    eid: int
    job: int
    worker: int
    load: int


@dataclass(slots=True)
class Request(Message):
    """A reservation for ``job`` reached the front of ``worker``'s queue: may it run the job?"""

    eid: int
    job: int
    worker: int


@dataclass(slots=True)
class DriverEnded(Message):
    """The job cannot go on here: the driver on this rank (``worker``; -1 on rank 0) ended
    before the job did, or the job's state failed. ``message`` says why. ``clean``: the driver
    exited with status 0 before it declared a program (``--help``): the job may have none."""

    eid: int
    job: int
    worker: int
    message: str
    clean: bool = False


# ---------------------------------------------------------------- local events
@dataclass(slots=True)
class Submit(Message):
    """(rank 0) A job was submitted."""

    eid: int
    job: int
    spec: JobSpec


@dataclass(slots=True)
class Cancel(Message):
    """(rank 0) End ``job`` now, with ``reason``."""

    eid: int
    job: int
    reason: str = "cancelled"


@dataclass(slots=True)
class Declared(Message):
    """The job's driver on this rank called ``canary.run`` with ``program``."""

    eid: int
    job: int
    program: Any


# ---------------------------------------------------------------- instructions
@dataclass(slots=True, eq=False)
class StartDriver(Instruction):
    """Start the job's driver on this rank as rank ``rank`` of a communicator of ``size``."""

    job: int
    rank: int
    size: int
    spec: JobSpec
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class RunJobTask(Instruction):
    """Run ``task`` of ``job`` now and feed back its ``TaskDone``/``TaskFailed`` in an
    :class:`Envelope`. At most one is outstanding per worker: the queue policy chose it."""

    job: int
    task: Any
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class YieldJob(Instruction):
    """Send what came before, then feed ``Envelope(job, Resume(...))``."""

    job: int
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class Release(Instruction):
    """The job is over on this rank: its driver's ``canary.run`` returns (``error`` None) or
    raises ``error(reason)``; on rank 0 it returns ``result``."""

    job: int
    reason: str | None = None
    error: type = JobAborted
    result: Any = None
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class JobCallback(Instruction):
    """Rank 0: call the job's report callback, ``callback`` (the job's own controller's
    instruction, with the driver line of its report: run it with
    :func:`canary.messages.run_callback`)."""

    job: int
    callback: Callback
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class JobNote(Instruction):
    """Rank 0: a line for the job's log (placement, a stall)."""

    job: int
    line: str
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True)
class JobInfo:
    """What rank 0 knows of a job, for ``canary jobs``."""

    job: int
    spec: JobSpec
    state: str = "placing"  # placing, running, ended
    workers: tuple[int, ...] = ()
    iteration: int = -1  # loop passes reached, as the job's reports show (-1: none reported)
    reason: str | None = None
    reports: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
