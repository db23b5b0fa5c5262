"""The rank side of ``canary run``: what each rank records so that the launcher can say how the
job ended.

``canary run`` starts every rank as ``python -u -m canary.ranks SCRIPT ARGS`` (under its
sentinel, :mod:`canary.sentinel`), which runs SCRIPT exactly as ``python -m mpi4py SCRIPT
ARGS`` does (an uncaught exception on one rank ends the whole MPI job) and, when the launcher
named a run folder (``CANARY_RUN_DIR``), also:

* records ``start-R.json`` (pid, host, start time, sentinel) when the rank starts;
* records ``end-R.json`` with the driver's exit status when the driver ends by itself (a
  rank that ends without it, its sentinel notes as ``gone-R.json``);
* records ``joined-R.json`` while the rank is in :func:`canary.run` (it waits there for every
  other rank to join the job);
* lets a driver that fails the same way on every rank (an argument error, a bad input file)
  end without ``MPI_Abort``: a rank that ends with a non-zero status first waits up to
  :data:`END_WAIT` seconds for every rank to end; only if some rank is still running (and
  would wait for this one forever) is the job aborted, at once if some rank has joined. So no
  rank is killed before it has said why, and MPI adds no abort messages.
* ends a rank whose driver ended well without the interpreter's teardown, once files, threads
  and MPI are seen to (:func:`leave`): the job ends 0.5 s sooner.

Without ``CANARY_RUN_DIR`` (launched by hand) it is plain ``python -m mpi4py``.

``canary/__init__.py`` must not import this module: run with ``-m`` it would then exist twice.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from canary.errors import JobAborted, TaskError, user_error_line
from canary.mpich_shm import release_own_segments
from canary.sentinel import (
    RUN_DIR,
    RUN_RANKS,
    SENTINEL,
    env_rank,
    process_start_time,
    record_path,
    write_record,
)

END_WAIT = 3.0  # seconds a failing rank waits for the others to end before aborting the job


def role(rank: int) -> str:
    """How messages name a rank: ``rank 0 (controller)`` or ``rank 2 (worker 1)``."""
    return "rank 0 (controller)" if rank == 0 else f"rank {rank} (worker {rank - 1})"


@dataclass(frozen=True)
class RankStart:
    """What a rank recorded when it started."""

    rank: int
    pid: int
    host: str
    started: str | None  # the process's start time (see sentinel.process_start_time)
    sentinel: int  # the pid of the rank's sentinel (its parent), 0 if it has none


@dataclass(frozen=True)
class Gone:
    """A rank that ended without finishing, as its sentinel saw it."""

    returncode: int  # subprocess's convention: negative for the signal that killed it
    time: float  # when the sentinel saw it end (time.time())


@dataclass(frozen=True)
class Orphaned:
    """A rank whose sentinel saw the process that started it (MPI's process manager on its
    host: MPICH's ``hydra_pmi_proxy``) die, and then stopped the rank."""

    manager: str  # that process's name
    pid: int
    time: float  # when the sentinel saw it go (time.time())


@dataclass(frozen=True)
class Signalled:
    """A signal a rank's sentinel got from the process that started it (MPI's process manager,
    passing on what mpiexec received), and passed on to the rank."""

    signal: int
    time: float  # when the sentinel got it (time.time())


@dataclass(frozen=True)
class RunRecords:
    """Everything the ranks of one run recorded: who started, who ended by itself with which
    status, who ended without finishing (with the time its sentinel saw it go), who lost its
    process manager, and whose sentinel got a signal from it."""

    starts: dict[int, RankStart]
    ends: dict[int, int]
    gone: dict[int, Gone]
    orphaned: dict[int, Orphaned] = field(default_factory=dict)
    signalled: dict[int, Signalled] = field(default_factory=dict)


def read_records(folder: str | os.PathLike[str]) -> RunRecords:
    """The records in run folder ``folder``; a record that cannot be read counts as absent."""
    starts: dict[int, RankStart] = {}
    ends: dict[int, int] = {}
    gone: dict[int, Gone] = {}
    orphaned: dict[int, Orphaned] = {}
    signalled: dict[int, Signalled] = {}
    for path in sorted(Path(folder).glob("*-*.json")):
        kind = path.stem.partition("-")[0]
        try:
            data = json.loads(path.read_text())
            rank = int(data["rank"])
            if kind == "start":
                starts[rank] = RankStart(rank, int(data["pid"]), str(data["host"]),
                                         data.get("started"), int(data.get("sentinel", 0)))
            elif kind == "end":
                ends[rank] = int(data["status"])
            elif kind == "gone":
                gone[rank] = Gone(int(data["returncode"]), float(data["time"]))
            elif kind == "orphaned":
                orphaned[rank] = Orphaned(str(data["manager"]), int(data["pid"]),
                                          float(data["time"]))
            elif kind == "signalled":
                signalled[rank] = Signalled(int(data["signal"]), float(data["time"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return RunRecords(starts, ends, gone, orphaned, signalled)


@dataclass(frozen=True)
class RankRun:
    """This rank's place in a run launched by ``canary run``."""

    folder: str
    rank: int
    ranks: int

    @staticmethod
    def from_environ(environ: Mapping[str, str] = os.environ) -> RankRun | None:
        """This process's run, or None when it was not launched by ``canary run`` (or its MPI
        does not say which rank it is before MPI starts)."""
        folder, rank = environ.get(RUN_DIR), env_rank(environ)
        ranks = environ.get(RUN_RANKS, "")
        if not folder or rank is None or not ranks.isdigit():
            return None
        return RankRun(folder, rank, int(ranks))

    def start(self, environ: Mapping[str, str] = os.environ) -> None:
        """Record that this rank started. Never raises: a rank that cannot record (the run
        folder is on another host) runs all the same."""
        sentinel = environ.get(SENTINEL, "")
        write_record(self.folder, "start", self.rank,
                     {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(),
                      "started": process_start_time(os.getpid()),
                      "sentinel": int(sentinel) if sentinel.isdigit() else 0})

    def end(self, status: int, wait: float = END_WAIT) -> bool:
        """Record that the driver ended on this rank with exit ``status``.

        Returns True when every rank of the job is known to have ended (so none is left
        waiting for this one and the job needs no ``MPI_Abort``). A non-zero ``status`` waits
        up to ``wait`` seconds for that: every rank of a driver that rejects its arguments or
        input fails at about the same moment. It returns False without waiting further once a
        rank that has not ended is in the job (see :meth:`in_job`): that rank waits for this
        one, and would until the controller's start-up timeout.
        """
        if not write_record(self.folder, "end", self.rank, {"rank": self.rank, "status": status}):
            return False  # the run folder is not on this host: the others cannot be seen
        deadline = time.monotonic() + (wait if status != 0 else 0.0)
        while True:
            ended = [os.path.exists(record_path(self.folder, "end", r)) for r in range(self.ranks)]
            if all(ended):
                return True
            if time.monotonic() >= deadline or any(
                    not ended[r] and os.path.exists(record_path(self.folder, "joined", r))
                    for r in range(self.ranks)):
                return False
            time.sleep(0.05)

    def ended_well(self) -> set[int]:
        """The ranks whose driver has ended with status 0 (recorded by :meth:`end`)."""
        done = set()
        for r in range(self.ranks):
            try:
                with open(record_path(self.folder, "end", r)) as f:
                    if json.load(f).get("status") == 0:
                        done.add(r)
            except (OSError, ValueError, AttributeError):
                continue
        return done

    def in_job(self, inside: bool, job: int = 0) -> bool:
        """Record that this rank has entered job ``job`` (its ``job``-th ``canary.run``;
        ``inside``: it now waits for every other rank to join it) or has left it. Returns
        whether it could record. Never raises."""
        if inside:
            return write_record(self.folder, "joined", self.rank, {"rank": self.rank, "job": job})
        try:
            os.remove(record_path(self.folder, "joined", self.rank))
        except OSError:
            pass
        return True

    def job_of(self, rank: int) -> int | None:
        """The job ``rank`` has entered (see :meth:`in_job`), or None if it is in none."""
        try:
            with open(record_path(self.folder, "joined", rank)) as f:
                return int(json.load(f)["job"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def started(self, rank: int) -> bool:
        """Whether ``rank`` has recorded its start here (so its records can be seen)."""
        return os.path.exists(record_path(self.folder, "start", rank))


def end_rank(status: int, environ: Mapping[str, str] = os.environ) -> bool:
    """Record that the driver ended on this rank with ``status`` (see :meth:`RankRun.end`).

    Returns False at once when the process was not launched by ``canary run``.
    """
    run = RankRun.from_environ(environ)
    return run is not None and run.end(status)


def rank_in_job(inside: bool, job: int = 0, environ: Mapping[str, str] = os.environ) -> bool:
    """Record that this rank entered or left job ``job`` (see :meth:`RankRun.in_job`); returns
    whether it could (False when the process was not launched by ``canary run``)."""
    run = RankRun.from_environ(environ)
    return run is not None and run.in_job(inside, job)


def exit_status(exc: SystemExit) -> int:
    """The exit status Python gives ``exc``: None is 0, a message is 1."""
    code = exc.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def main(argv: list[str] | None = None) -> None:
    """``python -m canary.ranks SCRIPT [ARGS]``: run SCRIPT as ``python -m mpi4py`` would,
    recording this rank's start and end for ``canary run`` (see the module docstring)."""
    from mpi4py import run as mpi4py_run

    args = sys.argv[1:] if argv is None else argv
    if not args:
        sys.exit("usage: python -m canary.ranks SCRIPT [ARGS]")
    run = RankRun.from_environ()
    if run is not None:
        run.start()
    # MPI starts here, not when the driver first imports it (in canary.run): a rank that ended
    # before it had started MPI (its input missing, an argument error on one host) left the
    # others waiting in MPI_Init for ever, where no startup timeout can reach them
    from mpi4py import MPI  # noqa: F401
    try:
        mpi4py_run.run_command_line(args)
    except SystemExit as exc:
        status = exit_status(exc)
        if status != 0 and not (run is not None and run.end(status)):
            _abort_at_exit(status)  # some rank may still wait for this one
        elif status == 0:
            leave()
        raise
    except KeyboardInterrupt as exc:
        _abort_at_exit(exc)
        raise
    except BaseException as exc:
        # a driver written at the top level, not in a main() that run_main calls, gets the
        # same one line for its declaration mistakes
        line = user_error_line(Path(args[0]).stem, exc)
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        elif run is not None and not isinstance(exc, (TaskError, JobAborted)):
            # the driver's own exception: the traceback below does not say on which rank
            print(f"canary: {role(run.rank)[:-1]}, pid {os.getpid()}): the driver raised "
                  f"{type(exc).__name__}:", file=sys.stderr, flush=True)
        status = 1 if line is None else 2
        if not (run is not None and run.end(status)):
            _abort_at_exit(status)
        if line is None:
            raise
        raise SystemExit(status) from None
    leave()


def active_mpi() -> Any:
    """``mpi4py.MPI`` if this process has imported it and MPI is initialized and not yet
    finalized, else None (importing nothing)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    return mpi


def abort_job(comm: Any, code: int, linger: float) -> NoReturn:
    """MPI_Abort the job with ``code`` after ``linger`` seconds, this rank's MPICH shared
    memory released first (:mod:`canary.mpich_shm`).

    Why wait: MPI_Abort makes the launcher kill every process at once, and output that a rank
    has written but the launcher has not yet forwarded is lost, so the reason just printed
    could vanish (seen: exit code 1 with empty stderr under load).
    """
    release_own_segments()  # before the wait: the job may end this rank first
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(linger)
    comm.Abort(code)
    # MPICH's MPI_Abort returns when the other ranks have already finalized MPI (they ended
    # their drivers): end this one, as the abort would have, saying so to `canary run`
    run = RankRun.from_environ()
    if run is not None:
        run.end(code, wait=0.0)
    os._exit(code)


def _abort_at_exit(status: int | BaseException) -> None:
    """Have mpi4py abort the MPI job with ``status`` once this rank's driver has unwound."""
    from mpi4py import run as mpi4py_run

    release_own_segments()
    mpi4py_run.set_abort_status(status)


def leave() -> NoReturn:
    """End this process with status 0 once everything a normal exit does that anyone can see
    is done: other threads joined, the ``atexit`` handlers run, the Python files left open
    flushed, the rank's end recorded for ``canary run`` (when it launched this one), MPI
    finalized; then C's ``exit(0)``, whose handlers flush what HDF5 holds open. What is
    skipped is the interpreter's teardown, which took 0.4 s of CPU once numba had loaded a
    kernel, on every rank of every job.

    Only for a driver that ended well: a failing one takes the ordinary way out, which prints
    its traceback and may abort the MPI job. Works without MPI too (a one-rank run).
    """
    program = sys.modules.get("canary.program")  # not imported: no program declared
    for name in program.never_run() if program is not None else ():
        print(f"canary: warning: program '{name}' was declared but never run (call "
              "canary.run(p) to run it)", file=sys.stderr, flush=True)
    import atexit
    import gc
    import io
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    # files a driver left open, flushed as their finalizers would have; the buffered kinds are
    # the ones that hold unwritten bytes (and isinstance of io.IOBase, an ABC, is 2x as slow).
    # By type(): isinstance asks a weak proxy for its referent's class, and a dead one raises
    buffered = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair)
    for obj in gc.get_objects():
        if issubclass(type(obj), buffered):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):
                pass
    _flush_standard_streams()
    # recorded once what the rank wrote is out: `canary run` takes a recorded end for a
    # delivered answer, and a kill before this point for a lost one
    end_rank(0)
    mpi = active_mpi()
    # finalized as mpi4py would at exit, unless it was told not to
    if mpi is not None and sys.modules["mpi4py"].rc.finalize is not False:
        mpi.Finalize()
    _flush_standard_streams()
    # C's exit(), not os._exit: the C libraries' exit handlers still run (MPICH's, HDF5's,
    # which closes the HDF5 files a driver left open).
    # After MPI_Finalize and os._exit, MPICH's process manager took the rank for a failed one
    # and killed the others in 13 of 30 runs; with exit() in none of 30, and just as quickly
    # (the 0.4 s is Python's own teardown, which exit() does not do)
    import ctypes

    ctypes.CDLL(None).exit(0)
    os._exit(0)  # not reached


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe nobody reads any more
            pass


if __name__ == "__main__":
    main()
