"""``canary run``'s launcher side: start mpiexec, pass its output on, stop the job with the
launcher, and say how the job ended.

* **Stopping.** mpiexec runs in its own session, so a Ctrl-C in the terminal reaches only the
  launcher, which sends mpiexec SIGTERM (MPICH's hydra then ends every rank quietly: SIGINT
  would make each Python rank print a ``KeyboardInterrupt`` traceback) and SIGKILL if it has
  not ended after :data:`STOP_GRACE` seconds; a second Ctrl-C kills at once. SIGTERM and
  SIGHUP do the same. On Linux mpiexec gets SIGTERM when the launcher dies, even by SIGKILL
  (``PR_SET_PDEATHSIG``), and the sentinel of every rank on the launcher's host stops its rank
  when the launcher is gone (:mod:`canary.sentinel`). Ranks left on this host after mpiexec
  has ended are killed. While no job runs (``canary run`` starting, or between a job and its
  relaunch), :func:`stopped_by_signals` turns those signals into :class:`Stopped`, so that
  ``canary run`` says what was not started instead of ending without a word.
* **Output.** With MPICH's hydra, every line a rank prints comes tagged with its rank
  (``-prepend-pattern``), and :class:`OutputFilter` turns the stream back into the ranks'
  lines: rank 0's lines pass at once; a line of another rank is held back up to ``hold``
  seconds and dropped if rank 0 printed the same line within ``hold`` seconds of it (an
  argument error or ``--help`` printed by every rank shows once); MPICH's own ``Abort(...)``
  lines and termination banners are dropped, because canary says what happened. Other MPIs'
  output passes through untouched.
* **Run folder.** The ranks record their start and end in a run folder in the temp directory
  (:mod:`canary.ranks`), named after the launcher (:func:`make_run_folder`). The launcher
  removes it when it ends, the sentinels when they see the launcher killed, and the next run
  one that a launcher killed with SIGKILL before any sentinel ran left behind
  (:func:`remove_stale_run_folders`).
* **Exit status.** The sentinels note there how a rank that did not finish ended, and
  :func:`verdict` reads that with what mpiexec said: 0 only when rank 0 (the controller)
  finished normally; a rank that ended before the job finished is named with how it ended.
  Should mpiexec run on :data:`GONE_GRACE` seconds after such a note (the others waiting for
  that rank), the launcher stops it as for a signal, and the rank's end is the job's.
"""

from __future__ import annotations

import hashlib
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, TextIO

from canary.mpich_shm import remove_orphan_topologies, remove_orphans, remove_stale
from canary.ranks import Orphaned, RunRecords, read_records, role
from canary.sentinel import (
    LAUNCHER,
    RUN_DIR,
    RUN_RANKS,
    die_with_parent,
    process_name,
    process_start_time,
    stop_process,
    wait_for_exit,
)

STDOUT, STDERR = 1, 2
STOP_GRACE = 5.0  # seconds mpiexec gets to end the job after SIGTERM before SIGKILL
BOOTSTRAP_GRACE = 5.0  # seconds mpiexec may go without a child before it is taken for stuck
# seconds mpiexec may run on after a rank ended without finishing: hydra ends such a job in
# milliseconds, but once (a worker's os._exit(0), in about a hundred runs of that test) it left
# the others waiting for that rank until the job's time limit. Longer than a worker waits for
# rank 0's abort before it ends the job itself (5 s: canary.mpi_runner).
GONE_GRACE = 10.0
HOLD = 2.0  # seconds a line of a rank other than 0 waits for rank 0 to print the same
REMEMBERED = 1000  # lines of rank 0 kept per rank and stream to match later duplicates
# Tag hydra puts before every line of a rank (%r: its rank). The control characters cannot be
# mistaken for anything a rank prints.
TAG_PATTERN = "\x1e%r\x1f"
_TAG = re.compile(rb"\x1e(\d{1,9})\x1f")
_TAG_START = re.compile(rb"\x1e\d{0,9}")
_ABORT = re.compile(rb"Abort\((-?\d+)\) on node \d+ \(rank \d+ in comm \d+\): "
                    rb"application called MPI_Abort")
_TIMED_OUT = re.compile(rb"\[mpiexec@[^\]]*\] APPLICATION TIMED OUT, TIMEOUT = (\d+)s")
_MPIEXEC_NOISE = re.compile(  # hydra's termination banner and Ctrl-C notices
    rb"=+|=   .*|YOUR APPLICATION TERMINATED WITH THE EXIT STRING: .*"
    rb"|This typically refers to a problem with your application\."
    rb"|Please see the FAQ page for debugging suggestions"
    rb"|\[mpiexec@[^\]]*\] (Sending Ctrl-C to processes as requested"
    rb"|Press Ctrl-C again to force abort)")
_PROXY = re.compile(rb"\[proxy:[^\]]*\] ")  # a hydra proxy's own complaint
# mpiexec's trace of a process that ended badly, one line per function it unwinds
# ("[mpiexec@vm] HYDT_bscu_wait_for_completion (.../bscu_wait.c:109): one of the processes
# terminated badly; aborting", then "launcher returned error waiting for completion" twice and
# main's "process manager error waiting for completion"): the echo of a kill when the time
# limit stopped the job
_WAIT_TRACE = re.compile(rb"\[mpiexec@[^\]]*\] \w+ \([^)]*\): (one of the processes "
                         rb"terminated badly; aborting|.*error waiting for completion)")
# hydra's banner for a process that ended badly (under canary: a sentinel; which one, see
# killed_sentinel)
_BAD_PID = re.compile(rb"=   PID (\d+) RUNNING AT (\S+)")
_BAD_CODE = re.compile(rb"=   EXIT CODE: (\d+)")


RUN_FOLDER_PREFIX = "canary-run-"
# canary-run-PID-START-OWNER-RANDOM: the launcher's pid and start time, and where it runs
_RUN_FOLDER = re.compile(r"canary-run-(\d+)-(\d+)-([0-9a-f]{8})-[a-z0-9_]+")


