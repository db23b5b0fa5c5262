"""Messages between ranks and the events/instructions of the pure state machines.

Messages are plain dataclasses. On the wire, pieces, signals and report parts travel as compact
tuples and other messages pickled (``canary.wire``); the ``array`` of a :class:`Piece` or
:class:`ReportPart` travels as a raw buffer when it is large (see ``canary.mpi_transport``).
Every message and every event carries ``eid``, unique per rank (a message's is its sender's), and
every instruction carries ``cause``, the ``eid`` of the event whose handling produced it, so a run
can be traced from any decision back to what caused it. Instructions compare by value; in a test,
``Send.match(dest=1)`` stands for any :class:`Send` to rank 1 (see :meth:`Instruction.match`).
Ranks: 0 is the controller, worker ``w`` (0-based) is rank ``w + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from canary.errors import JobAborted

if TYPE_CHECKING:
    from canary.partition_map import PartitionMap

CONTROLLER = 0


def worker_rank(worker: int) -> int:
    """MPI rank of 0-based worker ``worker``."""
    return worker + 1


def local_event_id(rank: int, n: int) -> int:
    """The ``eid`` of the ``n``-th local event (a task finished, a resume) on ``rank``: unique
    per rank and never equal to the ``eid`` of a message the rank sends."""
    return (rank << 40) | (1 << 39) | n


def same_value(a: Any, b: Any) -> bool:
    """Equality for message fields: arrays equal in dtype, shape and every element."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and bool(np.array_equal(a, b)))
    return bool(a == b)


def _fields_equal(a: Any, b: Any) -> Any:
    if type(a) is not type(b):
        return NotImplemented  # lets a Instruction.match(...) on the other side decide
    return all(same_value(getattr(a, f), getattr(b, f)) for f in a.__slots__)


class Matchable:
    """:meth:`match`, for tests that compare whole lists of instructions or messages."""

    __slots__ = ()

    @classmethod
    def match(cls, **fields: Any) -> Any:
        """An object equal to every instance of this class whose ``fields`` have these values
        (others not compared): ``out == [RunTask.match(kind="load"), Send.match(dest=0)]``."""
        return _Match(cls, fields)


class Message(Matchable):
    """Base of the messages between ranks and of the events fed to the state machines."""

    __slots__ = ()


class Instruction(Matchable):
    """Base of the state machines' instructions: equal by value."""

    __slots__ = ()


class _Match:
    __slots__ = ("cls", "fields")

    def __init__(self, cls: type, fields: dict[str, Any]) -> None:
        self.cls = cls
        self.fields = fields

    def __eq__(self, other: object) -> bool:
        return isinstance(other, self.cls) and all(
            same_value(getattr(other, k), v) for k, v in self.fields.items())

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.fields.items())
        return f"{self.cls.__name__}.match({args})"


# ------------------------------------------------------------------ worker -> controller
@dataclass(slots=True)
class Hello(Message):
    """First message of a worker: its program digest and statement list, and where its driver
    declared each statement (``Program.statement_sites``; [] when not known), to name a
    mismatch and its lines. The sites travel apart from the statements, which the digest
    covers: a line is not part of the program."""

    eid: int
    worker: int
    digest: str
    statements: list[str]
    sites: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Done(Message):
    """The worker reached the end of the program with no task left."""

    eid: int
    worker: int
    tasks_run: int
    messages_sent: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Failed(Message):
    """A task failed on the worker; ``message`` names rank, stage, partition and traceback."""

    eid: int
    worker: int
    message: str


@dataclass(slots=True, eq=False)
class ReportPart(Message):
    """One partition of a reported dataset, for a report callback or the job's result."""

    eid: int
    seq: int
    stage: int
    iteration: tuple[int, ...]
    index: int
    array: np.ndarray
    tasks: int
    seconds: float = 0.0  # stamped by the controller's runtime on arrival

    __eq__ = _fields_equal


