"""``canary.run``: run a declared program on the MPI job this process belongs to."""

from __future__ import annotations

import itertools
import math
import numbers
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any

from canary.driver import RESUME_ENV, output_problem
from canary.env import (
    BALANCE_ENV,
    CHAOS_ENV,
    CHECKPOINT_ENV,
    CHECKPOINT_EVERY_ENV,
    KEEP_ENV,
    PROGRESS_ENV,
    SLOWDOWN_ENV,
    env_choice,
    env_number,
)
from canary.errors import JobAborted
from canary.idle import Backoff, core_placement, has_own_core
from canary.local_runner import run_local
from canary.program import Program, check_program
from canary.ranks import RankRun, abort_job, rank_in_job
from canary.result import JobResult
from canary.snapshot import Manifest, SnapshotConfig, check_resumable, read_manifest
from canary.trace import Tracer, gather_and_write, trace_level, trace_path
from canary.worker.config import WorkerConfig


def run(program: Program, comm: object | None = None, window: int = 64,
        trace: str | os.PathLike[str] | None = None,
        balance: bool | None = None) -> JobResult | None:
    """Run ``program``: rank 0 becomes the controller, ranks 1..N the workers.

    Returns the :class:`JobResult` on rank 0 and ``None`` on workers. With a single rank (a
    plain ``python driver.py``) the job runs in-process on one worker so a driver can be tried
    without MPI. If anything fails on any rank, the reason (rank, stage, partition, traceback)
    is printed once to stderr and the whole MPI job is aborted with exit code 1, so no rank is
    left hanging. A setting it cannot use (a ``CANARY_*`` variable, a trace path rank 0 cannot
    write) is said once and ends the job with exit code 2 before anything runs; ``balance``,
    ``trace`` or ``window`` of the wrong kind raises TypeError or ValueError before MPI starts.

    ``trace=PATH`` (or the environment variable ``CANARY_TRACE=PATH``) writes a Chrome
    trace-event JSON of the job to PATH on rank 0: one track per rank, every task and message
    (see :mod:`canary.trace`; ``CANARY_TRACE_LEVEL=loop`` records the loop tests only). Not
    available for the in-process single-rank run.

    ``balance`` (default: the environment variable ``CANARY_BALANCE``, ``on`` unless it says
    ``off``; ``canary run --balance``) lets the controller move partitions off workers that
    are markedly slower (:class:`canary.controller.balance.BalancePolicy`).
    ``CANARY_CHAOS_MIGRATE=SEED`` moves random partitions instead (every 100 ms; ``SEED:MS``
    every MS ms), and
    ``CANARY_SLOWDOWN=WORKER:FACTOR`` makes one worker that many times slower (experiments).
    A worker that shows no progress for ``CANARY_STALL_S`` seconds (default 10) is named on
    stderr; workers report their load every ``CANARY_REPORT_MS`` (default 500). A worker
    emits at most ``window`` stage instances (default 64) ahead of its work, and after each
    load report about ``CANARY_WINDOW_MS`` (default 500; 0: always ``window``) of the
    program's pace, never fewer than 8 (``window`` if smaller). Every
    ``CANARY_PROGRESS_S`` seconds (default 60; 0: never), the first after half that, rank 0
    says on stderr how long the job has run, where it stands (loop, line, iteration) and how
    fast it goes (:mod:`canary.controller.progress`).

    Snapshots (``canary run --checkpoint DIR``): ``CANARY_CHECKPOINT=DIR`` takes one every
    ``CANARY_CHECKPOINT_EVERY`` seconds (default 60) and keeps the last ``CANARY_KEEP``
    (default 2); ``CANARY_RESUME=FOLDER`` starts the job from the snapshot in FOLDER, and
    raises :class:`canary.snapshot.SnapshotMismatchError` on every rank if it was taken of
    another program.
    """
    check_program(program, "canary.run")
    if balance is not None and not isinstance(balance, bool):
        raise TypeError(f"canary.run: balance must be True, False or None, got {balance!r}")
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"canary.run: window must be an integer >= 1, got {window!r}")
    path = trace_path(trace)
    from mpi4py import MPI

    given = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(given, MPI.Comm):
        raise TypeError(f"canary.run: comm must be an mpi4py communicator, got {given!r}")
    rank, size = given.Get_rank(), given.Get_size()
    if size == 1:
        print("canary: one MPI rank, so running in-process with one worker "
              "(use `canary run -n N` for N workers)", file=sys.stderr)
        if path:
            print("canary: --trace/CANARY_TRACE needs an MPI run; no trace written",
                  file=sys.stderr)
        try:  # read, though one process uses few: a mistake in one is still said up front
            read_settings(1, None, window, balance)
        except ValueError as exc:
            print(f"canary: error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        # one worker: nothing to slow beside or move between (run_local(chaos=) moves in-process)
        for name in (CHAOS_ENV, SLOWDOWN_ENV):
            if os.environ.get(name, "").strip():
                print(f"canary: {name} needs an MPI run with workers to compare or move "
                      "between; ignored", file=sys.stderr)
        return run_local(program, workers=1)
    try:  # the environment, read once at start-up
        # rank 0 writes the trace, and its file system is the one to ask (a worker's host may
        # not have the folder); the others are ended by rank 0's abort below
        why = output_problem(path) if path and rank == 0 else None
        if why is not None:
            raise ValueError(f"the trace file {path} (trace= or CANARY_TRACE): {why}")
        settings = read_settings(rank, size - 1, window, balance)
    except ValueError as exc:  # the same mistake on every rank: rank 0 alone says so
        if rank == 0:
            print(f"canary: error: {exc}", file=sys.stderr, flush=True)
        # rank 0 ends the job a second later; the others end it themselves if hydra lost that
        # abort (see the JobAborted case below). Status 2, as for a driver's rejected input
        # (canary run --help): nothing ran.
        abort_job(given, 2, linger=1.0 if rank == 0 else 5.0)
    config, startup_timeout, stall_s, progress_s, loop_only, policy, checkpoint = settings
    # every rank alike: an error ends each the same way
    resume_from = resume_snapshot(program, size - 1)
    # Every abort below is of ``given`` (COMM_WORLD unless the driver passed another), never of
    # the engine's copy: aborted on a copy of COMM_WORLD, a rank that hydra then killed made
    # mpiexec report "EXIT CODE: 9" and end with status 9, not the abort's (1, or 130 for a
    # Ctrl-C: 6 of 60 interrupted jobs; 5 of 10 when rank 0 alone aborted a copy).
    comm = given
    joined = False
    job = next(_JOBS)
    try:
        # a rank whose driver fails meanwhile aborts the job at once
        recorded = rank_in_job(True, job)
        _join(given, startup_timeout, program.name, job if recorded else None)
        joined = True
        # The engine talks on its own copy of the communicator: a driver that also uses the one
        # it passed (COMM_WORLD, say) cannot receive canary's messages or collide with its tags.
        comm = given.Dup()
        # which workers share cores decides which may poll hot when idle: only the ranks'
        # affinity masks together tell that, once ranks are bound a core each
        workers_placed = comm.allgather(core_placement())[1:]  # rank 0's is not counted
        tracer = (Tracer(rank, "controller" if rank == 0 else f"worker {rank - 1}",
                         loop_only=loop_only) if path else None)
        result: JobResult | None = None
        if rank == 0:
            from canary.controller.runtime import run_controller

            result = run_controller(program, comm, tracer=tracer, policy=policy, stall_s=stall_s,
                                    tick_s=tick_seconds(policy),
                                    checkpoint=checkpoint, resume_from=resume_from,
                                    progress_s=progress_s,
                                    own_cores=[has_own_core(w, workers_placed)
                                               for w in range(size - 1)])
            if resume_from is not None:
                print(f"canary: resumed from snapshot {resume_from.id} in {resume_from.path}",
                      file=sys.stderr, flush=True)
        else:
            from canary.worker.runtime import run_worker

            run_worker(program, comm, config, tracer=tracer,
                       checkpoint_dir=None if checkpoint is None else checkpoint.directory,
                       resume_from=resume_from, placements=workers_placed)
        if tracer is not None and path:
            try:
                gather_and_write(comm, tracer, path, {"program": program.name,
                                                      "workers": size - 1})
            except OSError as exc:  # rank 0 only: the job's result matters more than its trace
                print(f"canary: the trace could not be written to {path}: "
                      f"{exc.strerror or exc}", file=sys.stderr, flush=True)
            else:
                if rank == 0:
                    print(f"canary: trace written to {path} (open it in "
                          "https://ui.perfetto.dev)", file=sys.stderr, flush=True)
        comm.Free()
        rank_in_job(False)  # the job is over: a rank that fails now waits for the others
        return result
    except JobAborted:
        # Rank 0 printed the reason before it told the workers, and ends every rank a second
        # later. A worker told to abort waits for that, and ends the job itself if rank 0 has
        # not within 5 s: once in tens of jobs, rank 0's MPI_Abort prints hydra's line and rank
        # 0 exits, yet hydra leaves the other ranks running. A worker that found out while
        # joining that rank 0 has ended its driver exits: MPI_Abort can return once rank 0 has
        # finalized MPI, and the job ended (in MPI's view) with rank 0.
        if rank != 0 and not joined:
            raise SystemExit(1) from None
        abort_job(given, 1, linger=1.0 if rank == 0 else 5.0)
    except KeyboardInterrupt:
        # Ctrl-C to a plain mpiexec reaches every rank (canary run stops its job with SIGTERM
        # instead): one line each, not a traceback of canary's idle loop each. 130: SIGINT's.
        # Under canary run a rank gets it twice (its sentinel passes on what its process group
        # got as well): the second must not break off the abort.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"canary: rank {rank} interrupted (SIGINT); the job stops", file=sys.stderr,
              flush=True)
        abort_job(given, 130, linger=0.2)
    except BaseException as exc:  # noqa: BLE001 - any failure must abort every rank
        print(f"canary: rank {rank} failed: {exc!r}\n{traceback.format_exc()}", file=sys.stderr,
              flush=True)
        abort_job(given, 1, linger=1.0)
    return None  # pragma: no cover - Abort does not return


