"""The sentinel: the small parent process of each rank of a ``canary run`` job.

``canary run`` makes a run folder and names it to every rank (``CANARY_RUN_DIR``), and mpiexec
starts each rank as ``python -I -S sentinel.py python -u -m canary.ranks SCRIPT ARGS``. The
sentinel imports nothing of canary (it starts in milliseconds), starts the rank as its child,
and ends the way the rank ended (same exit status, same signal), so MPI sees no difference.
It does three things:

* When the rank ends without having recorded a normal end (``end-R.json``, see
  :mod:`canary.ranks`), it writes ``gone-R.json`` with how the rank ended (killed by a signal,
  crashed, ``os._exit``) *before* it ends itself. MPICH's process manager learns that a rank
  ended only when the sentinel does, and then kills every rank's process group, sentinels
  included; so the ranks with a ``gone`` note are the ones that ended first, not those killed
  while cleaning up, and the note is written before any cleanup starts.
* It passes SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 on to the rank. The rank gets SIGKILL
  if the sentinel dies (``PR_SET_PDEATHSIG`` on Linux). When such a signal comes from the
  process that started it (MPI's process manager, which passes on what mpiexec received: a
  ``kill`` of mpiexec, a batch system's time limit), it first writes ``signalled-R.json`` with
  the signal (Linux: it learns the sender from a ``signalfd``; elsewhere it notes nothing).
* When the launcher process is gone (``kill -9`` of ``canary run``), it stops the rank: SIGTERM,
  then SIGKILL after :data:`STOP_GRACE` seconds, and removes the run folder (again once its
  rank has ended, after anything it wrote there). It watches the launcher only when the
  launcher runs on its host (same host name, and the pid's start time matches, so a recycled
  pid or another pid namespace is never mistaken for it).
* When the process that started it is gone (MPI's process manager on this host: MPICH's
  ``hydra_pmi_proxy``), the rank's output and its link to MPI are gone with it: the job cannot
  end well. It writes ``orphaned-R.json`` naming that process, then stops the rank as above,
  so that the job ends at once instead of hanging with its answer lost.
* Under hydra the rank inherits only its standard streams and its PMI socket (``PMI_FD``),
  and the sentinel keeps no other descriptor it inherited: hydra leaks its proxy's pipes and
  sockets into every process it starts, and while a rank held them, mpiexec never saw a
  killed proxy's streams close and waited for ever.

* A rank other than 0 reads its standard input from ``/dev/null``: mpiexec feeds its own to
  rank 0 alone, and hydra left the others a pipe that never ends.

Without a run folder and a rank in the environment it just runs the command in its place.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

RUN_DIR = "CANARY_RUN_DIR"  # the run folder the launcher made
RUN_RANKS = "CANARY_RUN_RANKS"  # how many ranks the job has
LAUNCHER = "CANARY_LAUNCHER"  # "PID START HOST": the launcher process
SENTINEL = "CANARY_SENTINEL"  # the sentinel's pid, for the rank's start record
HYDRA_PROXY = "HYDI_CONTROL_FD"  # set by MPICH's hydra proxy in what it starts
PMI_FD = "PMI_FD"  # hydra's: the socket a rank talks to its proxy through
# Where MPI launchers put a process's rank (MPICH/hydra, Open MPI, PMIx): reading them leaves
# ``import mpi4py.MPI`` (and its rc settings) to the driver.
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
STOP_GRACE = 3.0  # seconds a rank gets to end after SIGTERM before SIGKILL
POLL = 0.2  # seconds between checks where pidfds are not available
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def env_rank(environ: Mapping[str, str]) -> int | None:
    """This process's MPI rank as its launcher set it in ``environ``, or None."""
    value = next((environ[v] for v in RANK_VARIABLES if environ.get(v, "").isdigit()), None)
    return None if value is None else int(value)


def record_path(folder: str, kind: str, rank: int) -> str:
    """The file of record ``kind`` (``start``, ``end`` or ``gone``) of ``rank`` in ``folder``."""
    return os.path.join(folder, f"{kind}-{rank}.json")


def write_record(folder: str, kind: str, rank: int, data: dict[str, object]) -> bool:
    """Write record ``kind`` of ``rank`` whole or not at all (a reader never sees half of it).

    Returns False, without raising, if the folder is not there or not writable: the run folder
    is only visible to ranks on the launcher's host (or on a shared file system), and a rank
    that cannot record must still run.
    """
    path = record_path(folder, kind, rank)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def process_start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from ``/proc``), or None if it does
    not exist or this system has no ``/proc``. A pid and its start time name one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count from the last ')'
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def is_running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a zombie has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True  # no /proc: kill(pid, 0) succeeded, so it is there
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X", "")