@dataclass(slots=True)
class LoadReport(Message):
    """A worker's load since its last report (every ``WorkerConfig.report_s`` seconds, not per
    task or per iteration): ``busy`` lists ``(group, index, seconds, nbytes)``, the time its
    tasks on each local partition took and the bytes it holds; ``idle`` the seconds it waited
    with nothing to run; ``tasks`` the tasks it finished; ``seq`` its position in the program
    (the next stage instance it emits), ``pc`` and ``counters`` the same position as the
    interpreter's op index and loop counters (innermost last: the controller's progress line
    names the loop and iteration); ``cpu`` and ``cpu_wait`` the seconds it ran on a CPU and
    waited for one (Linux); ``polls_hot`` whether it polls hot when idle, as of the report;
    ``mem_free``, ``mem_total`` and ``mem_pool`` the memory its machine has left for it
    (:func:`canary.memory.memory_room`, Linux), so that no move overfills a machine."""

    eid: int
    worker: int
    interval: float
    busy: tuple[tuple[int, int, float, int], ...]
    idle: float
    tasks: int
    seq: int
    done: bool
    cpu: float = 0.0  # seconds on a CPU in the interval (0: not measured)
    cpu_wait: float = 0.0  # seconds ready to run but waiting for a CPU
    pc: int = 0  # the interpreter's op index (Program.ops)
    counters: tuple[int, ...] = ()  # its loop counters, innermost last: a few ints
    polls_hot: bool = False  # it polls hot when idle (has a core to itself, nobody waits)
    mem_free: int = -1  # bytes its machine may still allocate to it (-1: not known)
    mem_total: int = -1  # bytes it may use in all there (-1: not known)
    mem_pool: str = ""  # workers naming the same pool share that memory (canary.memory)


@dataclass(slots=True)
class Bye(Message):
    """In answer to :class:`Shutdown`, the last message a worker sends. MPI keeps one sender's
    messages in order, so once the controller has every worker's Bye nothing they sent is still
    on its way to it: it has received (and dropped) their last load reports, and the job ends
    with no message left unreceived (an MPI that finds one at exit warns about each, as UCX
    between hosts does)."""

    eid: int
    worker: int


@dataclass(slots=True)
class MigrateDone(Message):
    """Destination to controller: the partition of ``move`` is installed here (``nbytes`` of
    values arrived); the controller may move it again."""

    eid: int
    move: int
    worker: int
    nbytes: int


@dataclass(slots=True)
class MigrateShipped(Message):
    """Source to controller: the partition of ``move`` has left this worker. Whatever this
    worker sent the controller for it before the cut (its parts of reports) is ahead of this
    message, so once it is in, no report part of the partition is still coming from here."""

    eid: int
    move: int
    worker: int


# ------------------------------------------------------------------ controller -> worker
@dataclass(slots=True)
class Placement(Message):
    """A partition map (initial placement or update); newer entry versions win, except that a
    move's source and destination take the moved entry from the move's own messages."""

    eid: int
    map: PartitionMap


@dataclass(slots=True)
class Shutdown(Message):
    """Every worker is done: exit cleanly."""

    eid: int


@dataclass(slots=True)
class Abort(Message):
    """The job cannot go on; every rank exits non-zero with ``reason``."""

    eid: int
    reason: str


@dataclass(slots=True)
class MigrateOut(Message):
    """To the source: move partition ``index`` of every dataset of co-location group ``group``
    to worker ``dest`` (0-based). ``move`` numbers the move within the job. The map update that
    names ``dest`` as the owner goes to every worker too; the source and the destination apply
    that entry when the move reaches them (this message, :class:`MigrateOffer`), not before."""

    eid: int
    move: int
    group: int
    index: int
    dest: int
    version: int  # the entry's version once moved


# ------------------------------------------------------------------ worker -> worker
@dataclass(slots=True)
class MigrateOffer(Message):
    """Source to destination: ``source`` (0-based) will hand over the partition of ``move``;
    it has emitted the stage instances before ``seq`` and stopped emitting until it hears the
    cut (see :class:`MigrateAccept`)."""

    eid: int
    move: int
    group: int
    index: int
    source: int
    seq: int
    version: int  # the entry's version with the destination as owner


@dataclass(slots=True)
class MigrateAccept(Message):
    """Destination to source: the source runs every stage instance before ``cut`` on the moving
    partition, the destination every one from ``cut`` on (``cut`` is the later of the two
    workers' positions, so neither has emitted an instance the other must run)."""

    eid: int
    move: int
    cut: int


@dataclass(slots=True)
class MigrateData(Message):
    """Source to destination, once every task before the cut is done: the metadata of the
    moving partitions (``last_seqs[k]``: the last stage instance that accessed dataset
    ``datasets[k]``'s partition) and which of them carry a value, each then following in a
    :class:`MigrateArray`."""

    eid: int
    move: int
    group: int
    index: int
    cut: int
    datasets: tuple[int, ...]
    last_seqs: tuple[int, ...]
    valued: tuple[int, ...]