def checkpoint_config(environ: Mapping[str, str]) -> SnapshotConfig | None:
    """The snapshot settings ``canary run --checkpoint`` passes on (None: no snapshots). The
    manifest records this process's script and arguments. Raises ValueError naming the
    variable for a value that is not a number or out of range."""
    folder = environ.get(CHECKPOINT_ENV, "").strip()
    if not folder:
        return None
    return SnapshotConfig(folder, env_number(CHECKPOINT_EVERY_ENV, SnapshotConfig.every_s,
                                             environ=environ),
                          # at least 1: "--keep must be at least 1" named a flag never given
                          int(env_number(KEEP_ENV, SnapshotConfig.keep, minimum=1, integer=True,
                                         environ=environ)),
                          os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "",
                          tuple(sys.argv[1:]))


def resume_snapshot(program: Program, workers: int) -> Manifest | None:
    """The snapshot ``CANARY_RESUME`` names, checked against ``program`` run on ``workers``
    (None if unset).
    Raises :class:`canary.snapshot.SnapshotError` if it cannot be read or is of another
    program."""
    folder = os.environ.get(RESUME_ENV, "").strip()
    if not folder:
        return None
    snap = read_manifest(folder)
    check_resumable(snap, program.digest, program.statements(), workers, program.sources(),
                    program.statement_sites())
    return snap