def _where() -> str:
    """Eight hex digits that stand for this host and pid namespace: a launcher's pid and start
    time say whether it still runs only where both are the same."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()} {namespace}".encode()).hexdigest()[:8]


def make_run_folder(tmpdir: str | None = None) -> str:
    """Make this launcher's run folder in ``tmpdir`` (default: the temp directory) and return
    its path. Its name holds this process's pid and start time, so that
    :func:`remove_stale_run_folders` can tell once the launcher is gone."""
    me = os.getpid()
    return tempfile.mkdtemp(prefix=f"{RUN_FOLDER_PREFIX}{me}-{process_start_time(me) or 0}-"
                                   f"{_where()}-", dir=tmpdir)


def remove_stale_run_folders(tmpdir: str | None = None) -> list[str]:
    """Remove the run folders in ``tmpdir`` (default: the temp directory) whose launcher is
    gone, and return their paths.

    The launcher removes its folder when it ends, and the sentinels when they see it killed;
    but a launcher killed with SIGKILL before any sentinel ran, or while a rank still wrote to
    the folder, left it. Removed is only a folder that is surely stale: this user's, made (see
    :func:`make_run_folder`) on this host and in this pid namespace, whose launcher's pid no
    longer names a process with its start time. Any other (another host's on a shared temp
    directory, another user's, an older canary's without a launcher in its name) is kept.
    """
    me = os.getpid()
    if process_start_time(me) is None:  # no /proc: no launcher can be known to be gone
        return []
    base, here, removed = tmpdir or tempfile.gettempdir(), _where(), []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return []
    for entry in entries:
        m = _RUN_FOLDER.fullmatch(entry.name)
        if m is None or m.group(3) != here or m.group(2) == "0":
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if process_start_time(int(m.group(1))) != m.group(2):  # gone, or its pid reused
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def is_hydra(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is MPICH's hydra with the option the launcher relies on
    (``-prepend-pattern``); False if it cannot be asked."""
    try:
        r = subprocess.run([mpiexec, "--help"], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    text = r.stdout + r.stderr
    return "Hydra" in text and "-prepend-pattern" in text


def hydra_options() -> list[str]:
    """The mpiexec options that let :class:`OutputFilter` read hydra's output."""
    return ["-prepend-pattern", TAG_PATTERN]


def sentinel_command() -> list[str]:
    """The command that starts a rank's sentinel (:mod:`canary.sentinel`) in front of the
    rank's own command: isolated (``-I -S``) so that it starts in milliseconds."""
    return [sys.executable, "-I", "-S", str(Path(__file__).with_name("sentinel.py"))]


def _signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; ``signal 99`` for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def how_it_ended(returncode: int) -> tuple[str, int]:
    """How a rank that did not finish ended, from its returncode (negative: the signal that
    killed it): a phrase (``was killed by SIGKILL``, ``exited with status 3``) and the exit
    status of ``canary run`` that reports it (128 + signal, the exit status, or 1 for a rank
    that exited with 0 before the job finished)."""
    if returncode < 0:
        return f"was killed by {_signal_name(-returncode)}", 128 - returncode
    return f"exited with status {returncode}", returncode or 1


# signals whose default action dumps core: the wait status of a process one of them killed
# has the core flag (128) where core files are allowed
_DUMPS_CORE = frozenset(getattr(signal, name) for name in (
    "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGSEGV", "SIGSYS", "SIGXCPU",
    "SIGXFSZ") if hasattr(signal, name))


def banner_returncode(code: int) -> int:
    """The returncode (as :mod:`subprocess` gives it: negative for the signal that killed it)
    of the process hydra's banner names with ``EXIT CODE: code``.

    Since MPICH 3.2 hydra prints the banner only for a process that did not exit by itself, and
    the code is then its wait status: the signal's number, plus 128 where the process dumped
    core (139: SIGSEGV, 134: SIGABRT). That is not a shell's 128 + signal: SIGKILL, which never
    dumps core, is always 9, never 137. Hydra before 3.2 printed it for an exit status other
    than 0 too, as that status. So 1 to 64 is taken for the signal, and so is 128 + a signal
    that dumps core; any other code (137, 255) cannot be the wait status of a killed process,
    and is taken for an exit status.
    """
    if 0 < code < 65:
        return -code
    if code - 128 in _DUMPS_CORE:
        return 128 - code
    return code


def _what_to_check(returncode: int) -> str:
    """What a user should look into when a process of the job (one whose end is surely the
    first: not one of those MPI killed after it) ended as ``returncode`` says: for SIGKILL
    (``"; ..."``, to follow the line's account of it), the kernel's out-of-memory killer; ``""``
    for anything else."""
    if returncode != -signal.SIGKILL:
        return ""
    return ("; a SIGKILL no one sent most often comes from the kernel's out-of-memory killer: "
            "`dmesg` on that host says whether it killed the process, and if it did, the job "
            "needs more memory than the host had free")


@dataclass
class _Held:
    line: bytes
    since: float


class OutputFilter:
    """Reads hydra's rank-tagged output (both streams) back into lines, and decides what is
    printed; also collects what mpiexec said about the ranks.

    Feed it bytes as they come (:meth:`feed`), call :meth:`tick` now and then to release held
    lines, :meth:`finish` at the end, and write what :meth:`take` returns, in order.

    How the tags are read: hydra puts the tag before every line a rank starts and before every
    chunk it forwards, so a stretch of text belongs to the rank of the tag before it, and text
    after a rank's newline that has no tag of its own is mpiexec's own message.
    """

    def __init__(self, ranks: int, hold: float = HOLD, remembered: int = REMEMBERED) -> None:
        self.ranks = ranks
        self.hold = hold
        self.remembered = remembered
        self.aborts: dict[int, int] = {}  # rank -> the code it called MPI_Abort with
        self.timed_out: int | None = None  # hydra's MPIEXEC_TIMEOUT expired after this many s
        self.wrote_stderr: set[int] = set()  # ranks that printed anything on stderr
        self.said_abort: set[int] = set()  # ranks that printed "canary: job aborted: ..."
        # rank 0 printed "canary: error: ...": the job's settings were wrong, and it aborts
        # the job with status 2 before anything ran (canary.mpi_runner)
        self.said_error = False
        # the process hydra's first banner names as ended badly: (pid, host, its exit code);
        # the first in rank order of those its host's process manager saw killed, not the first
        # to end (see killed_sentinel)
        self.bad_end: tuple[int, str, int | None] | None = None
        # hydra's complaints as its processes are killed (its proxies', mpiexec's trace of one
        # that ended badly): held to the end (see finish)
        self._complaints: list[tuple[int, bytes]] = []
        self._raw = {STDOUT: b"", STDERR: b""}
        self._owner: dict[int, int | None] = {STDOUT: None, STDERR: None}
        self._partial: dict[tuple[int, int | None], tuple[bytes, float]] = {}
        self._held: dict[tuple[int, int], deque[_Held]] = {}
        # (stream, rank) -> line -> when rank 0 printed it, each time: the same line from that
        # rank within ``hold`` seconds is the copy every rank prints (a usage line)
        self._owed: dict[tuple[int, int], dict[bytes, deque[float]]] = {}
        self._out: list[tuple[int, bytes]] = []

    def take(self) -> list[tuple[int, bytes]]:
        """What is to be written since the last call: ``(STDOUT or STDERR, bytes)`` in order."""
        out, self._out = self._out, []
        return out

    def feed(self, stream: int, data: bytes, now: float) -> None:
        """Take ``data`` read from mpiexec's ``stream`` at time ``now``."""
        buf = self._raw[stream] + data
        i = 0
        while i < len(buf):
            j = buf.find(b"\x1e", i)
            if j < 0:
                self._text(stream, buf[i:], now)
                i = len(buf)
                break
            if j > i:
                self._text(stream, buf[i:j], now)
            m = _TAG.match(buf, j)
            if m:
                self._owner[stream] = int(m.group(1))
                i = m.end()
                continue
            if _TAG_START.fullmatch(buf, j):  # a tag cut in two by the read: wait for the rest
                break
            self._text(stream, buf[j:j + 1], now)
            i = j + 1
        self._raw[stream] = buf[i:]

    def tick(self, now: float) -> None:
        """Release what has waited ``hold`` seconds: held lines of ranks other than 0, and
        unfinished lines (a prompt, a progress bar) of any rank."""
        for (stream, _), q in self._held.items():
            while q and now - q[0].since >= self.hold:
                self._out.append((stream, q.popleft().line))
        for (stream, owner), (text, since) in list(self._partial.items()):
            if owner is not None and now - since >= self.hold:
                self._release_held(stream, owner)
                self._out.append((stream, text))
                del self._partial[(stream, owner)]

    def finish(self, stopped: bool = False) -> None:
        """The output has ended: unfinished lines count as lines; everything held is released.

        Hydra's proxies may complain as they are killed (``assert (!closed) failed``), and
        mpiexec traces a process that ended badly (``one of the processes terminated badly;
        aborting``): their lines are held to the end and dropped if the job was ``stopped`` by
        the launcher or ran out of time, since canary then says what happened.
        """
        for stream in (STDOUT, STDERR):
            rest, self._raw[stream] = self._raw[stream], b""
            if rest:
                self._text(stream, rest, float("inf"))
        # rank 0 first, so that the other ranks' last lines can still be matched against it
        for key in sorted(self._partial, key=lambda k: (k[1] is None, k[1] or 0, k[0])):
            text, _ = self._partial.pop(key)
            self._line(key[0], key[1], text, float("inf"))
        for key in sorted(self._held):
            self._release_held(*key)
        if not (stopped or self.timed_out is not None):
            self._out.extend(self._complaints)
        self._complaints.clear()

    # -- internals --------------------------------------------------------------------------

    def _text(self, stream: int, text: bytes, now: float) -> None:
        while text:
            owner = self._owner[stream]
            k = text.find(b"\n")
            piece, text = (text, b"") if k < 0 else (text[:k + 1], text[k + 1:])
            before, since = self._partial.pop((stream, owner), (b"", now))
            if k < 0:
                self._partial[(stream, owner)] = (before + piece, since)
                return
            self._line(stream, owner, before + piece, now)
            self._owner[stream] = None  # untagged text after a rank's newline is mpiexec's

    def _line(self, stream: int, owner: int | None, line: bytes, now: float) -> None:
        if owner is None:
            self._mpiexec_line(stream, line)
            return
        abort = _ABORT.match(line)
        if abort:
            self.aborts.setdefault(owner, int(abort.group(1)))
            return
        if stream == STDERR:
            self.wrote_stderr.add(owner)
            if line.startswith(b"canary: job aborted: "):
                self.said_abort.add(owner)
            elif owner == 0 and line.startswith(b"canary: error: "):
                self.said_error = True
        if owner == 0:
            self._out.append((stream, line))
            for rank in range(1, self.ranks):
                self._match_rank0_line(stream, rank, line, now)
            return
        owed = self._owed.get((stream, owner))
        times = owed.get(line) if owed else None
        if times:
            while times and now - times[0] > self.hold:  # printed long before: its own line
                times.popleft()
            if times:  # rank 0 printed this a moment ago
                times.popleft()
                return
        self._held.setdefault((stream, owner), deque()).append(_Held(line, now))

    def _match_rank0_line(self, stream: int, rank: int, line: bytes, now: float) -> None:
        q = self._held.get((stream, rank))
        if q:
            for i, held in enumerate(q):
                if held.line == line:
                    del q[i]
                    return
        owed = self._owed.setdefault((stream, rank), {})
        owed.setdefault(line, deque()).append(now)
        if len(owed) > self.remembered:
            del owed[next(iter(owed))]

    def _release_held(self, stream: int, rank: int) -> None:
        q = self._held.get((stream, rank))
        while q:
            self._out.append((stream, q.popleft().line))

    def _mpiexec_line(self, stream: int, line: bytes) -> None:
        text = line.rstrip(b"\r\n")
        if not text.strip():
            return  # hydra pads its banners with blank lines (a rank's blank line is tagged)
        m = _TIMED_OUT.fullmatch(text)
        if m:
            self.timed_out = int(m.group(1))
            return
        bad = _BAD_PID.fullmatch(text)
        if bad and self.bad_end is None:
            self.bad_end = (int(bad.group(1)), bad.group(2).decode(errors="replace"), None)
        code = _BAD_CODE.fullmatch(text)
        if code and self.bad_end is not None and self.bad_end[2] is None:
            self.bad_end = (*self.bad_end[:2], int(code.group(1)))
        if _MPIEXEC_NOISE.fullmatch(text):
            return
        if _PROXY.match(text) or _WAIT_TRACE.fullmatch(text):
            self._complaints.append((stream, line))
            return
        self._out.append((stream, line))


@dataclass(frozen=True)
class JobSnapshots:
    """Where a job writes its snapshots and which of those there are its own."""

    folder: str = ""  # canary run --checkpoint DIR; "" when the job keeps none
    first: int = 1  # the id of this run's first snapshot: lower ones are an earlier run's
    resumed: tuple[str, int] | None = None  # the snapshot it resumed from: (its folder, id)


@dataclass
class JobEnd:
    """Everything known once mpiexec has ended."""

    records: RunRecords
    mpiexec_status: int  # as subprocess reports it: negative for a signal
    stopped_by: int | None = None  # the signal that made the launcher stop the job
    timed_out: int | None = None
    aborts: dict[int, int] = field(default_factory=dict)
    wrote_stderr: set[int] = field(default_factory=set)
    said_abort: set[int] = field(default_factory=set)  # see OutputFilter.said_abort
    said_error: bool = False  # see OutputFilter.said_error
    host: str = ""  # this host's name: ranks elsewhere are named with their host
    snapshots: JobSnapshots = field(default_factory=JobSnapshots)
    mpiexec_pid: int = 0
    stuck: str | None = None  # mpiexec's child whose end made the launcher stop the job
    # the launcher stopped mpiexec, which ran on GONE_GRACE seconds after a rank ended
    # without finishing: that rank's end is the job's
    gone_stop: bool = False
    bad_end: tuple[int, str, int | None] | None = None  # see OutputFilter.bad_end
    hydra: bool = False  # mpiexec is MPICH's hydra (see relayed_signal)
    ranks: int = 0  # how many ranks the job has (0: not known)


_STOP_WORDS: dict[int, str] = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated",
                               signal.SIGHUP: "hung up"}