def wait_for_exit(pids: list[int], timeout: float | None = None,
                  wake: int | None = None) -> int | None:
    """Block until one of ``pids`` has ended; return it (None after ``timeout`` seconds, or
    as soon as descriptor ``wake`` is readable).

    Uses pidfds where the system has them (woken at once, no polling), else polls every
    :data:`POLL` seconds. A pid that is already gone is returned at once. For a child of the
    caller, "ended" includes being a zombie: it is not reaped here.
    """
    fds: dict[int, int] = {}
    try:
        if hasattr(os, "pidfd_open"):
            for pid in pids:
                try:
                    fds[os.pidfd_open(pid)] = pid
                except ProcessLookupError:
                    return pid
                except OSError:  # pidfds not supported here after all: poll
                    fds.clear()
                    break
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            for pid in pids:
                if not is_running(pid):
                    return pid
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return None
            extra = [] if wake is None else [wake]
            if fds:
                ready, _, _ = select.select([*fds, *extra], [], [], left)
            else:
                ready, _, _ = select.select(extra, [], [], POLL if left is None else min(POLL, left))
            if wake is not None and wake in ready:
                return None
            if ready:
                return fds[ready[0]]
    finally:
        for fd in fds:
            os.close(fd)


def stop_process(pid: int, grace: float = STOP_GRACE) -> None:
    """End process ``pid``: SIGTERM, then SIGKILL if it is still there ``grace`` seconds later."""
    try:
        os.kill(pid, signal.SIGTERM)
        if wait_for_exit([pid], grace) is None:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def visible_launcher(value: str) -> int | None:
    """The launcher's pid from ``CANARY_LAUNCHER`` (``PID START HOST``) if that process runs on
    this host and is still the launcher, else None."""
    try:
        pid_text, start, host = value.split()
        pid = int(pid_text)
    except ValueError:
        return None
    if host != socket.gethostname() or process_start_time(pid) != start:
        return None
    return pid


def die_with_parent(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when the calling process dies, even by
    SIGKILL (Linux's ``PR_SET_PDEATHSIG``; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(sig))
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), sig)

    return preexec


def inherited_fds(environ: Mapping[str, str]) -> tuple[int, ...] | None:
    """The descriptors beyond 0-2 that the rank needs from its sentinel: under MPICH's hydra
    (its proxy's variable is set) only the PMI socket (``PMI_FD``, if given); None under
    another launcher, whose rank inherits everything, as it would without a sentinel."""
    if HYDRA_PROXY not in environ:
        return None
    fd = environ.get(PMI_FD, "")
    return (int(fd),) if fd.isdigit() else ()


