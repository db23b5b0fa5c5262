"""Run a job's real controller and worker state machines in one process, in virtual time, on a
modelled network: how the job would run on more machines than there are.

Every task really runs (so the answer is the job's real answer, bit for bit the one
:func:`canary.run` and :func:`canary.run_local` give: the same state machines make the same
decisions and gathers merge in source order), but the time it takes on the virtual clock comes
from a **cost model**: by default the seconds it took here (:class:`TaskCost`, scaled by a
factor), or anything else that maps a task and its measured time to seconds. The roles are
driven as their MPI runtimes drive them (``canary.worker.runtime``): a worker is one core; it
polls MPI, hands each message that has arrived to its state, then runs a batch of the tasks
its state hands out (feeding back each ``TaskDone``), and only then polls again. Handling an
event costs the worker ``handle_s`` seconds (or the time ``handle`` really took here, when
None): that is the per-worker scheduling work. **Runtime model** (:class:`Runtime`): each
message costs its sender and its receiver a fixed CPU time, each empty poll a little, tasks
run in batches sized as the worker runtime sizes them, and an idle rank sees a message only at
its next poll: at once while it polls hot, else after the sleep of its back-off under way.

**Network model** (:class:`Network`): every rank has its own network interface. A message of
``b`` bytes (what :mod:`canary.wire` would put on the wire) leaves its sender's interface after
the messages before it, taking ``b / bandwidth``; it arrives ``latency`` later, and a
receiver's interface takes in one message at a time (so a reduce's pieces queue at their
destination, and a broadcast from one worker queues at its source). Messages between one pair
of ranks arrive in the order sent, as MPI guarantees.

Nothing here reads the wall clock except to measure task and handling times; with a fixed
``handle_s`` and a cost model that ignores the measured time, the same job gives the same
virtual times on every run.
"""

from __future__ import annotations

import heapq
import math
import pickle
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from canary.controller.state import ControllerState
from canary.local_runner import deliver_copy, validate_cluster
from canary.messages import (
    CONTROLLER,
    Callback,
    Fail,
    Failed,
    Finish,
    LoadReport,
    Piece,
    ReportPart,
    Resume,
    Send,
    Shutdown,
    Signal,
    TaskDone,
    Tick,
    local_event_id,
    run_callback,
    worker_rank,
)
from canary.program import Program
from canary.result import JobResult
from canary.wire import pack
from canary.worker.config import IDLE_SPINS, WorkerConfig
from canary.worker.execute import run_task
from canary.worker.state import WorkerState
from canary.worker.tasks import K_SIGNAL, RunTask, Task


@dataclass(frozen=True)
class Network:
    """One-way ``latency_s`` per message and ``bandwidth_bytes_s`` per rank's interface."""

    latency_s: float
    bandwidth_bytes_s: float
    name: str = ""

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bandwidth_bytes_s > 0):
            raise ValueError(f"network {self.name!r}: latency must be >= 0 and bandwidth > 0, "
                             f"got {self.latency_s} s and {self.bandwidth_bytes_s} B/s")


@dataclass(frozen=True)
class Runtime:
    """What a rank's MPI runtime costs besides its tasks and its state's handling, and when an
    idle rank sees a message (``canary.worker.runtime``, ``canary.controller.runtime``,
    ``canary.idle.Backoff``).

    * ``send_s`` / ``recv_s``: CPU seconds a rank spends per message it sends (encoding,
      pickling, ``isend``) and per message it takes in (``Iprobe``, ``recv``, decoding);
    * ``poll_s``: one poll of MPI that finds nothing;
    * ``task_s``: the runtime's call around each task (its event id, ``run_task``'s checks);
    * ``oversleep_s``: how much longer than asked an idle rank's sleep lasts (timer slack and
      the kernel's wake-up);
    * ``workers_spin``: every worker has a core to itself, so after a batch of tasks it polls
      hot for ``WorkerConfig.spin_s`` before it sleeps (``canary.idle.has_own_core``);
    * ``controller_max_sleep_s``: the controller's longest idle sleep;
    * ``sleeps``: idle ranks back off as below (False: they poll all the time).

    An idle rank polls ``spins`` times back to back (``poll_s`` each), hot for ``spin_s``
    (workers that spin), then sleeps ``2e-5`` s doubling to its longest sleep, polling between
    sleeps; a message is seen at the first poll after it arrived. A worker polls MPI only
    between batches of tasks, as its runtime does: a batch doubles while it lasts under half of
    ``WorkerConfig.poll_interval_s`` and halves while it lasts longer (at most ``max_batch``).

    The defaults are this machine's, measured by ``python benchmarks/scaling.py`` (section
    ``runtime``; docs/performance.md#scaling); :data:`IDEAL` costs nothing and sees every
    message at once.
    """

    send_s: float = 3.3e-6
    recv_s: float = 2.4e-6
    poll_s: float = 1.05e-6
    task_s: float = 5e-7
    oversleep_s: float = 1.6e-5
    workers_spin: bool = True
    controller_max_sleep_s: float = 1e-2
    sleeps: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        for k in ("send_s", "recv_s", "poll_s", "task_s", "oversleep_s", "controller_max_sleep_s"):
            if not getattr(self, k) >= 0:
                raise ValueError(f"runtime {self.name!r}: {k} must be >= 0, "
                                 f"got {getattr(self, k)}")