LOST = ("the job's results are lost unless it kept snapshots (with --checkpoint DIR, "
        "`canary run --resume DIR` continues from the last one)")


def stop_word(signum: int) -> str:
    """How ``canary run`` says it got stop signal ``signum``: ``interrupted`` (SIGINT),
    ``terminated`` (SIGTERM), ``hung up`` (SIGHUP); ``stopped`` for any other."""
    return _STOP_WORDS.get(signum, "stopped")


def results_left(snapshots: JobSnapshots) -> str:
    """What became of an unfinished job's results: that its snapshots are in its --checkpoint
    folder (those numbered from ``snapshots.first`` on), else the snapshot it was resumed from,
    else that they are lost (saying so of the snapshots an earlier run left in the folder, which
    ``--resume`` would take, and of a job that kept none)."""
    folder = snapshots.folder
    if not folder:
        return LOST
    from canary.snapshot import SnapshotError, committed

    try:
        ids = [s.id for s in committed(folder)]
    except SnapshotError:
        ids = []
    if any(k >= snapshots.first for k in ids):  # the newest: --resume takes them first
        return f"its snapshots are in {folder}: `canary run --resume {folder}` continues from " \
               "the last one"
    if snapshots.resumed is not None:
        where, k = snapshots.resumed
        return (f"it had committed no snapshot to {folder} since it resumed: `canary run "
                f"--resume {where}` starts again from snapshot {k}")
    earlier = (f"; the snapshots there are an earlier run's, which `--resume {folder}` would "
               "continue" if ids else "")
    return (f"the job's results are lost: it had committed no snapshot to {folder} yet (the "
            f"first comes --checkpoint-every seconds into the run){earlier}")


