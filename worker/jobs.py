"""A worker shared by several jobs, as a pure state machine: ``handle(event, now) -> instructions``.

One :class:`~canary.worker.state.WorkerState` per job runs that job exactly as under
``canary run``; this layer only says *which job's* ready task runs next, and routes messages:

* **Isolation.** Each job has its own state, its own job ranks and its own messages
  (:class:`~canary.pool.messages.Envelope`): nothing of one job reaches another's state. A job
  that ends (done, failed, cancelled) is dropped with everything it held here.
* **Sharing.** A job's state hands out one task at a time; the task waits in the worker's
  :class:`JobQueue` until the queue policy picks it. The worker runs one task at a time (a
  worker rank is one core), so the policy decides every time the core frees: FIFO by job
  arrival, strict priority, weighted fair share across users by task seconds, or HFSP.
* **Placement (Sparrow).** A :class:`~canary.pool.messages.Probe` is answered with the load
  (jobs here plus queued reservations); a :class:`~canary.pool.messages.Reserve` queues a
  reservation item in the same queue as the tasks, and when the policy pops it the worker asks
  the job's scheduler for the job (:class:`~canary.pool.messages.Request`). A worker binds
  one single-worker job at a time: until the one-worker job it asked for is declined, or has
  started here (its partition map arrived) or ended, a reservation the policy pops waits aside
  and is queued again afterwards. A job that is starting has no task yet, so the core looks
  free; without this a worker would ask for every queued reservation at once and take a burst
  of jobs that another worker, free a moment later, should have had. A job on several workers
  is not waited for: its scheduler answers only once enough workers asked, and two workers
  each waiting for a different such job would wait for ever.
* **Progress.** On a :class:`~canary.messages.Tick` (every ``config.report_s`` while the pool
  prints progress lines) each job's state here sends its load report, as under ``canary run``:
  its position, for the job's progress lines on rank 0. Its clock is the job's (seconds since
  it was declared here); the idle and CPU seconds are the rank's, which its jobs share. The
  reports do not size a job's run-ahead window: it stays at its most (``config.window``),
  since the pace it would be sized from is shared with the other jobs on the core.

Nothing here reads a clock: ``now`` comes with every event (seconds, never decreasing).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from canary.errors import JobAborted
from canary.messages import (
    CONTROLLER,
    Abort,
    Send,
    Shutdown,
    TaskDone,
    TaskFailed,
    Tick,
    Yield,
)
from canary.pool.messages import (
    Declared,
    DriverEnded,
    Envelope,
    JobEnd,
    JobSpec,
    JobStart,
    Probe,
    ProbeReply,
    Release,
    Request,
    Reserve,
    RunJobTask,
    StartDriver,
    StopPool,
    Unreserve,
    YieldJob,
)
from canary.program import Program
from canary.sched.hfsp import FifoJobs, HfspJobs
from canary.sched.queues import QUEUE_POLICIES, Item, PriorityQueue, WeightedFairQueue
from canary.worker.config import WorkerConfig
from canary.worker.state import WorkerState

__all__ = ["JobQueue", "JobsWorker", "instance_bound"]

_NO_LIMIT = 1 << 62  # a job's task count as the job-level policies see it: not known ahead
_RESERVATION = "reservation"


def instance_bound(ops: Sequence[tuple[Any, ...]], unbounded_while: int = 100) -> int:
    """An upper bound on the stage instances a program's ``ops`` emit: loops at their bounds,
    both branches of an ``if``, a ``while`` with no ``max_iter`` counted ``unbounded_while``
    times. Used only to turn a job's measured seconds per instance into a size estimate."""

    def count(lo: int, hi: int) -> int:
        n, pc = 0, lo
        while pc < hi:
            op = ops[pc]
            kind = op[0]
            if kind == "stage":
                n += 1
                pc += 1
            elif kind == "for":
                n += int(op[1]) * count(pc + 1, op[2] - 1)
                pc = op[2]
            elif kind == "while":
                iters = op[2] if op[2] >= 0 else unbounded_while
                n += iters * (1 + count(pc + 1, op[3] - 1)) + 1
                pc = op[3]
            elif kind == "if":
                n += 1
                pc += 1
            else:  # push, next, jump, end: no instance (a jump's else branch is counted too)
                pc += 1
        return n

    return max(count(0, len(ops)), 1)