def check_report_period(report_s: float, stall_s: float) -> None:
    """Raise ValueError naming ``CANARY_REPORT_MS`` unless workers report (``report_s``) more
    than 0 and at most a third of ``CANARY_STALL_S`` (``stall_s``) apart: the controller hears
    of a worker's progress through its reports, so a longer period would have it name working
    workers as stuck."""
    if not 0 < report_s <= stall_s / 3:
        raise ValueError(f"CANARY_REPORT_MS={report_s * 1e3:g} (ms between a worker's load "
                         "reports; 500 unless set) must be more than 0 and at most a third of "
                         f"CANARY_STALL_S ({stall_s:g} s): the controller hears of a worker's "
                         "progress through its load reports, and names a worker it has not heard "
                         "of in CANARY_STALL_S as stuck; lower CANARY_REPORT_MS or raise "
                         "CANARY_STALL_S")


def read_settings(rank: int, workers: int | None, window: int, balance: bool | None
                  ) -> tuple[WorkerConfig, float, float, float, bool, Any,
                             SnapshotConfig | None]:
    """The job's settings from the ``CANARY_*`` environment variables, read once at start-up:
    rank ``rank``'s :class:`WorkerConfig` (with ``window``), the startup timeout, the stall
    and progress periods, whether the trace records loop tests only, the move policy (for
    ``workers`` workers; ``balance`` None: ``CANARY_BALANCE``) and the snapshot settings.
    ``workers`` None: not known (one process), so a worker index is not checked against it.
    Raises ValueError naming the variable for a malformed or out-of-range value."""
    config = WorkerConfig.from_env(worker=rank - 1, n_workers=workers, window=window)
    startup_timeout = env_number("CANARY_STARTUP_TIMEOUT", 120.0, above=True)
    stall_s = env_number("CANARY_STALL_S", 10.0, above=True)
    progress_s = env_number(PROGRESS_ENV, 60.0)  # 0: no progress lines
    check_report_period(config.report_s, stall_s)
    loop_only = trace_level() == "loop"
    if balance is None:
        balance = env_choice(BALANCE_ENV, ("on", "off"), "on") == "on"
    policy = move_policy(os.environ, workers or 1, balance)
    return (config, startup_timeout, stall_s, progress_s, loop_only, policy,
            checkpoint_config(os.environ))


