"""One rank of a pool: ``mpiexec -n N+1 python -m mpi4py -m canary.pool.host --dir DIR ...``.

Rank 0 reads submissions from the pool directory (:mod:`canary.pool.spool`), places and
controls the jobs (:class:`canary.controller.jobs.JobsController`); ranks 1..N are workers
(:class:`canary.worker.jobs.JobsWorker`). Both only carry out their state machine's
instructions, as the single-job runtimes do.

How a submitted driver runs unchanged: wherever the job is placed, the rank starts the driver
in a thread of its own. In that thread ``mpi4py.MPI.COMM_WORLD`` is the job's communicator
(rank 0 the job's controller, ranks 1..M its workers; it offers ``Get_rank``, ``Get_size`` and
``bcast`` from rank 0) and ``canary.run(program, comm)`` hands the program to this rank's job
state and waits for the job's end: rank 0 gets its :class:`~canary.JobResult`, a failure
raises as under ``canary run``. What the thread prints goes to the job's log. The script's
module is imported once per rank and its ``main(argv)`` called per job (a script without
``main`` runs top to bottom as ``__main__``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import math
import os
import queue
import runpy
import sys
import threading
import time
import traceback
import types
import weakref
from dataclasses import replace
from itertools import count
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from mpi4py import MPI

import canary
import canary.mpi_runner
from canary.controller.jobs import JobsController
from canary.env import PROGRESS_ENV, env_number
from canary.errors import (
    CanaryError,
    DeclarationError,
    JobAborted,
    TaskError,
    user_error_line,
)
from canary.idle import freeze_startup_objects, tight_timer_slack
from canary.messages import (
    CONTROLLER,
    Failed,
    ReportPart,
    Resume,
    Send,
    Tick,
    local_event_id,
    run_callback,
)
from canary.mpi_transport import Recycler
from canary.pool.messages import (
    Bcast,
    Cancel,
    Declared,
    DriverEnded,
    Envelope,
    JobCallback,
    JobNote,
    JobSpec,
    Release,
    RunJobTask,
    StartDriver,
    StopPool,
    Submit,
    YieldJob,
)
from canary.pool.spool import Spool, read_json, write_json
from canary.pool.transport import JobTransport
from canary.result import JobResult
from canary.sched.placement import PLACEMENT_POLICIES
from canary.sched.queues import QUEUE_POLICIES
from canary.sentinel import is_running
from canary.worker.config import WorkerConfig
from canary.worker.execute import run_task
from canary.worker.jobs import JobsWorker

_local = threading.local()  # .ctx: the JobContext of a driver thread; .log: where output goes
SCAN_S = 0.01  # how often rank 0 looks at the pool directory (submitters also wake it)
STOP_NOW_GRACE_S = 5.0  # how long `cluster stop --now` waits for cancelled drivers
WAIT_NOTE_S = 10.0  # a job placing this long is told which jobs hold the workers
# A rank with jobs polls MPI at least this often (what `canary run`'s workers do), an empty
# one sleeps longer: a placement or job message then waits at most this long to be seen.
ACTIVE_SLEEP_S = 2.5e-4
IDLE_SLEEP_S = 1e-3
# Driver threads and the rank's loop share the GIL: a thread that waits for it waits up to
# the switch interval (5 ms by default) whenever the loop polls without sleeping.
SWITCH_INTERVAL_S = 5e-4
POOL_FUSE_MAX_S = 5e-3  # the longest fused stretch of a pool job
# How often rank 0 gives the jobs' controllers the time, on which their progress lines are
# due: as often as canary run's controller gets its Tick
TICK_S = 0.1


# ---------------------------------------------------------------- output of the jobs
class JobLog:
    """A job's log file on this rank, opened at the first write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in close()
            self._file.write(text)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class _Router(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a pool rank: a thread running for a job writes to the
    job's log, everything else to the real stream."""

    def __init__(self, real: TextIO) -> None:
        self.real = real

    def write(self, text: str) -> int:
        log = getattr(_local, "log", None)
        if log is None:
            return self.real.write(text)
        log.write(text)
        return len(text)

    def flush(self) -> None:
        if getattr(_local, "log", None) is None:
            self.real.flush()

    def fileno(self) -> int:
        return self.real.fileno()


# ---------------------------------------------------------------- the driver's view
class JobComm:
    """The communicator a driver sees in a pool: rank ``rank`` of ``size`` (0: the job's
    controller). Drivers exchange nothing but a ``bcast`` from rank 0; any other MPI call
    raises NotImplementedError saying so."""

    def __init__(self, ctx: JobContext) -> None:
        # a proxy, not the context: the two made a cycle, which kept rank 0's copy of the
        # job's result (its context's outcome) until Python's next full collection
        self._ctx = weakref.proxy(ctx)

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self._ctx.rank

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's name
        return self._ctx.size

    @property
    def rank(self) -> int:
        return self._ctx.rank

    @property
    def size(self) -> int:
        return self._ctx.size

    def bcast(self, value: Any, root: int = 0) -> Any:
        if root != 0:
            raise NotImplementedError("a job in a canary pool can bcast from rank 0 only")
        return self._ctx.bcast(value)

    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(
            f"a driver in a canary pool gets a communicator with Get_rank, Get_size and bcast "
            f"from rank 0 only, not {name}: run drivers that talk MPI themselves with "
            "`canary run`")


class _MPIProxy(types.ModuleType):
    """``mpi4py.MPI`` as drivers see it: the real module, except that ``COMM_WORLD`` in a
    driver thread is the job's communicator."""

    def __init__(self, real: types.ModuleType) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__["_real"] = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_real"], name)

    @property
    def COMM_WORLD(self) -> Any:  # noqa: N802 - mpi4py's name
        ctx = getattr(_local, "ctx", None)
        return self.__dict__["_real"].COMM_WORLD if ctx is None else ctx.comm


class JobContext:
    """A job as its driver thread on this rank sees it, and how the host releases it."""

    def __init__(self, host: Any, job: int, rank: int, size: int, spec: JobSpec,
                 log: JobLog) -> None:
        self.host = host
        self.job = job
        self.rank = rank
        self.size = size
        self.spec = spec
        self.log = log
        self.comm = JobComm(self)
        self.declared = False
        self.outcome: Any = None  # the result, or the exception to raise
        self.released = threading.Event()
        self._cond = threading.Condition()
        self._bcasts: list[Any] = []

    def run(self, program: Any) -> JobResult | None:
        """``canary.run`` in the driver thread: hand over the program, wait for the end."""
        if self.declared:
            # a DeclarationError: the driver's mistake, said in one line as canary run says one
            raise DeclarationError("canary.run called a second time: a pool job runs one "
                                   "program (submit each program as its own job, or run this "
                                   "driver with `canary run`)")
        if not self.released.is_set():
            self.declared = True
            self.host.post(("declared", self.job, program))
        self.released.wait()
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def bcast(self, value: Any) -> Any:
        if self.rank == 0:
            self.host.post(("bcast", self.job, value))
            return value
        with self._cond:
            while not self._bcasts and not self.released.is_set():
                self._cond.wait(0.5)
            if self._bcasts:
                return self._bcasts.pop(0)
        raise JobAborted(str(self.outcome) if self.outcome is not None else "the job ended")

    def deliver(self, value: Any) -> None:
        with self._cond:
            self._bcasts.append(value)
            self._cond.notify_all()

    def release(self, outcome: Any) -> None:
        if self.released.is_set():
            return
        self.outcome = outcome
        self.released.set()
        with self._cond:
            self._cond.notify_all()


def pool_run(program: Any, comm: Any = None, window: int = 64, trace: str | None = None,
             balance: bool | None = None) -> JobResult | None:
    """``canary.run`` on a pool rank: in a driver thread, the job's; elsewhere the original."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        return _ORIGINAL_RUN(program, comm, window=window, trace=trace, balance=balance)
    if trace and ctx.rank == 0:
        print("canary pool: --trace is not available for a pool job; no trace written",
              file=sys.stderr)
    return ctx.run(program)


_ORIGINAL_RUN = canary.mpi_runner.run
_MODULES: dict[tuple[str, int], types.ModuleType] = {}
_MODULES_LOCK = threading.Lock()


def _load(script: str) -> types.ModuleType | None:
    """The script's module (imported once per rank and version of the file), or None if it
    has no ``main`` (then it is run as ``__main__`` each time)."""
    path = Path(script).resolve()
    key = (str(path), path.stat().st_mtime_ns)
    with _MODULES_LOCK:
        if key in _MODULES:
            return _MODULES[key]
        if (path.parent / "__init__.py").exists():
            # under its package name, as `canary run` runs it (numba's cache keys on it)
            root = str(path.parent.parent)
            if root not in sys.path:
                sys.path.insert(0, root)
            name = f"{path.parent.name}.{path.stem}"
            module = importlib.import_module(name)
            loaded = Path(module.__file__ or "").resolve()
            if loaded != path:
                # another job's file of the same folder and file name holds the name: running
                # it would run the other job's code, with its answer
                raise CanaryError(
                    f"{path} is imported as {name}, the name of {loaded}, which this pool "
                    f"has already run; a pool imports each driver under its package's name "
                    f"(numba's cache keys on it), so rename the folder or the file")
            if any(k[0] == str(path) for k in _MODULES):  # the file changed: read it again
                module = importlib.reload(module)
        else:
            if "def main(" not in path.read_text():
                return None  # a plain script: runs top to bottom each time
            spec = importlib.util.spec_from_file_location(f"_canary_job_{path.stem}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        _MODULES[key] = module
        return module


def _driver_end(code: int, error: str | None) -> str:
    """Why a job cannot go on where its driver ended early: its exception, or its status."""
    if error is not None:
        return f"its driver failed: {error}"
    return f"its driver exited with status {code} before the job ended"


def _driver(ctx: JobContext) -> None:
    """A driver thread: run the job's script and say how it ended."""
    _local.ctx = ctx
    _local.log = ctx.log
    code: int = 0
    error: str | None = None
    spec = ctx.spec
    try:
        module = _load(spec.script)
        if module is not None and hasattr(module, "main"):
            code = int(module.main(list(spec.args)) or 0)
        else:
            runpy.run_path(spec.script, run_name="__main__")
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            code = 1
        else:
            code = int(exc.code or 0)
    except BaseException as exc:  # noqa: BLE001 - reported as the job's failure
        line = user_error_line(Path(spec.script).stem, exc)
        if isinstance(exc, (TaskError, JobAborted)):
            pass  # the job failed or was cancelled: the pool has said why in the job's log
        elif line is not None:  # a declaration mistake, as `canary run` says it
            print(line, file=sys.stderr)
        elif isinstance(exc, SyntaxError):  # the file, line and caret; not the pool's frames
            print("".join(traceback.format_exception_only(exc)), end="", file=sys.stderr)
        else:  # the driver's own code failed
            traceback.print_exc()
        error = f"{type(exc).__name__}: {exc}"
        code = 1
    finally:
        sys.stdout.flush()
        ctx.host.post(("exit", ctx.job, code, error))


def install() -> None:
    """Make this process a pool rank: route output by thread, give driver threads their job's
    communicator and ``canary.run``."""
    import mpi4py

    if not isinstance(sys.stdout, _Router):
        sys.stdout = _Router(sys.stdout)
        sys.stderr = _Router(sys.stderr)
    if not isinstance(mpi4py.MPI, _MPIProxy):
        proxy = _MPIProxy(MPI)
        mpi4py.MPI = proxy  # type: ignore[attr-defined]
        sys.modules["mpi4py.MPI"] = proxy
    canary.run = pool_run  # type: ignore[assignment]
    canary.mpi_runner.run = pool_run  # type: ignore[assignment]


# ---------------------------------------------------------------- the ranks' loops
class IdleWait:
    """How a pool rank waits between polls: a few quick polls, then sleeps doubling from
    ``min_sleep`` up to the cap the caller gives (as :class:`canary.idle.Backoff`), except
    that :meth:`wake` (a driver thread with a request, a submission) ends a sleep at once."""

    def __init__(self, min_sleep: float = 2e-5, spins: int = 20) -> None:
        self.min_sleep = min_sleep
        self.spins = spins
        self._event = threading.Event()
        self._idle = 0
        self._sleep = min_sleep

    def wake(self) -> None:
        self._event.set()

    def reset(self) -> None:
        self._idle = 0
        self._sleep = self.min_sleep

    def sleep(self, cap: float) -> None:
        self._idle += 1
        if self._idle <= self.spins:
            return
        if self._event.wait(min(self._sleep, cap)):
            self._event.clear()
            self.reset()
            return
        self._sleep = min(self._sleep * 2, cap)


class _Host:
    def __init__(self, comm: Any, spool: Spool) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.spool = spool
        self.tx = JobTransport(comm)
        self.inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.contexts: dict[int, JobContext] = {}
        self.ids = count(1)
        self.t0 = time.perf_counter()
        self.idle = IdleWait()

    def post(self, item: tuple[Any, ...]) -> None:
        """A driver thread's request to this rank's loop (run there, in order)."""
        self.inbox.put(item)
        self.idle.wake()

    def eid(self) -> int:
        return local_event_id(self.rank, next(self.ids))

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def drain(self) -> bool:
        """Act on what the driver threads asked for; whether there was anything."""
        got = False
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return got
            got = True
            self._local(item)

    def _local(self, item: tuple[Any, ...]) -> None:
        raise NotImplementedError

    def start_driver(self, ins: StartDriver, log: JobLog) -> None:
        ctx = JobContext(self, ins.job, ins.rank, ins.size, ins.spec, log)
        self.contexts[ins.job] = ctx
        threading.Thread(target=_driver, args=(ctx,), name=f"job-{ins.job}",
                         daemon=True).start()


class WorkerHost(_Host):
    """A worker rank: feed :class:`JobsWorker` and carry out what it says. With
    ``progress_s`` > 0 (the jobs' progress lines are printed) it gives it a :class:`Tick`
    every ``config.report_s``, with the seconds the rank waited with nothing to do since the
    last, for its jobs' load reports."""

    def __init__(self, comm: Any, spool: Spool, policy: str, config: WorkerConfig,
                 progress_s: float = 0.0) -> None:
        super().__init__(comm, spool)
        n = comm.Get_size() - 1
        # A task is never preempted, so a job's fused stretch is what another job's urgent
        # task may wait for: a pool keeps stretches to a few ms.
        config = replace(config, fuse_max_s=min(config.fuse_max_s, POOL_FUSE_MAX_S),
                         fuse_target_s=min(config.fuse_target_s, POOL_FUSE_MAX_S / 2))
        self.state = JobsWorker(self.rank - 1, n, policy, config)
        self.tx.recycler = Recycler(config.recycle_bytes)
        self.task: RunJobTask | None = None
        self.resume: list[int] = []
        self.report_s = config.report_s if progress_s > 0 else math.inf
        self.next_report = self.report_s  # on self.now()'s clock
        self.idle_s = 0.0  # waited with nothing to do since the last Tick

    def carry(self, instrs: list[Any]) -> None:
        for ins in instrs:
            kind = type(ins)
            if kind is Send:
                self.tx.send(ins.dest, ins.message)
            elif kind is RunJobTask:
                self.task = ins
            elif kind is YieldJob:
                self.resume.append(ins.job)
            elif kind is StartDriver:
                self.start_driver(ins, JobLog(self.spool.job_dir(ins.job) /
                                              f"rank-{self.rank}.log"))
            elif kind is Release:
                ctx = self.contexts.get(ins.job)
                if ctx is not None:
                    ctx.release(None if ins.reason is None else ins.error(ins.reason))

    def handle(self, event: Any) -> None:
        self.carry(self.state.handle(event, self.now()))

    def _take_messages(self) -> bool:
        """Handle every message that has arrived; whether there was one."""
        got = self.tx.poll()
        busy = got is not None
        while got is not None:
            msg = got[1]
            if type(msg) is Bcast:
                ctx = self.contexts.get(msg.job)
                if ctx is not None:
                    ctx.deliver(msg.value)
            else:
                self.handle(msg)
            got = self.tx.poll()
        return busy

    def _run_task(self) -> None:
        ins, self.task = self.task, None
        assert ins is not None
        job_state = self.state.state_of(ins.job)
        if job_state is None:  # the job ended since: its task is dropped
            return
        ctx = self.contexts.get(ins.job)
        _local.log = ctx.log if ctx is not None else None
        try:
            ev = run_task(job_state, ins.task, self.eid())
        finally:
            _local.log = None
        self.handle(Envelope(ins.job, ev))

    def loop(self) -> None:
        # Messages and tasks are handled in methods, not in this loop: a local of the loop
        # (the last message, a task's job state and result) lived on until the next one came,
        # and kept an ended job's partitions (300 MB a worker) after it ended.
        while not self.state.stopped:
            busy = self._take_messages()
            busy = self.drain() or busy
            while self.resume:
                job = self.resume.pop(0)
                self.handle(Envelope(job, Resume(self.eid())))
                busy = True
            if self.task is not None:
                self._run_task()
                busy = True
            if busy:
                self.idle.reset()
            else:
                waited = time.perf_counter()
                self.tx.progress()
                st = self.state
                self.idle.sleep(ACTIVE_SLEEP_S if st.jobs or st.reserved or self.contexts
                                else IDLE_SLEEP_S)
                self.idle_s += time.perf_counter() - waited
            now = self.now()
            if now >= self.next_report:
                self.next_report = now + self.report_s
                self.handle(Tick(self.eid(), now, self.idle_s))
                self.idle_s = 0.0
        self.tx.flush()

    def _local(self, item: tuple[Any, ...]) -> None:
        kind, job = item[0], item[1]
        ctx = self.contexts.get(job)
        if kind == "declared":
            self.handle(Declared(self.eid(), job, item[2]))
        elif kind == "exit":
            self.contexts.pop(job, None)
            if ctx is not None and ctx.log is not None:
                ctx.log.close()
            if ctx is not None and not ctx.released.is_set():
                why = _driver_end(item[2], item[3])
                clean = item[2] == 0 and item[3] is None and not ctx.declared
                self.handle(DriverEnded(self.eid(), job, self.rank - 1, why, clean))


class ControllerHost(_Host):
    """Rank 0: read the pool directory, feed :class:`JobsController`, run the jobs'
    callbacks, keep every job's status file. With ``progress_s`` > 0 each job prints a
    progress line every ``progress_s`` seconds into its log (its controller gets a
    :class:`Tick` every ``TICK_S``)."""

    def __init__(self, comm: Any, spool: Spool, policy: str, placement: str,
                 seed: int, d: float, progress_s: float = 0.0) -> None:
        super().__init__(comm, spool)
        self.n = comm.Get_size() - 1
        self.state = JobsController(self.n, placement, d, seed, progress_s)
        self.policy = policy
        self.placement = placement
        self.logs: dict[int, JobLog] = {}
        self.status: dict[int, dict[str, Any]] = {}
        self.cancelled: dict[int, str] = {}
        self.stopping: str | None = None
        self.stopping_since = 0.0
        self.next_scan = 0.0
        self.next_status = 0.0
        self.next_tick = 0.0 if progress_s > 0 else math.inf
        self.wait_noted: dict[int, float] = {}  # job -> its wait when last said
        self.scan_now = False

    def listen(self) -> None:
        """Read the directory as soon as a submitter on this host says there is something
        (:meth:`Spool.wake`), not only every ``SCAN_S``."""
        fd = self.spool.open_wake()
        if fd is None:
            return

        def run() -> None:
            while True:
                try:
                    if not os.read(fd, 4096):
                        return
                except OSError:
                    return
                self.scan_now = True
                self.idle.wake()

        threading.Thread(target=run, name="pool-wake", daemon=True).start()

    def write_pool(self, state: str) -> None:
        write_json(self.spool.pool_file, {
            "state": state, "workers": self.n, "policy": self.policy,
            "placement": self.placement, "pid": os.getpid(), "host": os.uname().nodename,
            "since": time.time()})

    def job_status(self, job: int, **fields: Any) -> None:
        st = self.status.setdefault(job, {"job": job})
        st.update(fields)
        write_json(self.spool.status_file(job), st)

    def note(self, job: int, line: str) -> None:
        log = self.logs.get(job)
        if log is not None:
            log.write(line + "\n")

    def carry(self, instrs: list[Any]) -> None:
        for ins in instrs:
            kind = type(ins)
            if kind is Send:
                self.tx.send(ins.dest, ins.message)
            elif kind is StartDriver:
                info = self.state.info(ins.job)
                self.job_status(ins.job, state="running", workers=list(info.workers),
                                started=time.time())
                self.start_driver(ins, self.logs[ins.job])
            elif kind is JobNote:
                self.note(ins.job, ins.line)
            elif kind is JobCallback:
                self._callback(ins)
            elif kind is Release:
                self._release(ins)

    def _callback(self, ins: JobCallback) -> None:
        _local.log = self.logs.get(ins.job)  # what the callback prints goes to the job's log
        try:
            failed = run_callback(ins.callback)
        finally:
            _local.log = None
        if failed is not None:  # that job fails alone, saying what canary run says
            self.carry(self.state.handle(Envelope(ins.job, Failed(self.eid(), -1, failed))))

    def _note_waiting(self, now: float) -> None:
        """Say in the log of each job that has waited ``WAIT_NOTE_S`` for workers (and again
        each time as long) which jobs hold them: a task is never preempted, so a long one
        holds its worker, and the waiting job said nothing for as long as it lasted."""
        running = [j for j in self.state.active if self.state.info(j).state == "running"]
        for job in self.state.active:
            st = self.status.get(job)
            if self.state.info(job).state != "placing" or st is None:
                continue
            waited = now - st.get("placing", now)
            said = self.wait_noted.get(job, 0.0)
            if waited >= WAIT_NOTE_S and waited - said >= WAIT_NOTE_S:
                self.wait_noted[job] = waited
                # a job that ended (cancelled) is gone from rank 0's list while its last task
                # may still run on its workers
                busy = ", ".join(f"{j} (on worker(s) "
                                 f"{', '.join(map(str, self.state.info(j).workers))})"
                                 for j in running) or ("none; a worker may still be running the "
                                                       "last task of a job that ended or was "
                                                       "cancelled")
                self.note(job, f"canary pool: job {job} has waited {waited:.0f} s for workers; "
                               f"the jobs running: {busy} (a task is never preempted: a long "
                               "one holds its worker until it ends)")

    def _take_messages(self) -> bool:
        """Handle every message that has arrived; whether there was one."""
        got = self.tx.poll()
        busy = got is not None
        while got is not None:
            msg = got[1]
            if type(msg) is Envelope and type(msg.message) is ReportPart:
                # as under `canary run`: seconds since the job started, on rank 0's clock
                msg.message.seconds = time.time() - self.status.get(msg.job, {}).get(
                    "started", time.time())
            self.carry(self.state.handle(msg))
            got = self.tx.poll()
        return busy

    def _release(self, ins: Release) -> None:
        ctx = self.contexts.get(ins.job)
        if ins.reason is None and ins.result is None:  # the driver declared no program
            outcome: Any = None
        elif ins.reason is None:
            st = ins.result
            result = JobResult(st.results, st.tasks_run, st.n_workers,
                               time.time() - self.status[ins.job].get("started", time.time()),
                               dict(st.received), dict(st.sent), math.nan, {}, st.migrations,
                               st.bytes_migrated, reports=st.program.reported)
            self._save(ins.job, result)
            outcome = result
        else:
            reason = self.cancelled.get(ins.job, ins.reason)
            self.note(ins.job, f"canary: job aborted: {reason}")
            outcome = ins.error(reason)
            if ins.job in self.cancelled:
                # said now, not when its driver thread ends: one stuck before canary.run (a
                # thread cannot be stopped) would leave the job "running" until the pool stops
                self.job_status(ins.job, state="cancelled", exit_code=130, error=reason,
                                ended=time.time())
        if ctx is not None:
            ctx.release(outcome)

    def _save(self, job: int, result: JobResult) -> None:
        arrays = {f"{name}/{i}": np.asarray(v) for name, parts in result.results.items()
                  for i, v in enumerate(parts)}
        try:
            np.savez(self.spool.job_dir(job) / "result.npz", **arrays)  # type: ignore[arg-type]
        except OSError as exc:
            self.note(job, f"canary pool: could not save the job's result: {exc}")
        self.status[job].update(tasks=result.tasks_run, seconds=round(result.seconds, 6))

    def _local(self, item: tuple[Any, ...]) -> None:
        kind, job = item[0], item[1]
        if kind == "declared":
            self.carry(self.state.handle(Declared(self.eid(), job, item[2])))
        elif kind == "bcast":
            j = self.state.jobs.get(job)
            if j is not None:
                for r in j.ranks:
                    self.tx.send(r, Bcast(self.eid(), job, item[2]))
        elif kind == "exit":
            ctx = self.contexts.pop(job, None)
            code, error = int(item[2]), item[3]
            if job in self.state.jobs and self.state.info(job).state != "ended":
                why = _driver_end(code, error)
                clean = code == 0 and error is None and ctx is not None and not ctx.declared
                self.carry(self.state.handle(DriverEnded(self.eid(), job, -1, why, clean)))
            if code != 0 and error is None:
                error = f"the driver exited with status {code}"
            if ctx is not None and isinstance(ctx.outcome, BaseException) and not error:
                error = str(ctx.outcome)
            self._finish(job, code, error)

    def _finish(self, job: int, code: int, error: str | None) -> None:
        if job in self.cancelled:
            # 130 however the driver ended: it may have exited 1 on the abort the cancel caused
            state, code, error = "cancelled", 130, self.cancelled[job]
        else:
            state = "done" if code == 0 else "failed"
            if code != 0 and error is None:
                error = f"the driver exited with status {code}"
        self.job_status(job, state=state, exit_code=code, error=error, ended=time.time(),
                        iteration=self.state.info(job).iteration if job in self.state.jobs
                        else -1)
        log = self.logs.pop(job, None)
        if log is not None:
            log.close()
        self.state.forget(job)
        self.status.pop(job, None)
        self.wait_noted.pop(job, None)
        self.cancelled.pop(job, None)  # read above and by _release, which comes before this

    def _scan(self) -> None:
        sp = self.spool
        stop = sp.stop_file
        if self.stopping is None and stop.exists():
            self.stopping = stop.read_text().strip() or "wait"
            self.stopping_since = time.monotonic()
            self.write_pool("stopping")
        if self.stopping == "now":
            for job in self.state.active:
                self._cancel(job, "the pool was stopped with --now")
        for job in sp.take("queue"):
            spec_d = read_json(sp.job_dir(job) / "spec.json")
            if spec_d is None:
                continue
            spec = JobSpec(spec_d["script"], tuple(spec_d["args"]), spec_d["user"],
                           int(spec_d["priority"]), float(spec_d["weight"]),
                           int(spec_d["workers"]), spec_d.get("cwd", ""))
            self.logs[job] = JobLog(sp.job_dir(job) / "out.log")
            self.job_status(job, state="placing", submitted=spec_d.get("submitted"),
                            user=spec.user, priority=spec.priority, weight=spec.weight,
                            placing=time.time(), waiter=spec_d.get("waiter"))
            if self.stopping == "now":
                self.job_status(job, state="cancelled", exit_code=130, ended=time.time(),
                                error="the pool was stopping")
                self.status.pop(job, None)
                continue
            self.carry(self.state.handle(Submit(self.eid(), job, spec)))
        for job in sp.take("cancel"):
            self._cancel(job, "cancelled by `canary cancel`")
        for job, st in list(self.status.items()):
            waiter = st.get("waiter")
            if waiter and not is_running(int(waiter)):
                st["waiter"] = None
                self._cancel(job, f"its submitter (pid {waiter}) went away")

    def _cancel(self, job: int, reason: str) -> None:
        if job not in self.state.jobs or self.state.info(job).state == "ended":
            return
        self.cancelled.setdefault(job, reason)
        placing = self.state.info(job).state == "placing"
        self.carry(self.state.handle(Cancel(self.eid(), job, reason)))
        if placing:  # no driver was started: the job ends here
            self._finish(job, 130, reason)

    def loop(self) -> None:
        self.spool.mark_lost()  # before "ready": no submission can come before
        self.listen()
        self.write_pool("ready")
        while True:
            busy = self._take_messages()  # a method: the last message is not kept (see WorkerHost)
            busy = self.drain() or busy
            t = time.perf_counter()
            if t >= self.next_scan or self.scan_now:
                self.scan_now = False
                self.next_scan = t + SCAN_S
                self._scan()
                if self.stopping is not None and not self.state.active and not self.contexts \
                        and not list((self.spool.root / "queue").glob("*")):
                    break
                if self.stopping == "now" and \
                        time.monotonic() - self.stopping_since > STOP_NOW_GRACE_S:
                    # a driver stuck before canary.run (a slow read, a sleep) never hears of
                    # its cancel, and a thread cannot be stopped: the pool leaves without it
                    for job in list(self.status):  # the jobs not yet ended
                        self._finish(job, 130, "its driver did not end within "
                                               f"{STOP_NOW_GRACE_S:.0f} s of `canary cluster "
                                               "stop --now`")
                    break
            if t >= self.next_tick:
                self.next_tick = t + TICK_S
                self.carry(self.state.handle(Tick(self.eid(), self.now())))
            if t >= self.next_status:
                self.next_status = t + 0.5
                for job in self.state.active:
                    info = self.state.info(job)
                    if job in self.status and info.iteration >= 0:
                        self.job_status(job, iteration=info.iteration)
                self._note_waiting(time.time())
            if busy:
                self.idle.reset()
            else:
                self.tx.progress()
                self.idle.sleep(ACTIVE_SLEEP_S if self.state.jobs or self.contexts
                                else IDLE_SLEEP_S)
        self.carry(self.state.handle(StopPool(self.eid())))
        self.tx.flush()
        self.write_pool("stopped")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="canary.pool.host",
                                 description="one rank of a canary pool (started by "
                                             "`canary cluster start`)")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--policy", choices=QUEUE_POLICIES, default="fair")
    ap.add_argument("--placement", choices=PLACEMENT_POLICIES, default="batch-late")
    ap.add_argument("--probe-ratio", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    if comm.Get_size() < 2:
        print("canary pool: needs at least 2 ranks (a controller and a worker)", file=sys.stderr)
        return 2
    install()
    tight_timer_slack()  # the idle waits are short: wake on time, not 50 us late
    freeze_startup_objects()  # a full collection walks what jobs allocate, not the imports
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    spool = Spool(args.dir)
    # each rank's process id, for `canary cluster status` and the benchmarks' memory readings
    write_json(spool.root / f"rank-{comm.Get_rank()}.json", {"pid": os.getpid(),
                                                            "host": os.uname().nodename})
    # every rank is up, and its settings read, before rank 0 says the pool is ready (a bad one
    # ended the workers after it had)
    config: WorkerConfig | None = None
    progress_s = 0.0
    try:
        config = WorkerConfig.from_env()
        progress_s = env_number(PROGRESS_ENV, 60.0)  # 0: no progress lines
        problem = None
    except ValueError as exc:
        problem = str(exc)
    problems = comm.gather(problem, root=CONTROLLER)
    bad = None
    if comm.Get_rank() == CONTROLLER:
        bad = next((f"rank {k}: {p}" for k, p in enumerate(problems or []) if p), None)
        if bad is not None:
            write_json(spool.pool_file, {"state": "failed", "error": bad})
    if comm.bcast(bad, root=CONTROLLER) is not None:
        return 2
    if comm.Get_rank() == CONTROLLER:
        ControllerHost(comm, spool, args.policy, args.placement, args.seed,
                       args.probe_ratio, progress_s).loop()
    else:
        assert config is not None  # else every rank has returned above
        WorkerHost(comm, spool, args.policy, config, progress_s).loop()
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