def _lost(end: JobEnd) -> str:
    """:func:`results_left` for the job that ended as ``end`` says."""
    return results_left(end.snapshots)


def relayed_signal(end: JobEnd) -> int | None:
    """The signal mpiexec received from outside ``canary run`` (``kill`` of mpiexec, a batch
    system) and passed on to the ranks, as the ranks' sentinels noted it, or None.

    Only under hydra: its process managers pass on to the ranks only the signals mpiexec
    received, and end them by themselves only with SIGKILL, which no sentinel can note; another
    MPI's may end the ranks with SIGTERM after one of them failed.
    """
    if not end.hydra or not end.records.signalled:
        return None
    return min(end.records.signalled.values(), key=lambda s: s.time).signal


def verdict(end: JobEnd) -> tuple[int, list[str]]:
    """The exit status of ``canary run`` and the lines it prints about how the job ended.

    0 means rank 0 (the controller) finished: its driver ran to the end and exited with 0. A
    driver that stopped early by itself on every rank (``--help``: 0, an argument error: 2)
    gives its own status. A rank that ended before the job finished (killed, crashed, an
    ``os._exit`` in a kernel) makes the status non-zero (128 + signal for a signal) and is
    named with how it ended; a rank that aborted the job on purpose has printed why, and its
    abort code is the status. 130/143/129: the launcher was interrupted (SIGINT), terminated
    (SIGTERM) or hung up (SIGHUP) and stopped the job; 128 + the signal too when mpiexec
    received one from outside and passed it on to the ranks (:func:`relayed_signal`), one line
    naming mpiexec. 124: mpiexec's time limit expired.

    The job's output reaches ``canary run`` through mpiexec and MPI's process manager on each
    host (hydra's proxy): when one of them died, the job is not 0 even if the controller
    finished, since its last lines may be lost (128 + signal for a killed mpiexec, 1 for a
    lost process manager).
    """
    rec = end.records
    if end.stopped_by is not None:
        line = f"canary: {stop_word(end.stopped_by)}; job stopped"
        if end.snapshots.folder:  # where it can go on from
            line += f"; {_lost(end)}"
        return 128 + end.stopped_by, [line]
    if end.stuck is not None:
        return 1, [f"canary: mpiexec waited for {end.stuck} with none left running, and was "
                   "stopped: the srun or ssh that starts MPI's process manager on each host "
                   "failed (see its message above; under Slurm, does `srun hostname` work "
                   f"here?); {_lost(end)}"]
    if end.timed_out is not None:
        return 124, [f"canary: the job ran past its time limit of {end.timed_out} s "
                     f"(--timeout or MPIEXEC_TIMEOUT) and was stopped; {_lost(end)}"]

    def name(rank: int) -> str:
        start = rec.starts.get(rank)
        if start is None:
            return role(rank)
        where = "" if start.host == end.host else f" on {start.host}"
        return f"{role(rank)[:-1]}, pid {start.pid}{where})"

    unfinished = sorted(r for r in rec.starts if r not in rec.ends)
    finished = rec.ends.get(0) == 0
    cut_short = ("the controller had finished, but its last output may not have reached "
                 "canary run: check the job's output files")
    # the ranks that ended first (the others were killed while MPI cleaned up), not on purpose
    died = sorted((r for r in rec.gone if r not in end.aborts), key=lambda r: rec.gone[r].time)

    def died_first() -> tuple[int, list[str]]:
        first = died[0]
        returncode = rec.gone[first].returncode
        phrase, status = how_it_ended(returncode)
        line = (f"canary: {name(first)} {phrase} before the job finished"
                f"{_what_to_check(returncode)}; {_lost(end)}")
        if len(died) > 1:
            line += f" ({', '.join(role(r) for r in died[1:])} ended too)"
        return status, [line]

    if end.gone_stop and died:  # what canary run's own stop did to mpiexec says nothing
        return died_first()
    if end.mpiexec_status < 0:  # not stopped by canary run: killed by someone else
        phrase, status = how_it_ended(end.mpiexec_status)
        who = f"mpiexec (pid {end.mpiexec_pid})" if end.mpiexec_pid else "mpiexec"
        if finished:
            return status, [f"canary: {who} {phrase} as the job ended: {cut_short}"]
        left = (f"; the ranks it left ({', '.join(name(r) for r in unfinished)}) were stopped"
                if unfinished else "")
        return status, [f"canary: {who} {phrase} before the job finished{left}; {_lost(end)}"]
    relayed = relayed_signal(end)
    if relayed is not None and not finished:  # the ranks ended as told: no rank failed
        who = f"mpiexec (pid {end.mpiexec_pid})" if end.mpiexec_pid else "mpiexec"
        line = (f"canary: {stop_word(relayed)}: {who} received {_signal_name(relayed)} from "
                "outside canary run; job stopped")
        if end.snapshots.folder:
            line += f"; {_lost(end)}"
        return 128 + relayed, [line]
    managers = _lost_managers(rec)
    if managers:
        host0 = rec.starts[0].host if 0 in rec.starts else None
        who = "; ".join(f"{m.manager} (pid {m.pid}"
                         + ("" if host == end.host else f" on {host}")
                         + f", which ran {', '.join(role(r) for r in ranks)})"
                         for host, m, ranks in managers)
        if finished and all(host != host0 and 0 not in ranks for host, _, ranks in managers):
            return 0, [f"canary: note: MPI's process manager {who} died after the controller had "
                       "finished the job; the results are complete"]
        if finished:
            return 1, [f"canary: MPI's process manager {who} died as the job ended: {cut_short}"]
        return 1, [f"canary: MPI's process manager {who} died before the job finished (was it "
                   f"killed, or out of memory?), and its ranks were stopped; {_lost(end)}"]
    if 0 in rec.ends:
        status, lines = rec.ends[0], []
        if status == 0 and not unfinished and end.mpiexec_status > 0:
            return 1, [f"canary: mpiexec exited with status {end.mpiexec_status} though every "
                       f"rank had finished (MPI's process manager failed): {cut_short}"]
        if status == 0:
            for r in unfinished:
                how = how_it_ended(rec.gone[r].returncode)[0] if r in rec.gone else "ended"
                lines.append(f"canary: note: {name(r)} {how} after the controller had finished "
                             "the job; the results are complete")
            failed = [r for r in sorted(rec.ends) if rec.ends[r] != 0]
            if failed:
                status = rec.ends[failed[0]]
                lines.append(f"canary: {name(failed[0])} exited with status {status}")
            return status, lines
        for r in died:
            returncode = rec.gone[r].returncode
            lines.append(f"canary: {name(r)} {how_it_ended(returncode)[0]} before the job "
                         f"finished{_what_to_check(returncode)}")
        return status, lines
    if died:
        return died_first()
    on_purpose = [*end.aborts, *(r for r in sorted(rec.ends) if rec.ends[r] != 0)]
    if on_purpose:
        first = on_purpose[0]
        status = end.aborts.get(first, rec.ends.get(first, 1)) or 1
        # the rank that aborted first and said why speaks for the ranks that followed it (the
        # workers' fallback when hydra drops the controller's abort)
        said = next(iter(end.aborts), None) in end.wrote_stderr
        lines = [] if said else [f"canary: {name(r)} ended the job with MPI_Abort({code})"
                                 for r, code in end.aborts.items() if r not in end.wrote_stderr]
        return status, lines  # the others have said why
    if end.said_abort or end.said_error:
        # A rank said why it aborted the job (rank 0 prints the reason before it tells the
        # workers), but no rank's MPI_Abort line came through (hydra loses it once in tens of
        # jobs) and no rank's end was recorded: the reason said speaks for the job, and "the
        # job ended before it finished" after it would read as a second failure. A start-up
        # error (a malformed CANARY_* setting, seen once in 41 such jobs) is status 2, as it
        # is when the abort comes through: nothing ran.
        return (1 if end.said_abort else 2), []
    # nothing else said how: hydra's banner names a process that ended badly, and a sentinel
    # that was killed could not note its rank's end (hydra names one of those it killed too,
    # so this comes last)
    sentinel = killed_sentinel(end)
    if sentinel is not None:
        rank, code = sentinel
        returncode = banner_returncode(code)
        phrase, status = how_it_ended(returncode)
        if rank is not None:
            return status, [f"canary: the sentinel (pid {rec.starts[rank].sentinel}) of "
                            f"{name(rank)} {phrase} before the job finished, so how its rank "
                            f"ended is not known{_what_to_check(returncode)}; {_lost(end)}"]
        # no advice on a SIGKILL here: it may be hydra's own, sent once another process ended
        host = end.bad_end[1] if end.bad_end is not None else end.host
        where = "" if host == end.host else f" on {host}"
        return status, [f"canary: a rank's sentinel{where} {phrase} before the job finished, so "
                        "how its rank ended is not known, nor which rank's it was (hydra then "
                        "kills the other sentinels with SIGKILL too, and names the first in rank "
                        f"order); {_lost(end)}"]
    early = _killed_unstarted(end)
    if early is not None:
        pid, signum = early
        phrase, status = how_it_ended(-signum)
        return status, [f"canary: a rank's sentinel ended before its rank had started: it "
                        f"{phrase} (hydra names pid {pid} on this host, which is no started "
                        f"rank's sentinel); {_lost(end)}"]
    if not rec.starts:  # the ranks could not record (another host, or another MPI): trust mpiexec
        code = end.mpiexec_status
        if code == 0:
            return 0, []
        # Why a line: hydra ORs its processes' wait statuses together, so a rank killed on
        # another host can end canary run with 9, 11 or 15 and nothing else said
        named = ""
        if end.bad_end is not None:
            pid, host, banner = end.bad_end
            if banner is not None:
                where = "this host" if host == end.host else host
                named = (f"; hydra names pid {pid} on {where}, which "
                         f"{how_it_ended(banner_returncode(banner))[0]}")
        # a driver may have ended so by itself, its results out: where it can go on from is
        # said only to a job that kept snapshots
        line = (f"canary: the job ended with mpiexec's exit status {code}{named}; no rank could "
                "record here how it ended (ranks on other hosts record only where the run "
                "folder is shared): see the ranks' own lines above. MPICH's mpiexec combines "
                "the ranks' statuses, so a status below 64 may also be the number of a signal "
                "that killed one")
        if end.snapshots.folder:
            line += f"; {_lost(end)}"
        return code, [line]
    status = end.mpiexec_status if end.mpiexec_status > 0 else 1
    names = ", ".join(name(r) for r in unfinished)
    return status, [f"canary: the job ended before it finished ({names} did not finish); "
                    f"{_lost(end)}"]