def move_policy(environ: Mapping[str, str], n_workers: int, balance: bool) -> Any:
    """The controller's move policy: random moves with ``CANARY_CHAOS_MIGRATE=SEED`` (tests and
    experiments: the answer must not change), else the balancing policy if ``balance``, else
    none. Raises ValueError naming the variable for a seed that is not a non-negative
    integer."""
    from canary.controller.balance import BalancePolicy, ChaosPolicy

    chaos = chaos_from_env(environ)
    if chaos is not None:
        seed, every_s = chaos
        return ChaosPolicy(seed, every=every_s, moves=2)
    return BalancePolicy(n_workers) if balance else None


def tick_seconds(policy: Any, default: float = 0.1) -> float:
    """Seconds between the controller's ticks for move ``policy``: ``default``, or a chaos
    policy's shorter period (it draws its moves at ticks, so draws every 10 ms need ticks as
    often)."""
    every = getattr(policy, "every", 0.0)
    return min(default, every) if every > 0 else default


#: How often chaos draws moves unless ``CANARY_CHAOS_MIGRATE=SEED:MS`` says otherwise
CHAOS_EVERY_MS = 100.0


def chaos_from_env(environ: Mapping[str, str]) -> tuple[int, float] | None:
    """``CANARY_CHAOS_MIGRATE=SEED`` or ``SEED:MS`` as ``(seed, seconds between draws)`` (MS
    defaults to :data:`CHAOS_EVERY_MS`), or None when unset. Raises ValueError naming the
    variable unless SEED is an integer >= 0 and MS a finite number > 0.

    The draws are paced by the clock, not by the program: a test that must see moves within a
    job of a fraction of a second on a fast machine asks for draws every few milliseconds."""
    raw = environ.get(CHAOS_ENV, "").strip()
    if not raw:
        return None
    if ":" not in raw:
        return int(env_number(CHAOS_ENV, 0, integer=True, environ=environ)), CHAOS_EVERY_MS / 1e3
    seed_s, _, ms_s = raw.partition(":")
    try:
        seed, ms = int(seed_s), float(ms_s)
    except ValueError:
        seed, ms = -1, math.nan
    if seed < 0 or not 0 < ms < math.inf:
        raise ValueError(f"environment variable {CHAOS_ENV}={raw!r} is not SEED:MS (a seed, an "
                         "integer >= 0, and the milliseconds between random moves, a finite "
                         "number above 0, e.g. 11:10): set it so, or to SEED alone "
                         f"(every {CHAOS_EVERY_MS:g} ms), or unset it")
    return seed, ms / 1e3