class JobQueue:
    """Which job's ready unit (a task, or a reservation) a worker serves next.

    Keys are job ids (increasing in submission order) for tasks and ``-job`` for a job's
    reservation. Each key is registered with :meth:`add_job` and dropped with
    :meth:`remove_job`; :meth:`push` queues one unit, :meth:`pop` returns the next ``(key,
    unit)`` the policy picks (None when empty), and every popped unit must be :meth:`finished`
    with the seconds it ran. The policies are the objects of :mod:`canary.sched`, the
    simulator's:

    * ``fifo``: :class:`~canary.sched.hfsp.FifoJobs`, jobs in the order they arrived here;
    * ``priority``: :class:`~canary.sched.queues.PriorityQueue`, strict levels (0 first),
      first come first served within a level;
    * ``fair``: :class:`~canary.sched.queues.WeightedFairQueue` across users, weights per user,
      charging each unit the seconds it ran (``charge="measured"``: a unit is queued at its
      job's last task seconds and corrected when it finished), so shares are of CPU time; a
      user's weight is that of its latest job registered here (the highest id);
    * ``hfsp``: :class:`~canary.sched.hfsp.HfspJobs` (size-based with aging). A job starts
      with estimate 0 (served first: HFSP's training phase) until :meth:`set_estimate`.

    Raises ValueError for an unknown policy name.
    """

    def __init__(self, policy: str) -> None:
        if policy not in QUEUE_POLICIES:
            raise ValueError(f"unknown queue policy {policy!r}; choose from "
                             f"{', '.join(QUEUE_POLICIES)}")
        self.policy = policy
        self._jobs: FifoJobs | HfspJobs | None = None
        self._items: PriorityQueue | WeightedFairQueue | None = None
        if policy == "fifo":
            self._jobs = FifoJobs()
        elif policy == "hfsp":
            self._jobs = HfspJobs(capacity=1.0)
        elif policy == "priority":
            self._items = PriorityQueue()
        else:
            self._items = WeightedFairQueue(charge="measured")
        self._units: dict[int, deque[Any]] = {}
        self._meta: dict[int, tuple[int, int]] = {}  # key -> (user, priority)
        self._cost: dict[int, float] = {}  # key -> seconds its last unit took (fair)
        self._running: dict[int, int] = {}  # key -> popped units not yet finished
        self._popped: dict[int, deque[Item]] = {}  # key -> its popped items (fair, priority)
        # removed key -> its popped items still running: the fair queue charges what they ran
        self._removed_running: dict[int, deque[Item]] = {}
        self._weighed: dict[int, int] = {}  # user -> the job that set its weight (fair)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __contains__(self, key: int) -> bool:
        return key in self._meta

    def add_job(self, key: int, user: int, priority: int, weight: float, now: float) -> None:
        """Register ``key`` (ValueError if already there or the weight is not > 0)."""
        if key in self._meta:
            raise ValueError(f"job key {key} is already queued here")
        if not weight > 0:
            raise ValueError(f"a job's weight must be > 0, got {weight}")
        self._meta[key] = (user, priority)
        self._units[key] = deque()
        self._running[key] = 0
        self._popped[key] = deque()
        if self._jobs is not None:
            self._jobs.add_job(key, _NO_LIMIT, now, estimate=0.0 if self.policy == "hfsp"
                               else None, pending=0)
        elif isinstance(self._items, WeightedFairQueue) and abs(key) >= self._weighed.get(user, 0):
            # the latest job of a user sets its weight: an older job that starts here after a
            # newer one's reservation came must not set it back
            self._weighed[user] = abs(key)
            self._items.weights[user] = weight

    def push(self, key: int, unit: Any, now: float) -> None:
        self._units[key].append(unit)
        self._n += 1
        if self._jobs is not None:
            self._jobs.add_tasks(key)
        else:
            assert self._items is not None
            user, priority = self._meta[key]
            self._items.push(Item(key, user, priority, self._cost.get(key, 1e-3)), now)

    def pop(self, now: float) -> tuple[int, Any] | None:
        if not self._n:
            return None
        if self._jobs is not None:
            key = self._jobs.dispatch(now)
            assert key is not None
        else:
            assert self._items is not None
            item = self._items.pop(now)
            assert item is not None
            key = item.job
            self._popped[key].append(item)
        self._n -= 1
        self._running[key] += 1
        return key, self._units[key].popleft()

    def finished(self, key: int, seconds: float, now: float) -> None:
        """A popped unit of ``key`` ran ``seconds``. If ``key`` was removed since, the fair queue
        still charges its user the seconds (it was queued at an estimate), and nothing else
        changes."""
        if key not in self._meta:
            gone = self._removed_running.get(key)
            if gone:
                assert self._items is not None
                self._items.task_finished(gone.popleft(), now, seconds)
                if not gone:
                    del self._removed_running[key]
            return
        self._running[key] -= 1
        self._cost[key] = max(seconds, 1e-6)
        popped = self._popped[key]
        if popped and self._items is not None:
            self._items.task_finished(popped.popleft(), now, seconds)
        if self._jobs is not None:
            self._jobs.task_finished(key, now, seconds)

    def set_estimate(self, key: int, remaining: float, now: float) -> None:
        """HFSP: the job's remaining size is now estimated at ``remaining`` seconds (its
        training is over). Only while none of its units is running; other policies ignore it."""
        if not isinstance(self._jobs, HfspJobs) or key not in self._meta:
            return
        assert self._running[key] == 0, "re-estimating a job with a unit running"
        pending = len(self._units[key])
        self._jobs.remove_job(key, now)  # withdrawn: its new estimate replaces it
        self._jobs.add_job(key, _NO_LIMIT, now, estimate=max(remaining, 0.0), pending=pending)

    def remove_job(self, key: int, now: float | None = None, finished: bool = False) -> list[Any]:
        """Forget ``key`` at ``now`` (default: the latest time given); return its queued units
        (nothing if it was not here). ``finished``: the job ended done, not cancelled or failed
        (HFSP keeps a finished job in its virtual system to its virtual end, a cancelled one
        leaves it at once: :class:`~canary.sched.hfsp.HfspJobs`)."""
        if key not in self._meta:
            return []
        del self._meta[key]
        self._running.pop(key)
        popped = self._popped.pop(key)
        if popped and self._items is not None:
            self._removed_running[key] = popped
        self._cost.pop(key, None)
        units = list(self._units.pop(key))
        self._n -= len(units)
        if self._jobs is not None:
            if key in self._jobs:
                self._jobs.remove_job(key, now, finished)
        elif units:
            assert self._items is not None
            self._items.discard(key)
        return units