def _lost_managers(rec: RunRecords) -> list[tuple[str, Orphaned, list[int]]]:
    """The process managers whose death the ranks' sentinels saw, first first: (host, what
    the sentinels noted, the ranks they stopped)."""
    found: dict[tuple[str, int], tuple[Orphaned, list[int]]] = {}
    for r in sorted(rec.orphaned, key=lambda r: rec.orphaned[r].time):
        o = rec.orphaned[r]
        start = rec.starts.get(r)
        found.setdefault((start.host if start else "?", o.pid), (o, []))[1].append(r)
    return [(host, o, sorted(ranks)) for (host, _), (o, ranks) in found.items()]


def killed_sentinel(end: JobEnd) -> tuple[int | None, int] | None:
    """What hydra's banner (:attr:`OutputFilter.bad_end`) says of a started rank's sentinel
    that was killed, and so could not note how its rank ended: ``(rank, code)``, where rank is
    the rank whose sentinel it surely is, or None when the banner names a started rank's
    sentinel but need not mean the one that was killed, and code is hydra's exit code for it
    (see :func:`banner_returncode`). None when the banner names no started rank's sentinel.

    Hydra's process manager kills every process of its host with SIGKILL as soon as one was
    killed, and the banner then names the first *in rank order* of those killed, not the first
    to be: a sentinel named with SIGKILL is surely the one killed only when it ran the only rank
    of its host (every rank had started, so all of that host's are known). One named with
    another signal got it from elsewhere than hydra's cleanup: it is named as it is.
    """
    if end.bad_end is None:
        return None
    pid, host, code = end.bad_end
    starts = end.records.starts
    named = next((s for s in starts.values() if s.sentinel == pid and s.host == host), None)
    if named is None or code is None:
        return None
    alone = len(starts) == end.ranks and [s.host for s in starts.values()].count(host) == 1
    return (named.rank if code != signal.SIGKILL or alone else None), code