@dataclass(slots=True, eq=False)
class MigrateArray(Message):
    """One moving partition's value (a raw buffer on the wire when large; the source gives it
    up, so it is not copied to be sent)."""

    eid: int
    move: int
    dataset: int
    array: np.ndarray

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class Piece(Message):
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

    __eq__ = _fields_equal


@dataclass(slots=True)
class PieceBatch(Message):
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
class Signal(Message):
    """The value of signal stage instance ``seq``, broadcast by the worker that computed it."""

    eid: int
    seq: int
    value: bool


# ------------------------------------------------------------------ snapshots
@dataclass(slots=True)
class SnapshotAsk(Message):
    """Controller to every worker: snapshot ``snap`` begins. Emit nothing more until
    :class:`SnapshotAt` names the barrier, and say where you are (:class:`SnapshotPosition`)."""

    eid: int
    snap: int


@dataclass(slots=True)
class SnapshotPosition(Message):
    """Worker to controller: the next stage instance it would emit is ``seq`` (``ended``: it
    has reached the end of the program)."""

    eid: int
    snap: int
    worker: int
    seq: int
    ended: bool


@dataclass(slots=True)
class SnapshotAt(Message):
    """Controller to every worker: snapshot ``snap`` is taken at stage instance ``seq``: finish
    every instance before it, emit none from it on, write your partitions, then go on.
    ``seq=None``: the snapshot is abandoned; go on."""

    eid: int
    snap: int
    seq: int | None


@dataclass(slots=True)
class SnapshotWritten(Message):
    """Worker to controller: its part of snapshot ``snap`` is on disk (``entries``: one per
    array, see :func:`canary.snapshot.write_arrays`), or failed with ``error``. ``position``
    is where it stands in the program (the same on every worker), ``tasks_run`` and
    ``reports_sent`` its counts so far."""

    eid: int
    snap: int
    worker: int
    error: str | None
    entries: list[dict[str, Any]]
    position: dict[str, Any]
    tasks_run: int
    reports_sent: int


# ------------------------------------------------------------------ local events
@dataclass(slots=True, eq=False)
class TaskDone(Message):
    """The runtime ran ``task`` in ``seconds``; ``outputs`` are its validated results
    (kind-dependent). ``seconds`` is None where nobody measured (a test's hand-made event)."""

    eid: int
    task: Any
    outputs: Any
    seconds: float | None = None


@dataclass(slots=True, eq=False)
class TaskFailed(Message):
    """User code of ``task`` raised, or returned something malformed; ``message`` says where."""

    eid: int
    task: Any
    message: str


@dataclass(slots=True)
class Tick(Message):
    """The runtime's clock, ``now`` seconds since the job started. To the controller: its move
    policy may act. To a worker: time to send a :class:`LoadReport`; ``idle`` is the seconds it
    waited with nothing to run since the last tick."""

    eid: int
    now: float
    idle: float = 0.0
    cpu: float = 0.0  # seconds the worker ran on a CPU since the last tick (0: not measured)
    cpu_wait: float = 0.0  # seconds it was ready to run but waited for a CPU (another process)
    polls_hot: bool = False  # the worker polls hot when idle (canary.idle.Backoff.note_cpu_wait)
    mem_free: int = -1  # bytes its machine may still allocate to it (canary.memory; -1: unknown)
    mem_total: int = -1
    mem_pool: str = ""


@dataclass(slots=True)
class MoveRequest(Message):
    """Controller: move partition ``index`` of group ``group`` to worker ``dest`` for each
    ``(group, index, dest)`` of ``moves`` (tests and scripted experiments; ``reason`` goes in
    the progress line)."""

    eid: int
    moves: tuple[tuple[int, int, int], ...]
    reason: str = "requested"