def close_other_fds(keep: tuple[int, ...]) -> None:
    """Close every descriptor of this process but 0-2 and ``keep`` (those hydra leaked)."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return  # no /proc: nothing is known to be open
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:  # the listing's own descriptor, closed already
                pass


def open_signal_fd(signals: tuple[int, ...]) -> int | None:
    """A descriptor (Linux's ``signalfd``, non-blocking) from which ``signals`` are read with
    their senders (:func:`read_signals`), or None where there is none.

    The signals are blocked in this thread, so that they wait there instead of reaching their
    handlers: call it after starting any child, which would inherit the blocked signals.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        signalfd, sigemptyset, sigaddset = libc.signalfd, libc.sigemptyset, libc.sigaddset
    except (OSError, AttributeError):
        return None
    mask = ctypes.create_string_buffer(128)  # a sigset_t: glibc's and musl's are 128 bytes
    sigemptyset(mask)
    for sig in signals:
        sigaddset(mask, int(sig))
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    fd = signalfd(-1, mask, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:  # a kernel without it: back to the handlers
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
        return None
    return int(fd)


def read_signals(fd: int) -> list[tuple[int, int]]:
    """The signals waiting on :func:`open_signal_fd`'s descriptor ``fd``, oldest first:
    ``(signal, pid of its sender)`` (0 for one the kernel sent)."""
    found: list[tuple[int, int]] = []
    while True:
        try:
            data = os.read(fd, 128 * 16)  # whole signalfd_siginfo records of 128 bytes
        except BlockingIOError:
            return found
        if not data:
            return found
        for at in range(0, len(data) - 127, 128):
            signum, _errno, _code, sender = struct.unpack_from("=IiiI", data, at)
            found.append((signum, sender))


def process_name(pid: int) -> str:
    """The program name of process ``pid`` (``hydra_pmi_proxy``), or "" if unknown."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def supervise_rank(command: list[str], folder: str, rank: int, launcher: int | None,
                   parent: int | None = None, fds: tuple[int, ...] | None = None) -> int:
    """Run the rank ``command`` as a child until it ends, as the module docstring says.

    ``parent``: the process that started the sentinel (MPI's process manager), watched like
    the launcher. ``fds``: the descriptors beyond 0-2 the rank inherits (None: all).
    Returns its returncode in :mod:`subprocess`'s convention (negative: killed by that signal).
    """
    manager = process_name(parent) if parent is not None else ""
    # mpiexec feeds its standard input to rank 0 alone; hydra leaves the others a pipe that
    # never ends, and a driver that read it (every rank runs the whole script) hung for ever
    child = subprocess.Popen(command, close_fds=fds is not None, pass_fds=fds or (),
                             stdin=subprocess.DEVNULL if rank != 0 else None,
                             preexec_fn=die_with_parent(signal.SIGKILL),
                             env=dict(os.environ, **{SENTINEL: str(os.getpid())}))
    # PMI_FD stays open here too: hydra takes its closing for the rank's end and kills every
    # rank at once, before this sentinel could note how its rank ended
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    # where the signals can be read with their senders, they are (the handlers above serve
    # until then, and elsewhere)
    signals = open_signal_fd(FORWARDED)
    noted = False

    def relay() -> None:
        nonlocal noted
        assert signals is not None
        for signum, sender in read_signals(signals):
            if sender == parent and parent is not None and not noted:
                # MPI's process manager passes on only what mpiexec received (hydra's own
                # cleanup is SIGKILL): the job is being stopped from outside, not failing
                noted = write_record(folder, "signalled", rank,
                                     {"rank": rank, "signal": signum, "time": time.time()})
            child.send_signal(signum)

    launcher_gone = False
    while True:
        ended = wait_for_exit([p for p in (child.pid, launcher, parent) if p is not None],
                              wake=signals)
        if ended is None:
            relay()
            continue
        if ended == child.pid:
            break
        if ended == parent:
            # MPI's process manager is gone: the rank's output goes nowhere, and the job
            # cannot finish; say so before the rank is stopped (its end is not the cause)
            write_record(folder, "orphaned", rank, {"rank": rank, "manager": manager or "?",
                                                    "pid": parent, "time": time.time()})
            parent = None
        else:
            # The launcher is gone: nobody will collect this run, and the job must not outlive it.
            launcher_gone, launcher = True, None
            shutil.rmtree(folder, ignore_errors=True)  # at once: the rank may take seconds
        stop_process(child.pid)
    code = child.wait()
    if signals is not None:
        # hydra's proxy signals the sentinel's process group, the rank with it, and the kernel
        # queues the signal to every member before any of them can be seen to end: a signal
        # that ended the rank is read here, and noted before its end is
        relay()
    if launcher is not None and not is_running(launcher):
        # killed as the rank ended (its mpiexec passes SIGTERM on to every rank when it dies),
        # and seen here first: the same as above
        launcher_gone = True
    if launcher_gone:
        # last, after what this sentinel wrote: a note written beside another sentinel's
        # removal of the folder kept it (an empty or all but empty folder left behind)
        shutil.rmtree(folder, ignore_errors=True)
    elif not os.path.exists(record_path(folder, "end", rank)):
        write_record(folder, "gone", rank,
                     {"rank": rank, "pid": child.pid, "returncode": code, "time": time.time()})
    return code


def exit_like(code: int) -> None:
    """End this process as a child with returncode ``code`` ended (the same signal or status)."""
    if code < 0:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the rank's crash, not ours
        except (ImportError, ValueError, OSError):
            pass
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
            pass
        try:  # it may be blocked (read from a signalfd): it would then wait, and not end us
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal that does not end a process by default
    os._exit(code)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -I -S sentinel.py COMMAND [ARGS]")
    folder, rank = os.environ.get(RUN_DIR), env_rank(os.environ)
    if not folder or rank is None or not os.path.isdir(folder):
        os.execvp(argv[0], argv)  # nothing to record here: be the rank
    launcher = visible_launcher(os.environ.get(LAUNCHER, ""))
    fds = inherited_fds(os.environ)
    if fds is not None:
        close_other_fds(fds)
    parent = os.getppid()
    exit_like(supervise_rank(argv, folder, rank, launcher, parent if parent > 1 else None, fds))


if __name__ == "__main__":
    main(sys.argv[1:])