def _killed_unstarted(end: JobEnd) -> tuple[int, int] | None:
    """The pid hydra named first as ended badly and the signal that killed it, when that
    process ran on this host and is neither a started rank nor its sentinel: the sentinel of a
    rank that had not recorded its start yet (a sentinel killed early, so its rank never
    started). None otherwise. Ranks on this host record their start, so a rank of this host
    that had started would be known."""
    if end.bad_end is None:
        return None
    pid, host, code = end.bad_end
    # a signal (banner_returncode), not 1 or 2: a rank that cannot even start Python exits with
    # those, and an older hydra named such a process too
    if host != end.host or code is None or code in (1, 2) or banner_returncode(code) >= 0:
        return None
    if any(pid in (s.pid, s.sentinel) for s in end.records.starts.values()):
        return None
    return pid, -banner_returncode(code)


# -- supervising mpiexec -------------------------------------------------------------------


class Stopped(BaseException):
    """``canary run`` got SIGINT, SIGTERM or SIGHUP while it ran no job (see
    :func:`stopped_by_signals`); ``signum`` is the signal. A BaseException, as
    KeyboardInterrupt is, so that no ``except Exception`` on its way takes it for an error."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """While in it, SIGINT, SIGTERM and SIGHUP raise :class:`Stopped` in the main thread, where
    SIGTERM and SIGHUP would end the process without a word; :func:`supervise_job` handles them
    itself while it runs a job. Only the first is raised: it puts the handlers that were there
    before back, so that a second signal acts as it would have (ends the process at once while
    the first one unwinds). Nothing is installed outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in _Stopper.SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def handle(signum: int, frame: object) -> None:
        restore()
        raise Stopped(signum)

    for sig in previous:
        signal.signal(sig, handle)
    try:
        yield
    finally:
        restore()