#: A runtime that costs nothing and sees every message the moment it arrives.
IDEAL = Runtime(0.0, 0.0, 0.0, 0.0, 0.0, True, 0.0, False, "ideal")

# canary.idle.Backoff's shortest sleep, and its quick polls (the worker's and the controller's)
MIN_SLEEP_S = 2e-5
WORKER_SPINS, CONTROLLER_SPINS = IDLE_SPINS, 20


class PollClock:
    """When an idle rank next polls MPI (``canary.idle.Backoff``, in virtual time): hot until
    ``hot_until``, then a sleep (doubling to ``max_sleep``, each ``oversleep`` longer than
    asked) and a poll, over and over."""

    __slots__ = ("hot_until", "at", "sleep", "max_sleep", "oversleep", "poll")

    def __init__(self, max_sleep: float, oversleep: float, poll: float) -> None:
        self.hot_until = self.at = 0.0
        self.sleep = MIN_SLEEP_S
        self.max_sleep = max(max_sleep, MIN_SLEEP_S)
        self.oversleep = oversleep
        self.poll = poll

    def reset(self, t: float, hot_s: float) -> None:
        """The rank had work until ``t``: it polls hot for ``hot_s``, then sleeps from the
        shortest sleep."""
        self.hot_until = self.at = t + hot_s
        self.sleep = MIN_SLEEP_S

    def idle_from(self, t: float) -> None:
        """The rank polled at ``t``, found nothing, and goes on waiting where its back-off is."""
        self.at = max(t, self.hot_until)

    def next_poll(self, t: float) -> float:
        """The first poll at or after ``t`` (``t`` at least the last poll)."""
        if t <= self.hot_until:
            return t
        at, sleep = self.at, self.sleep
        while at < t and sleep < self.max_sleep:
            at += sleep + self.oversleep + self.poll
            sleep = min(sleep * 2, self.max_sleep)
        if at < t:  # at the longest sleep: whole periods at once
            period = sleep + self.oversleep + self.poll
            at += math.ceil((t - at) / period) * period
        self.at, self.sleep = at, sleep
        return at


@dataclass(frozen=True)
class TaskCost:
    """The default cost model: a task takes ``scale`` times the seconds it took here (a
    ``scale`` of 2 stands for a machine half as fast; a task whose partition stands for
    ``scale`` times the rows of the one run here takes ``scale`` times as long)."""

    scale: float = 1.0

    def __call__(self, task: Task, measured_s: float) -> float:
        return measured_s * self.scale


CostModel = Callable[[Task, float], float]