@dataclass(slots=True, eq=False)
class SnapshotSaved(Message):
    """The worker's runtime carried out :class:`WriteSnapshot` ``snap``: ``entries`` describe
    the arrays written, or ``error`` says why nothing was (a full disk)."""

    eid: int
    snap: int
    entries: list[dict[str, Any]]
    error: str | None = None

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class SnapshotLoaded(Message):
    """The worker's runtime carried out :class:`ReadSnapshot`: ``values`` maps each requested
    ``(dataset name, index)`` to ``(array, last_seq)``, or to None if the snapshot holds no
    value for it (a partition not yet written when the snapshot was taken)."""

    eid: int
    values: dict[tuple[str, int], tuple[np.ndarray, int] | None]

    __eq__ = _fields_equal


@dataclass(slots=True)
class SnapshotCommitted(Message):
    """The controller's runtime carried out :class:`CommitSnapshot` ``snap`` (``error``: the
    manifest could not be written, so the snapshot does not exist)."""

    eid: int
    snap: int
    error: str | None = None


@dataclass(slots=True)
class Resume(Message):
    """Go on after a :class:`Yield` instruction (see :class:`canary.worker.state.WorkerState`)."""

    eid: int


# ------------------------------------------------------------------ instructions
@dataclass(slots=True, eq=False)
class Send(Instruction):
    """Send ``message`` to MPI rank ``dest``."""

    dest: int
    message: Any
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class Yield(Instruction):
    """Worker: act on the instructions before this one now (send the messages), then feed the
    state a :class:`Resume` event, unless the :class:`RunTask` just before it runs first (its
    ``TaskDone`` resumes as well). The state stopped emitting tasks so that the messages it had
    decided, which other workers wait for, would not wait for that emission."""

    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class Callback(Instruction):
    """Controller: call a report callback with ``event`` (on rank 0, outside the state).
    ``site`` is where the driver declared the report (``file:line``, "" if unknown), for the
    message of a callback that raises: its traceback shows the callback, not the report."""

    fn: Any
    event: Any
    cause: int = 0
    site: str = ""

    __eq__ = _fields_equal


def run_callback(ins: Callback) -> str | None:
    """Call the report callback of ``ins``; None if it returned, else what its failure says
    (which report, which iteration, the traceback), for the runner to feed the controller as
    a :class:`Failed`: the job then ends as it does for a task that raised."""
    try:
        ins.fn(ins.event)
    except Exception as exc:  # noqa: BLE001 - the driver's code: its failure ends the job
        from canary.sites import user_traceback

        ev = ins.event
        why = user_traceback(exc)
        at = f", declared at {ins.site}" if ins.site else ""
        return (f"rank 0 (controller): report '{ev.name}' of '{ev.dataset}' (iteration "
                f"{ev.iteration}{at}), its callback failed:\n{why.rstrip()}")
    return None


@dataclass(slots=True, eq=False)
class Finish(Instruction):
    """Controller: the job is complete."""

    cause: int = 0

    __eq__ = _fields_equal


def size_text(nbytes: int) -> str:
    """``nbytes`` as a person reads it in a progress line: '3.2 MiB', '12.0 KiB', '512 B'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


@dataclass(slots=True, eq=False)
class Progress(Instruction):
    """Controller: print ``line`` on rank 0 (a partition moved, a worker makes no progress)."""

    line: str
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class Fail(Instruction):
    """Controller: abort the job with ``reason`` (exit non-zero), raising ``error`` where the
    job was started (:class:`canary.TaskError` when user code failed)."""

    reason: str
    error: type = JobAborted
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class WriteSnapshot(Instruction):
    """Worker: write ``arrays`` (``(dataset name, index, array, last_seq)``) as this worker's
    part of snapshot ``snap`` (taken at stage instance ``seq``), then feed the state a
    :class:`SnapshotSaved`."""

    snap: int
    seq: int
    arrays: list[tuple[str, int, np.ndarray, int]]
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class ReadSnapshot(Instruction):
    """Worker: read the partitions ``keys`` (``(dataset name, index)``) from the snapshot the
    job resumes from, then feed the state a :class:`SnapshotLoaded`."""

    keys: list[tuple[str, int]]
    cause: int = 0

    __eq__ = _fields_equal


@dataclass(slots=True, eq=False)
class CommitSnapshot(Instruction):
    """Controller: write the reports ``results`` (``(dataset name, k, array)``) and then the
    ``manifest`` of snapshot ``snap`` (which commits it), delete old snapshots, and feed the
    state a :class:`SnapshotCommitted`."""

    snap: int
    manifest: dict[str, Any]
    results: list[tuple[str, int, np.ndarray]]
    cause: int = 0

    __eq__ = _fields_equal
