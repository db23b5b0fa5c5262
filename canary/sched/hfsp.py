"""Job-level size-based scheduling: PS (fair), SRPT and HFSP (SRPT with aging).

These policies decide *which job's* pending task a free slot runs next.  They
are pure, deterministic objects; every operation costs O(log n) amortised in
the number of jobs (lazy-deletion heaps).

Protocol (all four classes): ``add_job(job, num_tasks, now, estimate=None)``,
``dispatch(now) -> job | None`` (marks one pending task of the returned job as
started), ``task_finished(job, now, duration)``, ``remove_job(job, now=None,
finished=False)``, ``len(sched)`` = jobs with pending tasks.  Times must not go
backwards (ValueError).

Size estimates (work = sum of task durations).  If ``estimate`` is given it is
used as is and never refined: the simulator injects ``true size * lognormal
error`` this way to reproduce HFSP's estimation-error study.  Otherwise the
initial estimate is ``num_tasks * prior`` (prior = mean duration of all tasks
finished so far, ``default_task_size`` before any), and once the job's first
``sample_tasks`` tasks have finished it becomes ``mean(their durations) *
num_tasks`` -- HFSP's training phase.

HFSP follows PSBS (Dell'Amico et al., "PSBS: Practical Size-Based
Scheduling", IEEE TC 2016): a virtual processor-sharing system of the given
``capacity`` runs every job with its estimated size; real slots go to the job
that would finish first in the virtual system.  Jobs whose virtual run ended
but whose real run did not ("late" jobs, under-estimated) share the slots
among themselves, so one badly under-estimated job cannot monopolise the
cluster and new jobs age past it: no job starves.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from canary.sched.item import Item

__all__ = [
    "JOB_POLICIES",
    "FifoJobs",
    "HfspJobs",
    "HfspQueue",
    "PsJobs",
    "SrptJobs",
    "make_job_scheduler",
]


@dataclass(slots=True)
class _Job:
    job: int
    seq: int
    num_tasks: int
    estimate: float
    fixed_estimate: bool
    pending: int
    running: int = 0
    finished: int = 0
    attained: float = 0.0
    sample: list[float] = field(default_factory=list)
    version: int = 0
    vfinish: float = 0.0
    late: bool = False
    vdone: bool = False
    late_from: float = 0.0  # its attained service when it became late


class _Base:
    def __init__(self, default_task_size: float = 1.0, sample_tasks: int = 5) -> None:
        if not default_task_size > 0:
            raise ValueError(f"default_task_size must be > 0, got {default_task_size}")
        if sample_tasks < 1:
            raise ValueError(f"sample_tasks must be >= 1, got {sample_tasks}")
        self.default_task_size = default_task_size
        self.sample_tasks = sample_tasks
        self._jobs: dict[int, _Job] = {}
        self._seq = 0
        self._now = float("-inf")
        self._done_tasks = 0
        self._done_work = 0.0
        self._with_pending = 0

    def _clock(self, now: float) -> None:
        if now < self._now:
            raise ValueError(f"time went backwards: {now} < {self._now}")
        self._now = now

    def _prior(self) -> float:
        return self._done_work / self._done_tasks if self._done_tasks else self.default_task_size

    def __len__(self) -> int:
        return self._with_pending

    def __contains__(self, job: int) -> bool:
        return job in self._jobs

    def estimate(self, job: int) -> float:
        """Current size estimate of a known job (KeyError if unknown)."""
        return self._jobs[job].estimate

    def add_job(
        self,
        job: int,
        num_tasks: int,
        now: float,
        estimate: float | None = None,
        pending: int | None = None,
    ) -> None:
        """Register a job of ``num_tasks`` tasks, ``pending`` of them runnable now.

        ``pending`` defaults to ``num_tasks``; a worker that receives a job's
        tasks one by one passes 0 and calls :meth:`add_tasks`.  Raises
        ValueError for a duplicate job id, ``num_tasks < 1``, a negative
        estimate or ``pending`` outside ``0..num_tasks``. A policy may take back a job it
        still remembers instead (:meth:`_take_back`).
        """
        self._clock(now)
        if self._take_back(job, now, pending):
            return
        if job in self._jobs:
            raise ValueError(f"job {job} is already scheduled")
        if num_tasks < 1:
            raise ValueError(f"a job needs at least one task, got {num_tasks}")
        if estimate is not None and estimate < 0:
            raise ValueError(f"size estimate must be >= 0, got {estimate}")
        pend = num_tasks if pending is None else pending
        if not 0 <= pend <= num_tasks:
            raise ValueError(f"pending must be in 0..{num_tasks}, got {pend}")
        fixed = estimate is not None
        est = float(estimate) if estimate is not None else num_tasks * self._prior()
        self._seq += 1
        j = _Job(job, self._seq, num_tasks, est, fixed, pending=pend)
        self._jobs[job] = j
        if pend:
            self._with_pending += 1
        self._on_add(j)

    def add_tasks(self, job: int, count: int = 1) -> None:
        """Make ``count`` more tasks of a known job runnable (KeyError if unknown)."""
        j = self._jobs[job]
        if count < 1 or j.pending + j.running + j.finished + count > j.num_tasks:
            raise ValueError(f"job {job} cannot take {count} more tasks")
        if j.pending == 0:
            self._with_pending += 1
        j.pending += count
        self._on_more(j)

    def remove_job(self, job: int, now: float | None = None, finished: bool = False) -> None:
        """Forget a job at time ``now`` (default: the latest time given); KeyError if unknown.

        ``finished``: the job is done (e.g. a worker ran every task of it that it got).
        Otherwise it was withdrawn: cancelled, failed, or registered again with a new
        estimate. The two differ only for HFSP's virtual system (see :class:`HfspJobs`).
        """
        if now is not None:
            self._clock(now)
        j = self._jobs.pop(job)
        if j.pending:
            self._with_pending -= 1
        j.pending = 0
        self._on_remove(j, finished)

    def dispatch(self, now: float) -> int | None:
        """Pick the job whose next pending task should run; None if none pending."""
        self._clock(now)
        j = self._choose()
        if j is None:
            return None
        j.pending -= 1
        j.running += 1
        if j.pending == 0:
            self._with_pending -= 1
        self._on_dispatch(j)
        return j.job

    def task_finished(self, job: int, now: float, duration: float) -> None:
        """Record a finished task of ``job`` that ran for ``duration``.

        Raises KeyError for an unknown job, ValueError if the job has no
        running task or the duration is negative.  The job is forgotten once
        its last task finishes.
        """
        self._clock(now)
        j = self._jobs[job]
        if j.running <= 0:
            raise ValueError(f"job {job} has no running task")
        if duration < 0:
            raise ValueError(f"task duration must be >= 0, got {duration}")
        j.running -= 1
        j.finished += 1
        j.attained += duration
        self._done_tasks += 1
        self._done_work += duration
        old = j.estimate
        if not j.fixed_estimate and len(j.sample) < self.sample_tasks:
            j.sample.append(duration)
            if len(j.sample) == min(self.sample_tasks, j.num_tasks):
                j.estimate = sum(j.sample) / len(j.sample) * j.num_tasks
        if j.finished == j.num_tasks:
            del self._jobs[job]
        self._on_finish(j, old)

    # Hooks for subclasses.
    def _take_back(self, job: int, now: float, pending: int | None) -> bool:
        """Registering ``job``: take it back as it was, if the policy still remembers it
        (True), rather than add it as a new job (False)."""
        return False

    def _on_add(self, j: _Job) -> None:
        raise NotImplementedError

    def _choose(self) -> _Job | None:
        raise NotImplementedError

    def _on_dispatch(self, j: _Job) -> None:
        pass

    def _on_more(self, j: _Job) -> None:
        pass

    def _on_finish(self, j: _Job, old_estimate: float) -> None:
        pass

    def _on_remove(self, j: _Job, finished: bool) -> None:
        pass


class _KeyedHeap(_Base):
    """Jobs with pending tasks in a lazy heap ordered by ``_key``."""

    def __init__(self, default_task_size: float = 1.0, sample_tasks: int = 5) -> None:
        super().__init__(default_task_size, sample_tasks)
        self._heap: list[tuple[float, int, int, _Job]] = []

    def _key(self, j: _Job) -> float:
        raise NotImplementedError

    def _push(self, j: _Job) -> None:
        j.version += 1
        if j.pending > 0:
            heapq.heappush(self._heap, (self._key(j), j.seq, j.version, j))

    def _on_add(self, j: _Job) -> None:
        self._push(j)

    def _on_more(self, j: _Job) -> None:
        self._push(j)

    def _choose(self) -> _Job | None:
        h = self._heap
        while h:
            _, _, ver, j = h[0]
            if ver == j.version and j.pending > 0:
                return j
            heapq.heappop(h)
        return None


class FifoJobs(_KeyedHeap):
    """Jobs in arrival order (Hadoop's default FIFO)."""

    name = "fifo"

    def _key(self, j: _Job) -> float:
        return 0.0


class PsJobs(_KeyedHeap):
    """Processor sharing / max-min fair: the job with fewest running tasks."""

    name = "ps"

    def _key(self, j: _Job) -> float:
        return float(j.running)

    def _on_dispatch(self, j: _Job) -> None:
        self._push(j)

    def _on_finish(self, j: _Job, old_estimate: float) -> None:
        self._push(j)


class SrptJobs(_KeyedHeap):
    """SRPT on estimates: smallest ``max(estimate - attained, 0)`` first.

    With under-estimates a job's remaining estimate reaches 0 and it then
    outranks every newcomer until it really finishes -- the weakness HFSP's
    aging removes.
    """

    name = "srpt"

    def _key(self, j: _Job) -> float:
        return max(j.estimate - j.attained, 0.0)

    def _on_finish(self, j: _Job, old_estimate: float) -> None:
        self._push(j)


class HfspJobs(_Base):
    """HFSP / PSBS: SRPT-like order by virtual PS finish time, with aging.

    ``capacity`` is the number of slots the virtual PS system shares among
    the jobs (> 0).  Virtual time advances at ``capacity / n`` per time unit
    for the n jobs still running virtually.

    A job that finished for real stays in the virtual system until its virtual
    finish, as in PSBS (its reference simulator's ``dequeue``): the virtual
    system is the PS schedule of the jobs at their estimated sizes, and a job
    done early was served ahead of it, not made smaller. A job removed without
    ``finished`` (cancelled, failed) leaves the virtual system at once, as it
    would leave PS: it will never be served again, and a share kept for it
    would slow virtual time for the others, so that newcomers would arrive at
    an earlier virtual time and pass them.

    A job registered again while it is still in the virtual system after being removed as
    finished is the same job with more tasks (a worker that ran every task of it it had got,
    then got another): it takes up its place again -- virtual finish, service and task
    counts -- instead of joining the virtual system a second time. So a job is in the
    virtual system once while it has work here, and leaves it once. Past its virtual finish
    it is no longer remembered, and a registration is a new job.
    """

    name = "hfsp"

    def __init__(
        self, capacity: float = 1.0, default_task_size: float = 1.0, sample_tasks: int = 5
    ) -> None:
        super().__init__(default_task_size, sample_tasks)
        if not capacity > 0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        self.capacity = float(capacity)
        self._v = 0.0  # virtual service each virtual job has received
        self._t = 0.0
        self._nv = 0
        # removed as finished, not yet at their virtual finish: they may get more tasks
        self._finished_ahead: dict[int, _Job] = {}
        self._vheap: list[tuple[float, int, int, _Job]] = []  # virtual completions
        self._rheap: list[tuple[float, int, int, _Job]] = []  # non-late, by vfinish
        # late, by running tasks, then by service since it became late
        self._lheap: list[tuple[int, float, float, int, _Job]] = []

    def _advance(self, now: float) -> None:
        """Run the virtual PS system up to ``now``, marking jobs that finish in it."""
        vh = self._vheap
        while self._nv > 0:
            g, _, ver, j = vh[0]
            if ver != j.version or j.vdone:
                heapq.heappop(vh)
                continue
            rate = self.capacity / self._nv
            t_hit = self._t + (g - self._v) / rate
            if t_hit > now:
                self._v += (now - self._t) * rate
                self._t = now
                return
            heapq.heappop(vh)
            self._v = max(self._v, g)
            self._t = max(self._t, t_hit)
            self._nv -= 1
            self._virtual_done(j)
        self._t = max(self._t, now)

    def _virtual_done(self, j: _Job) -> None:
        j.vdone = True
        if self._finished_ahead.get(j.job) is j:
            del self._finished_ahead[j.job]
        # still running for real: it is late (the id of a job that ran all its tasks, or was
        # withdrawn, may be registered again, as another job)
        elif self._jobs.get(j.job) is j:
            j.late = True
            j.late_from = j.attained
            self._push_late(j)

    def _push_late(self, j: _Job) -> None:
        # Late jobs share the slots (PSBS): the fewest running tasks first, and among equals
        # the least service since it became late. Where slots are few -- one, on a pool's
        # worker, whose task ends before the next pick -- every late job has none running
        # at a pick, and the oldest virtual finish would win every time: a badly
        # under-estimated large job would hold the core until it ended, new jobs behind it.
        if j.pending > 0:
            heapq.heappush(self._lheap, (j.running, j.attained - j.late_from, j.vfinish,
                                         j.seq, j))

    def _push_real(self, j: _Job) -> None:
        heapq.heappush(self._rheap, (j.vfinish, j.seq, j.version, j))

    def _take_back(self, job: int, now: float, pending: int | None) -> bool:
        """A job removed as finished that is still in the virtual system comes back as it was,
        ``pending`` (default: its tasks not yet run) of its tasks runnable; the ``num_tasks``
        and ``estimate`` it is registered with are those it was first given."""
        self._advance(now)  # it may have reached its virtual finish by now, and so have left
        j = self._finished_ahead.get(job)
        if j is None:
            return False
        not_run = j.num_tasks - j.running - j.finished
        pend = not_run if pending is None else pending
        if not 0 <= pend <= not_run:
            raise ValueError(f"pending must be in 0..{not_run}, got {pend}")
        del self._finished_ahead[job]
        self._jobs[job] = j
        if pend:
            self.add_tasks(job, pend)
        return True

    def _on_add(self, j: _Job) -> None:
        self._advance(self._now)
        j.vfinish = self._v + j.estimate
        self._nv += 1
        heapq.heappush(self._vheap, (j.vfinish, j.seq, j.version, j))
        self._push_real(j)

    def _choose(self) -> _Job | None:
        self._advance(self._now)
        lh = self._lheap
        while lh:
            running, since, _, _, j = lh[0]
            if j.pending > 0 and running == j.running and since == j.attained - j.late_from:
                return j
            heapq.heappop(lh)
        rh = self._rheap
        while rh:
            _, _, ver, j = rh[0]
            if ver == j.version and j.pending > 0 and not j.late:
                return j
            heapq.heappop(rh)
        return None

    def _on_dispatch(self, j: _Job) -> None:
        if j.late:
            self._push_late(j)

    def _on_more(self, j: _Job) -> None:
        if j.late:
            self._push_late(j)
        else:
            self._push_real(j)

    def _on_finish(self, j: _Job, old_estimate: float) -> None:
        self._advance(self._now)
        if j.late:
            self._push_late(j)
            return
        if j.estimate != old_estimate and not j.vdone:
            # The estimate changed after training: move the virtual finish by
            # the difference, as HFSP does, keeping the service already given.
            j.version += 1
            j.vfinish += j.estimate - old_estimate
            heapq.heappush(self._vheap, (j.vfinish, j.seq, j.version, j))
            self._push_real(j)
            self._advance(self._now)

    def _on_remove(self, j: _Job, finished: bool) -> None:
        if j.vdone:
            return
        if finished:
            self._finished_ahead[j.job] = j
            return
        # Withdrawn: it leaves PS now. Run the virtual system to now with it first, since it
        # shared the slots until now; its heap entries are skipped once it is vdone.
        self._advance(self._now)
        if not j.vdone:
            j.vdone = True
            self._nv -= 1

    def virtual_time(self, now: float) -> float:
        """Advance the virtual PS system to ``now``; return each job's virtual service."""
        self._clock(now)
        self._advance(now)
        return self._v

    @property
    def virtual_jobs(self) -> int:
        """Jobs still running in the virtual PS system."""
        return self._nv

    def is_late(self, job: int) -> bool:
        return self._jobs[job].late


JOB_POLICIES = ("fifo", "ps", "srpt", "hfsp")


def make_job_scheduler(
    name: str, capacity: float = 1.0, default_task_size: float = 1.0, sample_tasks: int = 5
) -> FifoJobs | PsJobs | SrptJobs | HfspJobs:
    """Build a job-level policy by name; ValueError for an unknown name."""
    if name == "fifo":
        return FifoJobs(default_task_size, sample_tasks)
    if name == "ps":
        return PsJobs(default_task_size, sample_tasks)
    if name == "srpt":
        return SrptJobs(default_task_size, sample_tasks)
    if name == "hfsp":
        return HfspJobs(capacity, default_task_size, sample_tasks)
    raise ValueError(f"unknown job policy {name!r}; choose from {', '.join(JOB_POLICIES)}")


class HfspQueue:
    """A :class:`~canary.sched.queues.WorkerQueue` ordered by a job-level policy.

    Items are grouped per job (FIFO within a job); ``pop`` serves the job the
    policy picks.  The first item of a job registers it with
    ``item.job_tasks`` tasks and ``item.size_hint`` as a fixed estimate.
    Callers must report every popped item's completion via
    :meth:`task_finished` so estimates and fairness stay right.
    """

    name = "hfsp"

    def __init__(self, policy: str = "hfsp", capacity: float = 1.0, **kwargs: float) -> None:
        self.jobs = make_job_scheduler(policy, capacity=capacity, **kwargs)  # type: ignore[arg-type]
        self._items: dict[int, deque[Item]] = {}
        self._open: dict[int, int] = {}  # queued or running items per job
        self._n = 0

    def push(self, item: Item, now: float) -> None:
        q = self._items.get(item.job)
        if q is None:
            q = self._items[item.job] = deque()
            if item.job not in self.jobs:
                self.jobs.add_job(item.job, item.job_tasks, now, item.size_hint, pending=0)
                self._open[item.job] = 0
        q.append(item)
        self._open[item.job] += 1
        self.jobs.add_tasks(item.job)
        self._n += 1

    def pop(self, now: float) -> Item | None:
        if not self._n:
            return None
        job = self.jobs.dispatch(now)
        if job is None:
            raise ValueError("queue holds more items than the jobs' declared job_tasks")
        q = self._items[job]
        item = q.popleft()
        if not q:
            del self._items[job]
        self._n -= 1
        return item

    def __len__(self) -> int:
        return self._n

    def task_finished(self, item: Item, now: float, duration: float) -> None:
        self.jobs.task_finished(item.job, now, duration)
        left = self._open[item.job] - 1
        if left:
            self._open[item.job] = left
        else:
            # This worker saw all of the job's tasks it will get (as far as it
            # knows); forget it so per-worker state does not grow forever.
            del self._open[item.job]
            if item.job in self.jobs:
                self.jobs.remove_job(item.job, now, finished=True)