# A tag within the range every MPI allows (up to 32767), used once per rank before the Dup.
JOIN_TAG = 32761
_JOBS = itertools.count(1)  # this process's runs (canary.run calls), numbered


def _join(comm: Any, timeout: float, program: str = "", job: int | None = None) -> None:
    """Return once every rank of ``comm`` has entered :func:`run` (of ``program``, by name).

    Workers tell rank 0 they are here; rank 0 waits at most ``timeout`` seconds (the
    environment variable ``CANARY_STARTUP_TIMEOUT``, default 120) and otherwise raises
    :class:`JobAborted` naming the ranks that never came: a driver that failed on one rank
    while declaring would leave the others blocked forever in the collective ``Dup`` when the
    job was not launched through ``python -m mpi4py`` (which ends every rank when one fails).

    Launched by ``canary run``, this rank has recorded that it entered its ``job``-th run
    (None: it could not record), and a rank that ran fewer programs than the others is found
    out at once: rank 0 raises when a worker it waits for has ended its driver, and a worker
    tells rank 0 it is here only once rank 0 has entered the same job, raising if rank 0 ended
    its driver instead (a message rank 0 never receives would make its ``MPI_Finalize``
    fail). The reason is printed by rank 0, or by the first worker still in its driver.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    run = RankRun.from_environ() if job is not None else None
    why = ": every rank must call canary.run for the same programs in the same order (is a " \
          "canary.run inside a branch on a result? a result is None on every rank but 0)"
    if rank != 0:
        if run is not None and run.started(0):  # rank 0's records are seen here
            backoff = Backoff(max_sleep=2e-3)
            look = time.monotonic() + 0.1
            while run.job_of(0) != job:
                if time.monotonic() > look:
                    look = time.monotonic() + 0.1
                    ended = run.ended_well()
                    if 0 in ended:
                        reason = ("rank 0 (the controller) ended its driver without running "
                                  f"program '{program}', which the workers run{why}")
                        if rank == min(set(range(1, size)) - ended):  # one worker says it
                            print(f"canary: job aborted: {reason}", file=sys.stderr, flush=True)
                        raise JobAborted(reason)
                backoff.sleep()
        comm.send(None, dest=0, tag=JOIN_TAG)  # a few bytes: sent eagerly, returns at once
        return
    from mpi4py import MPI

    missing = set(range(1, size))
    status = MPI.Status()
    backoff = Backoff(max_sleep=1e-2)
    start = time.monotonic()
    end, look = start + timeout, start + 0.1
    while missing:
        if comm.Iprobe(MPI.ANY_SOURCE, JOIN_TAG, status):
            src = status.Get_source()
            comm.recv(source=src, tag=JOIN_TAG)
            missing.discard(src)
            continue
        now = time.monotonic()
        ended = set()
        if run is not None and now > look:
            look = now + 0.1
            ended = run.ended_well() & missing
        if ended:
            reason = (f"rank(s) {sorted(ended)} ended their driver without running program "
                      f"'{program}', which rank 0 runs{why}")
        elif now > end:
            reason = (f"rank(s) {sorted(missing)} never started the program within "
                      f"{timeout:.0f} s (did the driver fail there while declaring? launch "
                      "with `canary run` or `mpiexec ... python -m mpi4py` so that a failure "
                      "on any rank ends the whole job)")
        else:
            backoff.sleep()
            continue
        print(f"canary: job aborted: {reason}", file=sys.stderr, flush=True)
        raise JobAborted(reason)