class _Stopper:
    """Turns SIGINT/SIGTERM/SIGHUP to the launcher into stopping mpiexec (see module doc)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.since = 0.0
        self.proc: subprocess.Popen[bytes] | None = None
        self.forced = False
        self.stuck: str | None = None  # the launcher's own reason to stop mpiexec
        self.gone_stop = False  # ... or a rank that ended without finishing (GONE_GRACE)
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum, self.since = signum, time.monotonic()
            self.started(self.proc)
        elif signum == signal.SIGINT:  # a second Ctrl-C: no more waiting
            self._kill()

    def stop(self, why: str) -> None:
        """Stop mpiexec as for a signal (SIGTERM, SIGKILL after the grace), for ``why``."""
        if self.signum is None and self.stuck is None:
            self.stuck, self.since = why, time.monotonic()
            if self.proc is not None and self.proc.returncode is None:
                self.proc.send_signal(signal.SIGTERM)

    def stop_gone(self) -> None:
        """Stop mpiexec as :meth:`stop` does, for a rank that ended without finishing while
        mpiexec ran on: the job cannot finish without it."""
        if self.signum is None and self.stuck is None and not self.gone_stop:
            self.gone_stop, self.since = True, time.monotonic()
            if self.proc is not None and self.proc.returncode is None:
                self.proc.send_signal(signal.SIGTERM)

    def started(self, proc: subprocess.Popen[bytes] | None) -> None:
        """mpiexec is running as ``proc``: stop it at once if a signal came first."""
        self.proc = proc
        if proc is not None and self.signum is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)

    def escalate(self, now: float) -> None:
        """SIGKILL mpiexec if it has not ended :data:`STOP_GRACE` seconds after SIGTERM."""
        if (self.signum is not None or self.stuck is not None or self.gone_stop) \
                and now - self.since > STOP_GRACE:
            self._kill()

    def _kill(self) -> None:
        if not self.forced and self.proc is not None and self.proc.returncode is None:
            self.forced = True
            self.proc.kill()


class BootstrapWatch:
    """Notices that mpiexec waits for process managers that will never come.

    mpiexec runs MPI's process manager of its own host as its child, and starts those of other
    hosts through children that live as long as they do (``srun`` under Slurm, one ``ssh`` a
    host). An mpiexec left without any child for ``grace`` seconds waits for managers that
    are gone or never started (``srun`` refused the step), and MPICH's hydra would wait for
    them for ever. :meth:`update` takes mpiexec's children (pid -> program name) as seen now.
    """

    def __init__(self, grace: float = BOOTSTRAP_GRACE) -> None:
        self.grace = grace
        self.seen: dict[int, str] = {}
        self.alone_since: float | None = None

    def update(self, children: dict[int, str], now: float) -> str | None:
        """What mpiexec has waited for in vain once it has had no child for ``grace``
        seconds (``its process managers (srun, pid 12, ended)``), else None."""
        self.seen.update({p: n for p, n in children.items()
                          if n in ("srun", "ssh", "rsh", "hydra_pmi_proxy")})
        if children:
            self.alone_since = None
            return None
        if self.alone_since is None:
            self.alone_since = now
        if now - self.alone_since < self.grace:
            return None
        ended = ", ".join(f"{name}, pid {pid}" for pid, name in self.seen.items())
        return f"its process managers ({ended} ended)" if ended else "its process managers"


def _children(pid: int) -> dict[int, str] | None:
    """The children of process ``pid`` with their program names, or None where that cannot be
    known (not Linux, or a kernel without ``/proc/PID/task/TID/children``)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids = [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return None
    return {p: process_name(p) for p in pids}


def _writer(stream: TextIO) -> Callable[[bytes], None]:
    """Writes bytes to ``stream`` (through its binary buffer where it has one) at once."""
    binary: BinaryIO | None = getattr(stream, "buffer", None)

    def write(data: bytes) -> None:
        try:
            if binary is not None:
                stream.flush()
                binary.write(data)
                binary.flush()
            else:
                stream.write(data.decode(errors="replace"))
                stream.flush()
        except (BrokenPipeError, ValueError):
            pass  # the reader is gone (``canary run ... | head``): the job still runs to its end

    return write


def job_environment(env: dict[str, str], folder: str, ranks: int) -> dict[str, str]:
    """``env`` plus what the ranks and their sentinels need to know of this run."""
    me = os.getpid()
    return dict(env, **{RUN_DIR: folder, RUN_RANKS: str(ranks),
                        LAUNCHER: f"{me} {process_start_time(me) or 0} {socket.gethostname()}"})


def rank_lost(end: JobEnd, status: int) -> bool:
    """Whether the job ended because a rank died (killed, out of memory, its host lost), not
    because the driver or a kernel failed, the launcher or a signal to mpiexec stopped it or its
    time ran out: the case a relaunch from a snapshot recovers (``canary run --restarts``).
    Never once the controller's driver had ended with 0: the job's results were out, and a
    relaunch would run it again, and print its answer a second time, for lines that may not
    have come through."""
    rec = end.records
    if end.gone_stop and status != 0:  # the signal relayed was canary run's own stop
        return rec.ends.get(0) != 0
    if status == 0 or end.stopped_by is not None or end.timed_out is not None \
            or end.stuck is not None or relayed_signal(end) is not None:
        return False
    if rec.ends.get(0) == 0:
        return False
    if end.mpiexec_status < 0 or rec.orphaned or (
            not rec.gone and not end.aborts and not any(rec.ends.values())
            and (killed_sentinel(end) is not None or _killed_unstarted(end) is not None)):
        return True  # the process manager, or a rank's sentinel, is lost
    if rec.gone:  # a sentinel saw its rank end without finishing
        return any(r not in end.aborts for r in rec.gone)
    # no records of the ranks (on other hosts, say): a signal is all there is to go on
    return not rec.starts and status >= 128


def supervise_job(command: list[str], env: dict[str, str], ranks: int, hydra: bool,
                  snapshots: JobSnapshots = JobSnapshots()) -> tuple[int, bool]:
    """Run the mpiexec ``command`` (``ranks`` ranks, started by ``python -m canary.ranks``)
    to its end; return ``canary run``'s exit status (see :func:`verdict`) and whether the job
    ended because a rank died (:func:`rank_lost`). ``snapshots`` says where the job keeps its
    snapshots (``env`` tells the ranks), for what an unfinished job's last line says of them.

    ``hydra``: the command carries :func:`hydra_options`, and the output goes through
    :class:`OutputFilter`; otherwise mpiexec writes straight to this process's stdout and
    stderr. Raises OSError if mpiexec cannot be started.

    A stop signal (SIGINT, SIGTERM, SIGHUP) stops the job (128 + the signal); one that comes
    after mpiexec ended makes a job that lost a rank 128 + the signal too, and not lost, since
    a relaunch is not what was asked for. Before the job is started, and once this returns, the
    caller's handlers serve (:func:`stopped_by_signals`).
    """
    remove_stale()  # what earlier jobs that nothing cleaned up after left in /dev/shm
    remove_stale_run_folders()  # ... and in the temp directory
    started = time.time()
    stopper = _Stopper()
    stopper.install()  # first: a SIGTERM from now on still removes the folder
    folder = None
    try:
        folder = make_run_folder()
        proc = subprocess.Popen(
            command, env=job_environment(env, folder, ranks), start_new_session=True,
            # without it a `kill -9` of canary run would leave mpiexec and every rank running
            preexec_fn=die_with_parent(signal.SIGTERM),
            stdout=subprocess.PIPE if hydra else None, stderr=subprocess.PIPE if hydra else None)
        stopper.started(proc)
        watch: BootstrapWatch | None = BootstrapWatch(BOOTSTRAP_GRACE)
        next_look = next_gone_look = 0.0
        gone_since: float | None = None
        filt = OutputFilter(ranks) if hydra else None

        def check(now: float) -> None:
            nonlocal watch, next_look, next_gone_look, gone_since
            stopper.escalate(now)
            if now >= next_gone_look and proc.poll() is None:
                next_gone_look = now + 0.5
                rec = read_records(folder)
                # a rank ended without finishing (not by MPI_Abort, whose job hydra or the
                # workers end within seconds) and the controller has not ended: mpiexec should
                # end the job; one that runs on waits for that rank for ever
                if any(r not in (filt.aborts if filt else {}) for r in rec.gone) \
                        and 0 not in rec.ends:
                    gone_since = now if gone_since is None else gone_since
                    if now - gone_since > GONE_GRACE:
                        stopper.stop_gone()
            if watch is None or now < next_look:
                return
            next_look = now + 0.2
            # only until a rank has started: then a rank's sentinel sees its process manager go
            if read_records(folder).starts:
                watch = None
                return
            children = _children(proc.pid) if proc.poll() is None else None
            if children is not None:  # unknown children are not no children
                lost = watch.update(children, now)
                if lost is not None:
                    stopper.stop(lost)

        if filt is not None:
            _pump(proc, filt, stopper, check)
        while proc.returncode is None:
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                check(time.monotonic())
        records = read_records(folder)
        _end_leftover_ranks(records)
        # a sentinel whose process manager died notes it, then stops its rank (seconds)
        records = replace(records, orphaned=read_records(folder).orphaned)
        if proc.returncode != 0:  # killed ranks leave MPICH's shared memory behind
            remove_orphans(started)
            remove_orphan_topologies(started)  # and a killed proxy its topology file
        end = JobEnd(records, proc.returncode, stopper.signum, host=socket.gethostname(),
                     snapshots=snapshots, mpiexec_pid=proc.pid,
                     stuck=stopper.stuck, hydra=hydra, ranks=ranks,
                     gone_stop=stopper.gone_stop)
        if filt is not None:
            end.timed_out, end.aborts = filt.timed_out, filt.aborts
            end.wrote_stderr, end.bad_end = filt.wrote_stderr, filt.bad_end
            end.said_abort, end.said_error = filt.said_abort, filt.said_error
        status, lines = verdict(end)
        _writer(sys.stderr)("".join(f"{line}\n" for line in lines).encode())
        lost = rank_lost(end, status)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        stopper.restore()
    if lost and stopper.signum is not None and end.stopped_by is None:
        # the signal came once mpiexec had ended, too late to be the verdict's: the job ended by
        # itself, as said above, but canary run was told to stop, not to relaunch it
        _writer(sys.stderr)(f"canary: {stop_word(stopper.signum)} as the job ended; it is not "
                            "relaunched\n".encode())
        return 128 + stopper.signum, False
    return status, lost


def _pump(proc: subprocess.Popen[bytes], filt: OutputFilter, stopper: _Stopper,
          check: Callable[[float], None]) -> None:
    """Pass mpiexec's output through ``filt`` until both streams end (or mpiexec has ended
    and a process it left behind still holds them)."""
    assert proc.stdout is not None and proc.stderr is not None
    sinks = {STDOUT: _writer(sys.stdout), STDERR: _writer(sys.stderr)}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, STDOUT)
    sel.register(proc.stderr, selectors.EVENT_READ, STDERR)
    ended_at: float | None = None
    while sel.get_map():
        for key, _ in sel.select(timeout=0.1):
            data = os.read(key.fd, 1 << 16)
            if data:
                filt.feed(key.data, data, time.monotonic())
            else:
                sel.unregister(key.fileobj)
        now = time.monotonic()
        filt.tick(now)
        for stream, data in filt.take():
            sinks[stream](data)
        check(now)
        if proc.poll() is not None:
            ended_at = ended_at or now
            if now - ended_at > 1.0:
                break
    sel.close()
    proc.stdout.close()
    proc.stderr.close()
    filt.finish(stopped=stopper.signum is not None or stopper.stuck is not None
                or stopper.gone_stop)
    for stream, data in filt.take():
        sinks[stream](data)


def _end_leftover_ranks(records: RunRecords, wait: float = 3.0) -> None:
    """Kill the ranks on this host that outlive mpiexec by ``wait`` seconds (a process is only
    killed if its pid and start time are the rank's own)."""
    host = socket.gethostname()
    mine = [s for s in records.starts.values()
            if s.host == host and s.started is not None and process_start_time(s.pid) == s.started]
    deadline = time.monotonic() + wait
    for start in mine:
        left = deadline - time.monotonic()
        if wait_for_exit([start.pid], max(left, 0.0)) is None:
            stop_process(start.pid, grace=1.0)


def checkout_root() -> str | None:
    """The repository root when canary is imported from a source checkout (None once
    installed): the ranks must import this same canary, not whichever one is installed."""
    root = Path(__file__).resolve().parent.parent
    return str(root) if (root / "worker" / "__init__.py").exists() else None