@dataclass
class _Job:
    job: int
    index: int
    ranks: tuple[int, ...]
    spec: JobSpec
    state: WorkerState | None = None
    declared_at: float = 0.0  # when its driver here declared: its state's clock's 0
    inbox: list[Any] = field(default_factory=list)  # its messages before the driver declared
    seconds: float = 0.0  # task seconds spent here
    units: int = 0
    bound: int = 1  # stage instances at most (HFSP's size estimate)
    trained: bool = False
    broken: bool = False  # its state failed here: wait for the end


class JobsWorker:
    """Pool worker ``worker`` of ``n_workers``, sharing its core among jobs under ``policy``.

    Events: :class:`Reserve`, :class:`Unreserve`, :class:`Probe`, :class:`JobStart`,
    :class:`JobEnd`, :class:`StopPool`, ``Envelope(job, message)`` (a job's message from
    another rank, or its ``TaskDone``/``TaskFailed``/``Resume`` here), :class:`Declared` and
    :class:`DriverEnded` (local: the driver on this rank), :class:`Tick` (local: each job's
    state reports its load; ``now`` is the handle's). Instructions: ``Send(pool rank,
    message)``, :class:`StartDriver`, :class:`RunJobTask` (at most one outstanding),
    :class:`YieldJob`, :class:`Release`, and ``StopPool`` itself when the pool ends.

    Guarantees: a job's events reach only its own state; a job's messages that arrive before
    its driver declared wait for it; messages of a job no longer here are dropped; a job whose
    state raises, or whose driver here gave up, is reported to rank 0 (:class:`DriverEnded`)
    and runs nothing more until its end (``Abort`` or :class:`JobEnd`) drops it.
    """

    def __init__(self, worker: int, n_workers: int, policy: str = "fair",
                 config: WorkerConfig | None = None, train_tasks: int = 5) -> None:
        self.worker = worker
        self.n_workers = n_workers
        self.queue = JobQueue(policy)
        # window_s 0: a job's load reports are for its progress lines; a pool never sized a
        # job's window from its pace, which its core shared with other jobs would set
        self.config = replace(config or WorkerConfig(), window_s=0.0)
        self.train_tasks = train_tasks
        self.jobs: dict[int, _Job] = {}
        # jobs with a reservation queued or asked for -> whether the job runs on one worker
        self.reserved: dict[int, bool] = {}
        self.running: tuple[int, Any] | None = None  # (key, unit) handed out
        self.users: dict[str, int] = {}
        self.binding: int | None = None  # the job asked for, until it started here or not
        self.deferred: list[int] = []  # reservation keys popped while binding
        # jobs whose state yielded (messages to leave first) and is not resumed yet: the core
        # picks nothing meanwhile (see _next)
        self.yielded: set[int] = set()
        self.stopped = False
        self._eid = 0
        self._cause = 0
        self._now = 0.0

    # ------------------------------------------------------------------ public
    def handle(self, event: Any, now: float = 0.0) -> list[Any]:
        """Apply one event at time ``now``; return the instructions (see the class)."""
        out: list[Any] = []
        self._cause = event.eid
        self._now = now
        kind = type(event)
        if kind is Envelope:
            self._on_envelope(event, now, out)
        elif kind is Reserve:
            self._on_reserve(event, now)
        elif kind is Unreserve:
            self.queue.remove_job(-event.job)
            self.reserved.pop(event.job, None)
            if -event.job in self.deferred:
                self.deferred.remove(-event.job)
            self._unbind(event.job, now)
        elif kind is Probe:
            out.append(Send(CONTROLLER, ProbeReply(self._next_eid(), event.job, self.worker,
                                                   self.load), self._cause))
        elif kind is JobStart:
            self._on_start(event, now, out)
        elif kind is Declared:
            self._on_declared(event, out)
        elif kind is JobEnd:
            self._end(event.job, event.reason, out)
        elif kind is DriverEnded:
            j = self.jobs.get(event.job)
            if j is not None:  # the driver here gave up while the job goes on: say so
                self._broken(j, event.message, out, event.clean)
        elif kind is Tick:
            self._on_tick(event, now, out)
        elif kind is StopPool:
            self.stopped = True
            out.append(event)
        else:
            raise TypeError(f"a pool worker cannot handle {event!r}")
        self._next(now, out)
        return out

    @property
    def load(self) -> int:
        """What a probe reads: jobs running here plus reservations waiting here."""
        return len(self.jobs) + len(self.reserved)

    def state_of(self, job: int) -> WorkerState | None:
        """The job's state here; None once the job ended here (a task of it handed out
        before its end must then not run)."""
        j = self.jobs.get(job)
        return None if j is None else j.state

    def user_id(self, user: str) -> int:
        return self.users.setdefault(user, len(self.users))

    # ------------------------------------------------------------------ events
    def _on_reserve(self, ev: Reserve, now: float) -> None:
        spec = ev.spec
        if ev.job in self.reserved or ev.job in self.jobs:
            return  # one reservation per job and worker is enough: the job runs here once
        self.reserved[ev.job] = spec.workers == 1 or self.n_workers == 1
        self.queue.add_job(-ev.job, self.user_id(spec.user), spec.priority, spec.weight, now)
        self.queue.push(-ev.job, _RESERVATION, now)

    def _on_start(self, ev: JobStart, now: float, out: list[Any]) -> None:
        self.reserved.pop(ev.job, None)
        self.queue.remove_job(-ev.job)
        spec = ev.spec
        self.jobs[ev.job] = _Job(ev.job, ev.index, ev.ranks, spec)
        self.queue.add_job(ev.job, self.user_id(spec.user), spec.priority, spec.weight, now)
        out.append(StartDriver(ev.job, ev.index + 1, len(ev.ranks) + 1, spec, self._cause))

    def _on_declared(self, ev: Declared, out: list[Any]) -> None:
        j = self.jobs.get(ev.job)
        if j is None or j.state is not None or j.broken:
            return  # ended meanwhile (its driver is released), or declared twice
        program: Program = ev.program
        j.declared_at = self._now
        try:
            j.state = WorkerState(program, j.index, len(j.ranks), self.config)
            j.bound = instance_bound(j.state.program.ops)
            self._apply(j, j.state.start(), out)
            inbox, j.inbox = j.inbox, []
            for msg in inbox:
                if j.state is None or j.broken:
                    break
                self._apply(j, j.state.handle(msg), out)
        except Exception as exc:  # noqa: BLE001 - one job's failure must not end the pool
            self._broken(j, f"{type(exc).__name__}: {exc}", out)
            return
        self._started(j, self._now)

    def _on_envelope(self, ev: Envelope, now: float, out: list[Any]) -> None:
        msg = ev.message
        kind = type(msg)
        if kind is TaskDone or kind is TaskFailed:
            self._task_finished(ev.job, msg, now)
        j = self.jobs.get(ev.job)
        if j is None:
            return  # a job that ended here: its late messages and task have nowhere to go
        if kind is Shutdown:
            self._end(ev.job, None, out)
            return
        if kind is Abort:  # also for a broken job: its end is what it waits for
            self._end(ev.job, msg.reason, out)
            return
        if j.broken:
            return
        if j.state is None:
            j.inbox.append(msg)
            return
        if not self._handle(j, msg, out):
            return
        if self.binding == ev.job:
            self._started(j, now)
        if kind is TaskDone and self.queue.policy == "hfsp" and not j.trained:
            self._train(j, now)

    def _on_tick(self, ev: Tick, now: float, out: list[Any]) -> None:
        for j in self.jobs.values():
            if j.state is not None and not j.broken:
                self._handle(j, replace(ev, now=now - j.declared_at), out)

    def _handle(self, j: _Job, msg: Any, out: list[Any]) -> bool:
        """Give ``msg`` to the declared job ``j``'s state and carry out what it says; whether
        that went well. A failure breaks that job alone (:meth:`_broken`), not the pool."""
        assert j.state is not None
        try:
            self._apply(j, j.state.handle(msg), out)
        except Exception as exc:  # noqa: BLE001 - one job's failure must not end the pool
            self._broken(j, f"{type(exc).__name__}: {exc}", out)
            return False
        return True

    def _task_finished(self, job: int, msg: Any, now: float) -> None:
        if self.running is not None and self.running[0] == job:
            self.running = None
        seconds = getattr(msg, "seconds", None) or 0.0
        self.queue.finished(job, seconds, now)
        j = self.jobs.get(job)
        if j is not None:
            j.seconds += seconds
            j.units += 1

    def _train(self, j: _Job, now: float) -> None:
        """HFSP's training phase: after the job's first ``train_tasks`` tasks here, its size is
        its seconds per retired stage instance times its instance bound."""
        st = j.state
        assert st is not None
        retired = min(st.live) if st.live else st.seq
        if j.units < self.train_tasks or retired < 1:
            return
        j.trained = True
        total = j.seconds / retired * j.bound
        self.queue.set_estimate(j.job, total - j.seconds, now)

    # ------------------------------------------------------------------ helpers
    def _apply(self, j: _Job, instrs: list[Any], out: list[Any]) -> None:
        """Carry a job's instructions over to the pool: job ranks become pool ranks, its task
        waits in the queue, a yield becomes the job's. Every event handled resumes a state
        that yielded (see :class:`~canary.messages.Yield`), so the job is marked yielded only
        while the latest instructions end it with one."""
        self.yielded.discard(j.job)
        for ins in instrs:
            kind = type(ins)
            if kind is Send:
                dest = CONTROLLER if ins.dest == CONTROLLER else j.ranks[ins.dest - 1]
                out.append(Send(dest, Envelope(j.job, ins.message), ins.cause))
            elif kind is Yield:
                self.yielded.add(j.job)
                out.append(YieldJob(j.job, ins.cause))
            else:  # RunTask
                self.queue.push(j.job, ins.task, self._now)

    def _next(self, now: float, out: list[Any]) -> None:
        """Hand out the next unit the policy picks while the core is free.

        Not while a job here has yielded: its state stopped only so that its messages leave
        first, and its next task comes with the ``Resume`` that follows at once. Picking
        before it would find that job's queue empty although it is busy, and the fair
        policy would then restart it at the virtual time of the job picked instead, losing
        its credit: with a yield after each task (a task whose output another worker
        waits for) every weight gets the same share."""
        while self.running is None and len(self.queue) and not self.yielded:
            got = self.queue.pop(now)
            assert got is not None
            key, unit = got
            if key < 0:  # a reservation reached the front: ask for the job
                self.queue.finished(key, 0.0, now)
                if self.binding is not None:
                    self.deferred.append(key)  # still registered: queued again on unbind
                    continue
                self.queue.remove_job(key)
                if self.reserved.get(-key, False):
                    self.binding = -key
                out.append(Send(CONTROLLER, Request(self._next_eid(), -key, self.worker),
                                self._cause))
                continue
            self.running = (key, unit)
            out.append(RunJobTask(key, unit, self._cause))

    def _broken(self, j: _Job, message: str, out: list[Any], clean: bool = False) -> None:
        if j.broken:
            return
        j.broken = True
        self.yielded.discard(j.job)
        self.queue.remove_job(j.job, self._now)
        j.state = None
        self._unbind(j.job, self._now)
        out.append(Send(CONTROLLER, DriverEnded(self._next_eid(), j.job, self.worker, message,
                                                clean), self._cause))

    def _end(self, job: int, reason: str | None, out: list[Any]) -> None:
        j = self.jobs.pop(job, None)
        self.yielded.discard(job)
        self.queue.remove_job(-job)
        self.reserved.pop(job, None)
        if j is None:
            return
        self.queue.remove_job(job, self._now, finished=reason is None)
        if self.running is not None and self.running[0] == job:
            self.running = None  # its task handed out is not run (or its end is ignored)
        self._unbind(job, self._now)
        out.append(Release(job, reason, JobAborted, None, self._cause))

    def _unbind(self, job: int, now: float) -> None:
        """The job this worker asked for was declined, started here or ended: queue again
        the reservations popped meanwhile, in the order they were popped."""
        if self.binding != job:
            return
        self.binding = None
        deferred, self.deferred = self.deferred, []
        for key in deferred:
            if key in self.queue:
                self.queue.push(key, _RESERVATION, now)

    def _started(self, j: _Job, now: float) -> None:
        if self.binding == j.job and j.state is not None and j.state.map is not None:
            self._unbind(j.job, now)

    def _next_eid(self) -> int:
        self._eid += 1
        return self._eid
