"""Messages between ranks and the events/instructions of the pure state machines.

Messages are plain dataclasses. On the wire, pieces, signals and report parts travel as compact
tuples and other messages pickled (``canary.wire``); the ``array`` of a :class:`Piece` or
:class:`ReportPart` travels as a raw buffer when it is large (see ``canary.mpi_transport``).
Every message carries ``eid``, unique per sending rank, so a run can be traced.
Ranks: 0 is the controller, worker ``w`` (0-based) is rank ``w + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from canary.partition_map import PartitionMap

CONTROLLER = 0


def worker_rank(worker: int) -> int:
    """MPI rank of 0-based worker ``worker``."""
    return worker + 1


# ------------------------------------------------------------------ worker -> controller
@dataclass(slots=True)
class Hello:
    """First message of a worker: its program digest and statement list (to name a mismatch)."""

    eid: int
    worker: int
    digest: str
    statements: list[str]


@dataclass(slots=True)
class Done:
    """The worker reached the end of the program with no task left."""

    eid: int
    worker: int
    tasks_run: int
    messages_sent: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Failed:
    """A task failed on the worker; ``message`` names rank, stage, partition and traceback."""

    eid: int
    worker: int
    message: str


@dataclass(slots=True)
class ReportPart:
    """One partition of a reported dataset, for a report callback or the job's result."""

    eid: int
    seq: int
    stage: int
    iteration: tuple[int, ...]
    index: int
    array: np.ndarray
    tasks: int
    seconds: float = 0.0  # stamped by the controller's runtime on arrival


# ------------------------------------------------------------------ controller -> worker
@dataclass(slots=True)
class Placement:
    """A partition map (initial placement or update); newer entry versions win."""

    eid: int
    map: PartitionMap


@dataclass(slots=True)
class Shutdown:
    """Every worker is done: exit cleanly."""

    eid: int


@dataclass(slots=True)
class Abort:
    """The job cannot go on; every rank exits non-zero with ``reason``."""

    eid: int
    reason: str


# ------------------------------------------------------------------ worker -> worker
@dataclass(slots=True)
class Piece:
    """Scatter output from source partition ``src`` of stage instance ``seq``.

    ``dataset`` is the destination dataset's id; ``dsts`` are its destination partitions on the receiving worker that all get ``array``;
    ``versions[k]`` is the sender's map version of ``dsts[k]``'s entry (hold/forward rule).
    """

    eid: int
    seq: int
    dataset: int
    src: int
    dsts: tuple[int, ...]
    versions: tuple[int, ...]
    array: np.ndarray


@dataclass(slots=True)
class PieceBatch:
    """Several :class:`Piece` s of one stage instance for one worker, sent as one message.

    A worker sends its small pieces this way when the receiving gathers need every one of them
    anyway (a reduce): one send and one receive instead of one per source partition. The
    receiver handles ``pieces`` in order, exactly as if each had come alone.
    """

    eid: int
    pieces: tuple[Piece, ...]

    @property
    def seq(self) -> int:
        """The stage instance every piece belongs to (what a trace of the batch names)."""
        return self.pieces[0].seq


@dataclass(slots=True)
class Signal:
    """The value of signal stage instance ``seq``, broadcast by the worker that computed it."""

    eid: int
    seq: int
    value: bool


# ------------------------------------------------------------------ local events
@dataclass(slots=True)
class TaskDone:
    """The runtime ran ``task``; ``outputs`` are its validated results (kind-dependent)."""

    eid: int
    task: Any
    outputs: Any


@dataclass(slots=True)
class TaskFailed:
    eid: int
    task: Any
    message: str


# ------------------------------------------------------------------ instructions
@dataclass(slots=True)
class Send:
    """Send ``message`` to MPI rank ``dest``."""

    dest: int
    message: Any


@dataclass(slots=True)
class Callback:
    """Controller: call a report callback with ``event`` (on rank 0, outside the state)."""

    fn: Any
    event: Any


@dataclass(slots=True)
class Finish:
    """Controller: the job is complete."""


@dataclass(slots=True)
class Fail:
    """Controller: abort the job with ``reason`` (exit non-zero)."""

    reason: str