class SharedCore:
    """A busy process pinned to a worker's core, as a fair kernel shares that core (the model
    behind ``run_virtual(shared_cores=...)``).

    The worker's **lag** is the CPU time the kernel owes it against an even share of the core
    with the busy process. While both want the core, the one running loses half a second of lag
    a second and the one waiting gains as much; the kernel lets the worker run until its lag is
    ``-slice_s / 2``, then runs the busy process until the worker's lag is ``+slice_s / 2``
    (``2 * slice_s`` of waiting): half the core, in turns. A worker that sleeps (a gap of more
    than ``awake_s`` since it last ran: less is its own handling) earns ``earn`` seconds of lag
    a second, up to ``credit_s``. Woken by a message, it runs at once if the kernel owes it
    time, else after a whole turn of the busy process (:meth:`wake`): a wait between its tasks,
    which its runtime counts as idle. The worker sleeps when idle, as one that waits for its
    CPU does (``canary.idle.Backoff.note_cpu_wait``). The defaults stand for what
    ``benchmarks/core_share.py`` measured on Linux 6.18: a burst of 1.25 ms or less runs at full
    speed, of 1.5-3 ms 1.6-2.3 times as long; busy a fifth of the time, such bursts see their
    waits end on time, busy 30% of it a fifth to a quarter of the waits end a whole turn (about
    2 ms) late. Stateful: one per worker and run; :meth:`wake` and :meth:`run` must be called
    in time order."""

    def __init__(self, slice_s: float = 1.2e-3, credit_s: float = 3e-4,
                 earn: float = 0.15, awake_s: float = 2e-5) -> None:
        if not 0 < slice_s < math.inf:
            raise ValueError(f"SharedCore: slice_s must be a finite number above 0, got {slice_s}")
        for name, value in (("credit_s", credit_s), ("earn", earn), ("awake_s", awake_s)):
            if not 0 <= value < math.inf:
                raise ValueError(f"SharedCore: {name} must be a finite number >= 0, got {value}")
        self.slice_s, self.credit_s, self.earn, self.awake_s = slice_s, credit_s, earn, awake_s
        self.lag = credit_s
        self.last_end = 0.0

    def _sleep_until(self, t: float) -> None:
        if t - self.last_end > self.awake_s:
            self.lag = min(self.credit_s, self.lag + self.earn * (t - self.last_end))

    def wake(self, at: float) -> float:
        """When a worker asleep since it last ran, woken at ``at``, gets the CPU: at once if
        the kernel owes it time, else after a whole turn of the busy process."""
        self._sleep_until(at)
        half = self.slice_s / 2
        got = at
        if self.lag < 0:
            got += 2 * (half - self.lag)
            self.lag = half
        self.last_end = got
        return got

    def run(self, start: float, cpu: float) -> float:
        """The wall seconds ``cpu`` seconds of work take from ``start`` on the shared core (at
        least ``cpu``: the difference is time waiting for the CPU)."""
        half = self.slice_s / 2
        self._sleep_until(start)
        left, wall = cpu, 0.0
        while True:
            ran = min(left, max(2 * (self.lag + half), 0.0))
            self.lag -= ran / 2
            left -= ran
            wall += ran
            if left <= 1e-15:
                break
            wall += 2 * (half - self.lag)  # the busy process's turn
            self.lag = half
        self.last_end = start + wall
        return wall


class Links:
    """The network's state during a run: when each rank's interface is next free to send and
    to receive, and the last arrival between each pair of ranks."""

    def __init__(self, network: Network, ranks: int) -> None:
        self.network = network
        self.tx_free = [0.0] * ranks
        self.rx_free = [0.0] * ranks
        self.last: dict[tuple[int, int], float] = {}

    def arrival(self, src: int, dest: int, at: float, nbytes: int) -> float:
        """When a message of ``nbytes`` sent by ``src`` at ``at`` has reached ``dest``:
        ``src``'s interface sends it after what it sent before (``nbytes / bandwidth``), it
        travels ``latency``, and ``dest``'s interface takes it in after what came before; never
        before an earlier message of the same pair (MPI's order)."""
        wire = nbytes / self.network.bandwidth_bytes_s
        start = max(at, self.tx_free[src])
        self.tx_free[src] = start + wire
        arrive = max(start + wire + self.network.latency_s, self.rx_free[dest] + wire,
                     self.last.get((src, dest), 0.0))
        self.rx_free[dest] = arrive
        self.last[(src, dest)] = arrive
        return arrive


_HEADER_BYTES: dict[tuple[type, int, int], int] = {}


def wire_bytes(message: Any) -> int:
    """The bytes ``message`` puts on the wire: its pickled header and any raw array behind it
    (as :class:`canary.mpi_transport.MpiTransport` sends it). A piece's or a signal's header is
    pickled once per kind and shape (its ids change its size by a few bytes at most), since a
    large virtual run sends millions of them."""
    t = type(message)
    arr = message.array if t is Piece else None
    if t is Signal or (type(arr) is np.ndarray and not arr.dtype.hasobject
                       and arr.dtype.fields is None):
        key = (t, -1 if arr is None else arr.ndim, len(message.dsts) if t is Piece else 0)
        head = _HEADER_BYTES.get(key)
        if head is None:
            payload, _ = pack(message, 0)
            head = _HEADER_BYTES[key] = len(pickle.dumps(payload, 5))
        return head + (0 if arr is None else arr.nbytes)
    payload, buf = pack(message, 0)
    return len(pickle.dumps(payload, 5)) + (buf.nbytes if buf is not None else 0)


@dataclass
class RankStats:
    """What one rank did in virtual time."""

    task_s: float = 0.0  # virtual seconds running tasks
    handle_s: float = 0.0  # virtual seconds handling events (the scheduling work)
    events: int = 0  # events handled (messages, tasks done, resumes, ticks)
    tasks: int = 0  # tasks handed out (a fused stretch counts once)
    sent: int = 0
    sent_bytes: int = 0
    received: int = 0
    received_bytes: int = 0


@dataclass
class VirtualResult:
    """A virtual run: the job's :class:`JobResult` (answers and counts, as from
    :func:`canary.run_local`), when it finished on the virtual clock, the end of each instance
    of each signal stage (stage name -> virtual end times in instance order), and per-rank
    figures (index 0: the controller; ``w + 1``: worker ``w``)."""

    job: JobResult
    seconds: float
    signal_ends: dict[str, list[float]]
    ranks: list[RankStats] = field(default_factory=list)

    def iteration_seconds(self, prefix: str = "while_") -> list[float]:
        """Gaps between consecutive ends of the main loop's signal task (the signal stage
        named ``prefix...`` with the most instances), as ``canary.trace.iteration_seconds``
        reads them from a real run's trace; [] if there is none."""
        ends = self.iteration_ends(prefix)
        return [b - a for a, b in zip(ends, ends[1:])]

    def iteration_ends(self, prefix: str = "while_") -> list[float]:
        """Virtual times at which the main loop's signal task (see :meth:`iteration_seconds`)
        ended, one per iteration; [] if there is none."""
        loops = [v for k, v in self.signal_ends.items() if k.startswith(prefix)]
        return max(loops, key=len) if loops else []

    @property
    def controller(self) -> RankStats:
        return self.ranks[0]

    @property
    def workers(self) -> list[RankStats]:
        return self.ranks[1:]


def next_batch(batch: int, ran: int, seconds: float, poll_interval_s: float,
               max_batch: int) -> int:
    """The worker runtime's next batch size after a batch of ``batch`` that ran ``ran`` tasks
    in ``seconds``: doubled (to ``max_batch``) if it was full and lasted under half of
    ``poll_interval_s``, halved (to 1) if full and longer than ``poll_interval_s``; unchanged
    if the tasks ran out before it was full."""
    if ran == batch:
        if seconds < poll_interval_s * 0.5 and batch < max_batch:
            return batch * 2
        if seconds > poll_interval_s and batch > 1:
            return batch // 2
    return batch


_ARRIVE, _DONE, _WAKE, _TICK = 0, 1, 2, 3


def run_virtual(program: Program, workers: int, network: Network,
                cost: CostModel | None = None, handle_s: float | None = None,
                config: WorkerConfig | None = None, load_reports: bool = True,
                validate: bool = False, max_events: int = 100_000_000,
                on_task: Callable[[int, Task, float, float], None] | None = None,
                runtime: Runtime | None = None, policy: Any = None, tick_s: float = 0.1,
                slowdown: dict[int, float] | None = None,
                noise: Callable[[int, float], float] | None = None,
                shared_cores: dict[int, SharedCore] | None = None) -> VirtualResult:
    """Run ``program`` on ``workers`` virtual workers over ``network`` (see the module doc).

    ``cost(task, measured_s)`` gives a task's virtual seconds (default :class:`TaskCost`\\ ()),
    from the seconds its call took here. ``handle_s``: virtual seconds each event's handling
    costs a rank (None: the time it took here). ``runtime``: what the ranks' MPI runtimes cost
    and when an idle rank sees a message (default :class:`Runtime`\\ (), this machine's;
    :data:`IDEAL`: nothing, at once). ``config``: the workers' :class:`WorkerConfig` (default:
    the defaults, with fused stretches of fixed size, since virtual durations say nothing about
    how long a real stretch would be). ``load_reports``: workers send the controller a load
    report every ``config.report_s`` virtual seconds, as over MPI. ``policy``: the controller's
    move policy (:mod:`canary.controller.balance`; None: no partition moves), asked every
    ``tick_s`` virtual seconds, as over MPI; moved partitions cost the network their bytes.
    ``slowdown``: worker index to a factor its tasks' priced seconds are multiplied by (what
    ``CANARY_SLOWDOWN`` does over MPI). ``noise(worker, start)``: a further factor for a task
    that starts at virtual time ``start`` on that worker (a machine's passing slow spells).
    ``shared_cores``: worker index to the :class:`SharedCore` (a busy process on its core) its
    tasks run on. Every worker's load reports carry the seconds it ran tasks on a CPU and
    waited for one, as on Linux (the balancing policy tells a worker slower with its CPU from
    one losing it to another process by them).
    ``validate``: check every state's invariants and the cross-role one after each event.
    ``on_task(worker, task, start, end)`` is called for every task run, with its virtual start
    and end.

    Raises :class:`canary.TaskError` if user code fails, RuntimeError if the job stops making
    progress or exceeds ``max_events`` (engine bugs, or a job too large for this run).
    """
    program.finalize()
    cost = cost or TaskCost()
    rt = runtime if runtime is not None else Runtime()
    config = replace(config or WorkerConfig(), adapt_fused=False)
    ctrl = ControllerState(program, workers, policy, stall_s=float("inf"))
    slowdown = slowdown or {}
    shared = shared_cores or {}
    for name, by_worker in (("slowdown", slowdown), ("shared_cores", shared)):
        if any(not 0 <= w < workers for w in by_worker):
            raise ValueError(f"{name} {by_worker}: worker indices must be below {workers}")
    cores: list[SharedCore | None] = [None, *(shared.get(w) for w in range(workers))]
    cpu = [0.0] * (workers + 1)  # seconds each rank ran tasks on a CPU, and waited for one,
    cpu_wait = [0.0] * (workers + 1)  # since its last report
    # each worker's own config carries its factor, as over MPI (WorkerConfig checks it)
    states = [WorkerState(program, w, workers, replace(config, slowdown=slowdown.get(w, 1.0)))
              for w in range(workers)]
    nranks = workers + 1
    stats = [RankStats() for _ in range(nranks)]
    inbox: list[deque[Any]] = [deque() for _ in range(nranks)]
    free_at = [0.0] * nranks  # when each rank is next free
    busy = [False] * nranks  # a task is running, or a wake-up is scheduled
    pending: list[Task | None] = [None] * nranks  # the task the state handed out
    resume = [False] * nranks
    links = Links(network, nranks)
    idle_since = [0.0] * nranks
    idle = [0.0] * nranks
    next_report = [config.report_s] * nranks
    # the MPI runtime: tasks run in batches with a poll of MPI between them; idle ranks back off
    batch = [1] * nranks
    in_batch = [0] * nranks  # tasks run in the current batch
    batch_start = [0.0] * nranks
    ran_task = [False] * nranks  # since the rank last went idle (its back-off resets then)
    clocks = [PollClock(rt.controller_max_sleep_s, rt.oversleep_s, rt.poll_s)] + [
        PollClock(config.max_sleep_s, rt.oversleep_s, rt.poll_s) for _ in range(workers)]
    worker_hot = max(WORKER_SPINS * rt.poll_s, config.spin_s if rt.workers_spin else 0.0)
    controller_hot = CONTROLLER_SPINS * rt.poll_s
    if not rt.sleeps:
        worker_hot = controller_hot = math.inf
    for c in clocks:
        c.reset(0.0, worker_hot)
    clocks[CONTROLLER].reset(0.0, controller_hot)
    poll_interval, max_batch = config.poll_interval_s, config.max_batch
    send_s, recv_s, poll_s, task_s = rt.send_s, rt.recv_s, rt.poll_s, rt.task_s
    signal_ends: dict[str, dict[int, float]] = {}
    heap: list[tuple[float, int, int, int, Any]] = []
    counter = 0
    outcome: list[Any] = []
    t0 = time.perf_counter()
    perf_counter = time.perf_counter

    ids = [0] * nranks

    def next_id(rank: int) -> int:
        ids[rank] += 1
        return local_event_id(rank, ids[rank])

    def push(t: float, kind: int, rank: int, item: Any) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(heap, (t, counter, kind, rank, item))

    def send(src: int, ins: Send) -> None:
        msg = ins.message
        nbytes = wire_bytes(msg)
        deliver_copy(msg)
        dest = ins.dest
        free_at[src] += send_s
        arrive = links.arrival(src, dest, free_at[src], nbytes)
        st = stats[src]
        st.sent += 1
        st.sent_bytes += nbytes
        stats[dest].received_bytes += nbytes
        push(arrive, _ARRIVE, dest, msg)

    def handle(rank: int, event: Any) -> list[Any]:
        """Feed ``event`` to the rank's state at its ``free_at``, charging the handling."""
        st = stats[rank]
        st.events += 1
        h0 = perf_counter()
        out = ctrl.handle(event) if rank == CONTROLLER else states[rank - 1].handle(event)
        spent = perf_counter() - h0 if handle_s is None else handle_s
        st.handle_s += spent
        free_at[rank] += spent
        return out

    def carry_worker(rank: int, instrs: list[Any]) -> None:
        for ins in instrs:
            if type(ins) is Send:
                send(rank, ins)
            elif type(ins) is RunTask:
                pending[rank] = ins.task
            else:
                resume[rank] = True

    def carry_controller(instrs: list[Any]) -> None:
        for ins in instrs:
            if isinstance(ins, Send):
                if not isinstance(ins.message, Shutdown):  # the job ends at Finish
                    send(CONTROLLER, ins)
            elif isinstance(ins, Callback):
                failed = run_callback(ins)
                if failed is not None:  # the job fails, whatever else this event did
                    outcome[:0] = [(free_at[CONTROLLER], i) for i in ctrl.handle(
                        Failed(0, -1, failed)) if isinstance(i, Fail)]
                    return
            elif isinstance(ins, (Finish, Fail)):
                outcome.append((free_at[CONTROLLER], ins))

    def drain(rank: int) -> None:
        """Poll MPI at ``free_at``: take in and handle every message that has arrived, then the
        poll that finds nothing."""
        box = inbox[rank]
        while box:
            msg = box.popleft()
            stats[rank].received += 1
            free_at[rank] += recv_s
            if rank == CONTROLLER:
                if isinstance(msg, ReportPart):
                    msg.seconds = free_at[rank]  # the report's time on the virtual clock
                carry_controller(handle(rank, msg))
            else:
                carry_worker(rank, handle(rank, msg))
        free_at[rank] += poll_s

    def run_next(rank: int) -> bool:
        """Go on with the rank's batch: run its next task (True: it is running), or feed its
        state Resume; False when the batch is over."""
        while in_batch[rank] < batch[rank] and (pending[rank] is not None or resume[rank]):
            task = pending[rank]
            if task is None:
                resume[rank] = False
                carry_worker(rank, handle(rank, Resume(next_id(rank))))
                continue
            pending[rank] = None
            in_batch[rank] += 1
            w = rank - 1
            ev = run_task(states[w], task, next_id(rank))
            # the cost model prices the task's own time; the runtime's call around it is the
            # same whatever the task stands for
            took = cost(task, ev.seconds if type(ev) is TaskDone and ev.seconds is not None
                        else 0.0) * states[w].config.slowdown + task_s
            if noise is not None:
                took *= noise(w, free_at[rank])
            cpu[rank] += took
            core = cores[rank]
            if core is not None:
                wall = core.run(free_at[rank], took)
                cpu_wait[rank] += wall - took
                took = wall
            if type(ev) is TaskDone:
                ev.seconds = took
            st = stats[rank]
            st.tasks += 1
            st.task_s += took
            if on_task is not None:
                on_task(w, task, free_at[rank], free_at[rank] + took)
            free_at[rank] += took
            busy[rank] = True
            push(free_at[rank], _DONE, rank, (task, ev))
            return True
        return False

    def end_batch(rank: int) -> None:
        batch[rank] = next_batch(batch[rank], in_batch[rank], free_at[rank] - batch_start[rank],
                                 poll_interval, max_batch)
        in_batch[rank] = 0

    def work(rank: int) -> None:
        """The rank polls MPI at ``free_at``: take what has arrived, then start a batch of
        tasks (or note that it is idle)."""
        while True:
            drain(rank)
            if rank == CONTROLLER:
                break
            w = rank - 1
            if load_reports and free_at[rank] >= next_report[rank] and not states[w].done_sent:
                next_report[rank] = free_at[rank] + config.report_s
                tick = Tick(next_id(rank), free_at[rank], idle[rank], cpu[rank], cpu_wait[rank])
                idle[rank] = cpu[rank] = cpu_wait[rank] = 0.0
                carry_worker(rank, handle(rank, tick))
            if pending[rank] is not None or resume[rank]:
                ran_task[rank] = True
                batch_start[rank] = free_at[rank]
                in_batch[rank] = 0
                if run_next(rank):
                    return
                end_batch(rank)
                continue
            if inbox[rank]:
                continue
            break
        idle_since[rank] = free_at[rank]
        if ran_task[rank]:
            ran_task[rank] = False
            clocks[rank].reset(free_at[rank], worker_hot)
        else:
            clocks[rank].idle_from(free_at[rank])

    for w, st in enumerate(states):
        rank = worker_rank(w)
        carry_worker(rank, st.start(reports=load_reports))
        work(rank)
    if policy is not None:
        push(tick_s, _TICK, CONTROLLER, None)
    events = 0
    while heap and not outcome:
        now, _, kind, rank, item = heapq.heappop(heap)
        events += 1
        if events > max_events:
            raise RuntimeError(f"run_virtual: more than {max_events} events; raise max_events")
        if kind == _ARRIVE:
            inbox[rank].append(item)
            if busy[rank]:
                continue  # seen at the poll after the running batch or handling
            if free_at[rank] <= now:  # idle: seen at its next poll
                wake = clocks[rank].next_poll(now)
                core = cores[rank]
                if core is not None:  # asleep in the kernel until the busy process lets it run
                    got = core.wake(wake)
                    cpu_wait[rank] += got - wake
                    wake = got
                idle[rank] += wake - max(idle_since[rank], free_at[rank])
                free_at[rank] = wake
                if rank == CONTROLLER and not isinstance(item, (ReportPart, LoadReport)):
                    clocks[rank].reset(wake, controller_hot)  # reports leave it asleep
            if free_at[rank] > now:  # asleep, or still handling earlier events
                busy[rank] = True
                push(free_at[rank], _WAKE, rank, None)
                continue
            work(rank)
        elif kind == _WAKE:
            busy[rank] = False
            work(rank)
        elif kind == _TICK:
            # handled when the controller is next free, as its MPI loop would; none is scheduled
            # once nothing else is pending, so that a job that stopped is still seen to stop
            free_at[CONTROLLER] = max(free_at[CONTROLLER], now)
            carry_controller(handle(CONTROLLER, Tick(next_id(CONTROLLER), free_at[CONTROLLER])))
            if heap:
                push(now + tick_s, _TICK, CONTROLLER, None)
        else:
            busy[rank] = False
            task, ev = item
            if task.kind == K_SIGNAL and type(ev) is TaskDone:
                ends = signal_ends.setdefault(task.stage.name, {})
                ends[task.seq] = max(ends.get(task.seq, 0.0), now)
            carry_worker(rank, handle(rank, ev))
            if run_next(rank):
                continue
            end_batch(rank)
            work(rank)
        if validate:
            for s in states:
                s.validate_state()
            ctrl.validate_state()
            validate_cluster(ctrl, states)
    if not outcome:
        raise RuntimeError("run_virtual: the job stopped making progress (an engine bug): "
                           + "; ".join(f"worker {s.worker}: pc {s.pc}, seq {s.seq}, "
                                       f"{len(s.tasks)} task(s), done {s.done_sent}"
                                       for s in states))
    end, last = outcome[0]
    if isinstance(last, Fail):
        raise last.error(last.reason)
    worker_sent: dict[str, int] = {}
    for s in states:
        for k, v in s.sent.items():
            worker_sent[k] = worker_sent.get(k, 0) + v
    job = JobResult(ctrl.results, ctrl.tasks_run, workers, time.perf_counter() - t0,
                    dict(ctrl.received), dict(ctrl.sent), 0.0, worker_sent, ctrl.migrations,
                    ctrl.bytes_migrated, reports=ctrl.program.reported)
    return VirtualResult(job, end, {k: [v[s] for s in sorted(v)]
                                    for k, v in signal_ends.items()}, stats)
