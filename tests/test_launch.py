"""``canary run`` supervising its job: output read back per rank, the verdict on how the job
ended, the rank sentinel, and real runs that are stopped, lose a rank or fail on every rank."""

from __future__ import annotations

import os
import queue
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from canary import launch
from canary.launch import (
    LOST,
    STDERR,
    STDOUT,
    BootstrapWatch,
    JobEnd,
    JobSnapshots,
    OutputFilter,
    how_it_ended,
    rank_lost,
    sentinel_command,
    supervise_job,
    verdict,
)
from canary.mpich_shm import remove_orphan_topologies
from canary.ranks import Gone, Orphaned, RankRun, RankStart, RunRecords, read_records
from canary.sentinel import LAUNCHER, RUN_DIR, RUN_RANKS, process_start_time, write_record
from tests.conftest import ROOT, declared_at

DRIVERS = Path(__file__).parent / "drivers"


def tag(rank: int, text: str) -> bytes:
    return f"\x1e{rank}\x1f{text}".encode()


def written(filt: OutputFilter, stream: int | None = None) -> list[str]:
    return [data.decode() for s, data in filt.take() if stream is None or s == stream]


# -- reading hydra's tagged output ----------------------------------------------------------


def test_a_line_every_rank_prints_shows_once_whichever_rank_comes_first() -> None:
    f = OutputFilter(ranks=3)
    f.feed(STDERR, tag(2, "usage: x [-h]\n") + tag(1, "usage: x [-h]\n"), now=0.0)
    assert written(f) == []  # held: rank 0 may print the same
    f.feed(STDERR, tag(0, "usage: x [-h]\n"), now=0.5)
    assert written(f) == ["usage: x [-h]\n"]
    f.feed(STDERR, tag(1, "x: error: bad\n") + tag(0, "x: error: bad\n"), now=0.6)
    f.feed(STDERR, tag(2, "x: error: bad\n"), now=0.7)  # after rank 0's: dropped at once
    f.finish()
    assert written(f) == ["x: error: bad\n"]


def test_a_workers_own_lines_are_released_after_the_hold_in_order() -> None:
    f = OutputFilter(ranks=3, hold=2.0)
    f.feed(STDOUT, tag(1, "kernel 1 says a\n") + tag(1, "kernel 1 says b\n"), now=10.0)
    f.feed(STDOUT, tag(0, "iter 1\n"), now=10.5)
    assert written(f) == ["iter 1\n"]
    f.tick(11.0)
    assert written(f) == []
    f.tick(12.0)
    assert written(f) == ["kernel 1 says a\n", "kernel 1 says b\n"]


def test_rank_zero_repeating_a_line_only_hides_as_many_copies() -> None:
    f = OutputFilter(ranks=2)
    f.feed(STDOUT, tag(0, "step\n"), now=0.0)
    f.feed(STDOUT, tag(1, "step\n") + tag(1, "step\n"), now=0.1)
    f.finish()
    assert written(f) == ["step\n", "step\n"]  # rank 0's, and rank 1's second one


def test_a_workers_line_long_after_rank_0_printed_the_same_is_its_own() -> None:
    # rank 0's "checkpoint reached" at 0 s hid rank 1's own, printed 4 s later
    f = OutputFilter(ranks=2, hold=1.0)
    f.feed(STDOUT, tag(0, "checkpoint reached\n"), now=0.0)
    f.feed(STDOUT, tag(1, "checkpoint reached\n"), now=4.0)
    f.finish()
    assert written(f) == ["checkpoint reached\n", "checkpoint reached\n"]


def test_lines_are_rebuilt_from_chunks_that_interleave_ranks_and_split_tags() -> None:
    # hydra tags every chunk it forwards, so one rank's line may arrive in pieces with another
    # rank's chunk in between, and a read may end inside a tag
    f = OutputFilter(ranks=2)
    data = tag(1, "c1") + tag(0, "c0") + tag(1, "-cont1\n") + tag(0, "-cont0\n")
    f.feed(STDOUT, data[:5], now=0.0)
    f.feed(STDOUT, data[5:9], now=0.0)
    f.feed(STDOUT, data[9:], now=0.0)
    f.finish()
    assert written(f) == ["c0-cont0\n", "c1-cont1\n"]


def test_an_unfinished_line_is_shown_after_the_hold() -> None:
    f = OutputFilter(ranks=2, hold=1.0)
    f.feed(STDOUT, tag(1, "progress: ..."), now=0.0)
    f.tick(0.5)
    assert written(f) == []
    f.tick(1.0)
    assert written(f) == ["progress: ..."]


def test_mpich_abort_lines_and_banners_are_dropped_and_noted() -> None:
    f = OutputFilter(ranks=3)
    f.feed(STDERR, tag(0, "canary: job aborted: rank 2 (worker 1): boom\n"), now=0.0)
    f.feed(STDERR, tag(0, "Abort(1) on node 0 (rank 0 in comm 496): application called "
                          "MPI_Abort(comm=0x84000002, 1) - process 0\n"), now=0.0)
    f.feed(STDOUT, b"\n" + b"=" * 83 + b"\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION "
           b"PROCESSES\n=   PID 123 RUNNING AT vm\n=   EXIT CODE: 9\n" + b"=" * 83 + b"\n"
           b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n"
           b"This typically refers to a problem with your application.\n"
           b"Please see the FAQ page for debugging suggestions\n", now=0.0)
    f.feed(STDERR, tag(2, "Abort(2) on node 2 (rank 2 in comm 0): application called "
                          "MPI_Abort(MPI_COMM_WORLD, 2) - process 2"), now=0.0)  # no newline
    f.finish()
    assert written(f) == ["canary: job aborted: rank 2 (worker 1): boom\n"]
    assert f.aborts == {0: 1, 2: 2} and f.wrote_stderr == {0}


def test_mpiexec_own_messages_pass_unless_canary_says_them() -> None:
    f = OutputFilter(ranks=2)
    failure = "[mpiexec@vm] HYDU_create_process (lib/utils/launch.c:73): execvp error\n"
    dying = "[proxy:0@vm] HYD_pmcd_pmip_control_cmd_cb (pmip_cb.c:490): assert (!closed) failed\n"
    f.feed(STDOUT, tag(0, "last line\n") + b"[mpiexec@vm] APPLICATION TIMED OUT, TIMEOUT = 20s\n"
           + failure.encode(), now=0.0)
    f.feed(STDERR, dying.encode(), now=0.0)
    f.finish()
    assert written(f) == ["last line\n", failure]  # the proxy complained as it was killed
    assert f.timed_out == 20
    g = OutputFilter(ranks=2)
    g.feed(STDERR, dying.encode(), now=0.0)
    g.finish()
    assert written(g) == [dying]  # ... but when nothing stopped the job, it may be news


# mpiexec's trace as the time limit's kill ended a rank badly (a fresh-clone CI run printed it
# before canary's one line, in one run of many)
WAIT_TRACE = [
    "[mpiexec@vm] HYDT_bscu_wait_for_completion (/mpich-5.0.2/src/pm/hydra/lib/tools/bootstrap/"
    "utils/bscu_wait.c:109): one of the processes terminated badly; aborting\n",
    "[mpiexec@vm] HYDT_bsci_wait_for_completion (/mpich-5.0.2/src/pm/hydra/lib/tools/bootstrap/"
    "src/bsci_wait.c:21): launcher returned error waiting for completion\n",
    "[mpiexec@vm] HYD_pmci_wait_for_completion (/mpich-5.0.2/src/pm/hydra/mpiexec/"
    "pmiserv_pmci.c:172): launcher returned error waiting for completion\n",
    "[mpiexec@vm] main (/mpich-5.0.2/src/pm/hydra/mpiexec/mpiexec.c:270): process manager "
    "error waiting for completion\n"]


@pytest.mark.parametrize("timed_out_first", [True, False])
def test_mpiexecs_trace_of_a_killed_rank_is_dropped_when_the_time_limit_stopped_the_job(
        timed_out_first: bool) -> None:
    timeout = b"[mpiexec@vm] APPLICATION TIMED OUT, TIMEOUT = 5s\n"
    trace = "".join(WAIT_TRACE).encode()
    f = OutputFilter(ranks=2)
    f.feed(STDERR, timeout + trace if timed_out_first else trace + timeout, now=0.0)
    f.finish()
    assert written(f) == [] and f.timed_out == 5
    g = OutputFilter(ranks=2)  # a rank that ended badly by itself: the trace is shown, at the end
    g.feed(STDERR, tag(1, "last line\n") + trace, now=0.0)
    g.finish()
    assert written(g) == ["last line\n", *WAIT_TRACE]


# -- the verdict ----------------------------------------------------------------------------


def records(starts: int = 3, ends: dict[int, int] | None = None,
            gone: dict[int, tuple[int, float]] | None = None) -> RunRecords:
    return RunRecords({r: RankStart(r, 100 + r, "here", "1", 200 + r) for r in range(starts)},
                      ends or {}, {r: Gone(code, t) for r, (code, t) in (gone or {}).items()})


def end(rec: RunRecords, mpiexec_status: int = 0, **kw: object) -> JobEnd:
    return JobEnd(records=rec, mpiexec_status=mpiexec_status, host="here",
                  **kw)  # type: ignore[arg-type]


def test_success_is_the_controller_finishing() -> None:
    assert verdict(end(records(ends={0: 0, 1: 0, 2: 0}))) == (0, [])
    # a driver that stops early by itself on every rank gives its own status and no message
    assert verdict(end(records(ends={0: 2, 1: 2, 2: 2}), 2)) == (2, [])


def test_a_worker_that_exits_with_0_mid_job_is_a_failure_that_names_it() -> None:
    status, lines = verdict(end(records(gone={2: (0, 5.0)}), 0))
    assert status == 1
    assert lines == [f"canary: rank 2 (worker 1, pid 102) exited with status 0 before the job "
                     f"finished; {LOST}"]


def test_a_rank_lost_before_the_first_snapshot_says_so_not_to_use_checkpoint(
        tmp_path: Path) -> None:
    # it said "lost unless it kept snapshots (with --checkpoint DIR ...)" to a job run with one
    status, lines = verdict(end(records(gone={2: (-9, 5.0)}), 9,
                                snapshots=JobSnapshots(str(tmp_path))))
    assert status == 137 and lines[0].endswith(
        f"the job's results are lost: it had committed no snapshot to {tmp_path} yet (the first "
        "comes --checkpoint-every seconds into the run)")


# what a line that names a process killed by SIGKILL says to look into
OUT_OF_MEMORY = ("; a SIGKILL no one sent most often comes from the kernel's out-of-memory "
                 "killer: `dmesg` on that host says whether it killed the process, and if it "
                 "did, the job needs more memory than the host had free")


def test_the_rank_that_died_first_is_named_with_its_signal() -> None:
    rec = records(gone={0: (-9, 7.0), 2: (-9, 5.0)})  # both seen going; rank 2 first
    status, lines = verdict(end(rec, 9))
    assert status == 128 + 9
    # and, for SIGKILL, what to look into (it said nothing of the out-of-memory killer)
    assert lines[0].startswith("canary: rank 2 (worker 1, pid 102) was killed by SIGKILL before "
                               f"the job finished{OUT_OF_MEMORY}; the job's results are lost")
    assert lines[0].endswith("(rank 0 (controller) ended too)")
    segv = verdict(end(records(gone={2: (-11, 5.0)}), 11))[1][0]
    assert segv == f"canary: rank 2 (worker 1, pid 102) was killed by SIGSEGV before the job " \
        f"finished; {LOST}"
    assert how_it_ended(-11) == ("was killed by SIGSEGV", 139)
    assert how_it_ended(3) == ("exited with status 3", 3)


def test_a_rank_that_aborted_the_job_on_purpose_has_said_why() -> None:
    rec = records(gone={2: (1, 5.0)})  # MPI_Abort ends the process: the sentinel sees it go
    assert verdict(end(rec, 1, aborts={2: 1}, wrote_stderr={2})) == (1, [])
    status, lines = verdict(end(rec, 1, aborts={2: 3}))  # ... unless it printed nothing
    assert status == 3 and lines == ["canary: rank 2 (worker 1, pid 102) ended the job with "
                                     "MPI_Abort(3)"]
    # the workers' fallback when hydra let the controller's abort go: the controller said why
    rec = records(gone={0: (1, 5.0), 2: (1, 10.0)})
    assert verdict(end(rec, 1, aborts={0: 1, 2: 1}, wrote_stderr={0})) == (1, [])
    status, lines = verdict(end(rec, 1, aborts={2: 1, 0: 1}, wrote_stderr={0}))
    assert status == 1 and lines == ["canary: rank 2 (worker 1, pid 102) ended the job with "
                                     "MPI_Abort(1)"]


def test_a_job_aborted_with_its_reason_said_is_that_reason_when_hydra_loses_the_abort() -> None:
    # Seen in a fresh clone's test run: rank 0 printed "canary: job aborted: ...", hydra lost
    # its MPI_Abort line, no rank's end was recorded, and the verdict added "the job ended
    # before it finished (... did not finish)" under the reason
    f = OutputFilter(ranks=3)
    f.feed(STDERR, tag(0, "canary: job aborted: rank 1 (worker 0): stage 'load' failed:\n")
           + tag(0, "bad.svm:2: not a number\n") + tag(2, "canary: job aborted, says no one\n"),
           now=0.0)
    f.finish()
    assert f.said_abort == {0} and f.aborts == {}
    assert verdict(end(records(), 1, said_abort=f.said_abort, wrote_stderr={0})) == (1, [])
    status, lines = verdict(end(records(), 1, wrote_stderr={0}))  # nothing said: the line
    assert status == 1 and lines[0].startswith("canary: the job ended before it finished")


def test_a_start_up_error_said_by_rank_0_is_the_job_s_end_when_hydra_loses_the_abort() -> None:
    # Seen once in 41 jobs with CANARY_SLOWDOWN naming a worker the job lacks: rank 0 said the
    # error and aborted with status 2, hydra lost the abort's line, no rank's end was recorded,
    # and "the job ended before it finished ... results are lost" followed the error
    f = OutputFilter(ranks=3)
    f.feed(STDERR, tag(0, "canary: error: environment variable CANARY_SLOWDOWN='5:3' names "
                          "worker 5, but the job has 2 workers: 0..1; set it to one of them "
                          "or unset it\n"), now=0.0)
    f.finish()
    assert f.said_error and not f.said_abort
    assert verdict(end(records(), 2, said_error=True, wrote_stderr={0})) == (2, [])
    g = OutputFilter(ranks=3)  # a worker's driver error is no start-up error of the job's
    g.feed(STDERR, tag(1, "canary: error: x\n"), now=0.0)
    g.finish()
    assert not g.said_error


def test_stopping_and_time_limit_are_one_line_each() -> None:
    assert verdict(end(records(), -15, stopped_by=signal.SIGINT)) == (
        130, ["canary: interrupted; job stopped"])
    assert verdict(end(records(), -15, stopped_by=signal.SIGTERM))[0] == 143
    # with snapshots it says where the job can go on from (it said nothing of them)
    assert verdict(end(records(), -15, stopped_by=signal.SIGTERM,
                       snapshots=JobSnapshots("/nowhere"))) == (
        143, ["canary: terminated; job stopped; the job's results are lost: it had committed no "
              "snapshot to /nowhere yet (the first comes --checkpoint-every seconds into the run)"])
    status, lines = verdict(end(records(), 255, timed_out=60))
    assert status == 124 and "time limit of 60 s" in lines[0]


def test_a_signal_mpiexec_received_from_outside_is_a_stop_not_a_rank_death() -> None:
    # `kill MPIEXEC_PID` (or a batch system's time limit): hydra passes SIGTERM on to every
    # rank, and it was said as "rank 1 (worker 0, pid 101) was killed by SIGTERM"
    from canary.ranks import Signalled

    told = {r: Signalled(signal.SIGTERM, 4.0 + r) for r in range(3)}
    rec = RunRecords(records().starts, {}, {1: Gone(-15, 5.0)}, {}, told)
    status, lines = verdict(end(rec, 15, mpiexec_pid=77, hydra=True))
    assert (status, lines) == (143, [
        "canary: terminated: mpiexec (pid 77) received SIGTERM from outside canary run; job "
        "stopped"])
    assert not rank_lost(end(rec, 15, mpiexec_pid=77, hydra=True), status)  # no relaunch
    # another MPI may end the ranks with SIGTERM itself once one failed: the rank is named
    status, lines = verdict(end(rec, 15, mpiexec_pid=77))
    assert status == 143 and lines[0].startswith("canary: rank 1 (worker 0, pid 101) was killed")
    # a signal that came once the controller had finished stopped nothing that mattered
    done = RunRecords(records().starts, {0: 0, 1: 0}, {2: Gone(-15, 5.0)}, {}, told)
    assert verdict(end(done, 15, mpiexec_pid=77, hydra=True))[0] == 0


def test_without_records_mpiexec_is_trusted_and_a_late_death_does_not_undo_success() -> None:
    assert verdict(end(RunRecords({}, {}, {}), 3)) == (
        3, [f"canary: the job ended with mpiexec's exit status 3; {NOT_RECORDED}"])
    assert verdict(end(RunRecords({}, {}, {}), -9)) == (137, [
        f"canary: mpiexec was killed by SIGKILL before the job finished; {LOST}"])
    status, lines = verdict(end(records(ends={0: 0, 1: 0}, gone={2: (-9, 1.0)}), 9))
    assert status == 0 and lines == [
        "canary: note: rank 2 (worker 1, pid 102) was killed by SIGKILL after the controller had "
        "finished the job; the results are complete"]


def test_a_killed_mpiexec_or_process_manager_is_never_success_and_is_named() -> None:
    done = records(ends={0: 0, 1: 0, 2: 0})
    # mpiexec killed as the job ended: the controller's last lines may not have come through
    status, lines = verdict(end(done, -9, mpiexec_pid=77))
    assert status == 137 and lines[0].startswith(
        "canary: mpiexec (pid 77) was killed by SIGKILL as the job ended: the controller had "
        "finished, but its last output may not have reached canary run")
    # not relaunched: that ran the whole job again and printed its answer twice
    assert not rank_lost(end(done, -9, mpiexec_pid=77), status)
    status, lines = verdict(end(records(ends={1: 0}), -15, mpiexec_pid=77))
    assert status == 143 and lines == [
        "canary: mpiexec (pid 77) was killed by SIGTERM before the job finished; the ranks it "
        "left (rank 0 (controller, pid 100), rank 2 (worker 1, pid 102)) were stopped; "
        f"{LOST}"]
    # hydra's proxy of this host died: its ranks' sentinels noted it and stopped them
    lost = {r: Orphaned("hydra_pmi_proxy", 55, 1.0) for r in range(3)}
    rec = RunRecords(records().starts, {}, {r: Gone(-15, 2.0) for r in range(3)}, lost)
    status, lines = verdict(end(rec, 255))
    assert status == 1 and lines == [
        "canary: MPI's process manager hydra_pmi_proxy (pid 55, which ran rank 0 (controller), "
        "rank 1 (worker 0), rank 2 (worker 1)) died before the job finished (was it killed, or "
        f"out of memory?), and its ranks were stopped; {LOST}"]
    assert rank_lost(end(rec, 255), status)  # --restarts relaunches it
    late = RunRecords(records().starts, {0: 0, 1: 0}, {}, {2: lost[2]})
    assert verdict(end(late, 255))[0] == 1  # the controller's host: its output went through it
    assert not rank_lost(end(late, 255), 1)  # but the controller had finished
    # every rank finished, yet hydra failed: its proxy died with the last lines
    assert verdict(end(done, 255))[0] == 1


def banner(pid: int, host: str, code: int) -> bytes:
    """Hydra's banner for a process that ended badly, as mpiexec prints it."""
    return (b"\n" + b"=" * 83 + b"\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
            + f"=   PID {pid} RUNNING AT {host}\n=   EXIT CODE: {code}\n".encode()
            + b"=   CLEANING UP REMAINING PROCESSES\n=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES\n"
            + b"=" * 83 + b"\n")


def test_a_killed_sentinel_is_named_only_where_hydra_surely_means_it() -> None:
    # rank 2's sentinel killed with SIGKILL: hydra killed the others with SIGKILL too, and its
    # banner named rank 0's, the first in rank order; canary said rank 0's sentinel was killed
    f = OutputFilter(ranks=3)
    f.feed(STDOUT, banner(200, "here", 9) + banner(202, "here", 9), now=0.0)
    f.finish()
    assert written(f) == [] and f.bad_end == (200, "here", 9)  # the first banner
    killed = end(records(), 9, bad_end=f.bad_end)
    assert verdict(killed) == (137, [
        "canary: a rank's sentinel was killed by SIGKILL before the job finished, so how its rank "
        "ended is not known, nor which rank's it was (hydra then kills the other sentinels with "
        f"SIGKILL too, and names the first in rank order); {LOST}"])
    assert rank_lost(killed, 137)  # a rank is lost all the same: --restarts relaunches
    # a started rank's sentinel, but whose is not known (three ranks ran on its host)
    assert launch.killed_sentinel(end(records(), 9, bad_end=f.bad_end, ranks=3)) == (None, 9)
    # another signal than hydra's own: that sentinel got it
    quit_ = end(records(), 3, bad_end=(200, "here", 3), ranks=3)
    assert launch.killed_sentinel(quit_) == (0, 3)
    assert verdict(quit_) == (131, [
        "canary: the sentinel (pid 200) of rank 0 (controller, pid 100) was killed by SIGQUIT "
        f"before the job finished, so how its rank ended is not known; {LOST}"])
    # one rank a host: the only sentinel of its host is the one its process manager saw killed
    apart = RunRecords({r: RankStart(r, 100 + r, h, "1", 200 + r)
                        for r, h in enumerate(["here", "b", "c"])}, {}, {})
    assert launch.killed_sentinel(end(apart, 9, bad_end=(202, "c", 9), ranks=3)) == (2, 9)
    assert verdict(end(apart, 9, bad_end=(202, "c", 9), ranks=3))[1] == [
        "canary: the sentinel (pid 202) of rank 2 (worker 1, pid 102 on c) was killed by SIGKILL "
        f"before the job finished, so how its rank ended is not known{OUT_OF_MEMORY}; {LOST}"]
    # ... unless a rank that had not started may have run there too
    assert launch.killed_sentinel(end(apart, 9, bad_end=(202, "c", 9), ranks=4)) == (None, 9)
    assert verdict(end(apart, 9, bad_end=(202, "c", 9), ranks=4))[1][0].startswith(
        "canary: a rank's sentinel on c was killed by SIGKILL before the job finished")
    # a pid that is a sentinel's on another host is not that sentinel
    assert launch.killed_sentinel(end(apart, 9, bad_end=(202, "b", 9), ranks=3)) is None


def test_hydras_exit_code_of_a_process_that_dumped_core_is_said_as_its_signal() -> None:
    # hydra's EXIT CODE is the wait status, 128 + the signal where a core was dumped: the
    # sentinel killed by SIGSEGV was said to have "exited with status 139"
    f = OutputFilter(ranks=3)
    f.feed(STDOUT, banner(200, "here", 139), now=0.0)
    f.finish()
    assert verdict(end(records(), 139, bad_end=f.bad_end, ranks=3)) == (139, [
        "canary: the sentinel (pid 200) of rank 0 (controller, pid 100) was killed by SIGSEGV "
        f"before the job finished, so how its rank ended is not known; {LOST}"])
    # before its rank had started (SIGABRT): not said at all, and not relaunched
    early = end(records(starts=0), 134, bad_end=(300, "here", 134))
    assert verdict(early) == (134, [
        "canary: a rank's sentinel ended before its rank had started: it was killed by SIGABRT "
        f"(hydra names pid 300 on this host, which is no started rank's sentinel); {LOST}"])
    assert rank_lost(early, 134)
    # 128 + a signal that dumps no core is no wait status (SIGKILL's is 9): an exit status
    assert [launch.banner_returncode(c) for c in (9, 131, 139, 137, 143, 255)] == [
        -9, -3, -11, 137, 143, 255]


def test_a_sentinel_killed_before_its_rank_started_is_said_and_relaunched() -> None:
    # the sentinel of a rank that had not recorded its start (killed in the job's first
    # second): hydra names a pid that is no started rank's sentinel, and exits with 9
    bad = (300, "here", 9)
    for rec in (records(starts=0), records(starts=3)):
        rec = RunRecords({r: s for r, s in rec.starts.items() if r != 0}, {}, {})
        status, lines = verdict(end(rec, 9, bad_end=bad))
        assert status == 137 and lines == [
            "canary: a rank's sentinel ended before its rank had started: it was killed by "
            f"SIGKILL (hydra names pid 300 on this host, which is no started rank's sentinel); "
            f"{LOST}"]
        assert rank_lost(end(rec, 9, bad_end=bad), status)  # --restarts relaunches it
    status, lines = verdict(end(records(starts=0), 15, bad_end=(300, "here", 15)))
    assert status == 143 and "it was killed by SIGTERM" in lines[0]
    # no start recorded, and hydra names a process of another host: the ranks there cannot
    # record here, so mpiexec's status is all there is, and the line says what hydra said
    status, lines = verdict(end(records(starts=0), 2, bad_end=(300, "there", 2)))
    assert status == 2 and lines == [
        "canary: the job ended with mpiexec's exit status 2; hydra names pid 300 on there, "
        f"which was killed by SIGINT; {NOT_RECORDED}"]
    assert not rank_lost(end(records(starts=0), 2, bad_end=(300, "there", 2)), status)


# what the line for a failed job none of whose ranks could record says after its status
NOT_RECORDED = ("no rank could record here how it ended (ranks on other hosts record only where "
                "the run folder is shared): see the ranks' own lines above. MPICH's mpiexec "
                "combines the ranks' statuses, so a status below 64 may also be the number of a "
                "signal that killed one")


def test_a_failed_job_none_of_whose_ranks_recorded_says_so_with_mpiexecs_status() -> None:
    # every rank on other hosts: hydra ORs their wait statuses, and canary run ended with 11
    # or 15 and nothing said. Where its snapshots are is said to a job that kept them; that
    # its results are lost is not said, as a driver may have ended so by itself
    assert verdict(end(records(starts=0), 11)) == (
        11, [f"canary: the job ended with mpiexec's exit status 11; {NOT_RECORDED}"])
    kept = end(records(starts=0), 15, snapshots=JobSnapshots("/nowhere"))
    assert verdict(kept) == (15, [
        f"canary: the job ended with mpiexec's exit status 15; {NOT_RECORDED}; the job's results "
        "are lost: it had committed no snapshot to /nowhere yet (the first comes "
        "--checkpoint-every seconds into the run)"])
    assert verdict(end(records(starts=0), 0)) == (0, [])  # the job's own lines said it all


def test_bootstrap_watch_stops_an_mpiexec_left_without_process_managers() -> None:
    watch = BootstrapWatch(grace=5.0)
    assert watch.update({}, 0.0) is None  # starting
    assert watch.update({10: "srun"}, 1.0) is None
    assert watch.update({}, 2.0) is None  # srun failed ...
    assert watch.update({}, 7.0) == "its process managers (srun, pid 10 ended)"  # ... for good
    assert watch.update({11: "hydra_pmi_proxy"}, 8.0) is None


def test_supervise_stops_an_mpiexec_that_waits_for_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    # hydra whose srun failed: it waits, childless, for process managers that never come
    monkeypatch.setattr(launch, "BOOTSTRAP_GRACE", 0.3)
    env = run_env(tmp_path)
    del env[RUN_DIR]
    status, lost = supervise_job([sys.executable, "-c", "import time; time.sleep(30)"], env,
                                 ranks=1, hydra=False)
    assert status == 1 and not lost
    assert capfd.readouterr().err.startswith(
        "canary: mpiexec waited for its process managers with none left running, and was "
        "stopped: the srun or ssh")


def test_a_killed_proxys_topology_file_is_removed_but_not_one_in_use(tmp_path: Path) -> None:
    since = time.time() - 1
    used, left = tmp_path / "hydra_hwloc_xmlfile_a", tmp_path / "hydra_hwloc_xmlfile_b"
    left.write_text("<topology/>")
    with open(used, "w"):  # a running proxy holds its file open
        assert remove_orphan_topologies(since, str(tmp_path)) == [str(left)]
    assert used.exists()


class FakeMpiexec:
    def __init__(self) -> None:
        self.returncode: int | None = None
        self.calls: list[str] = []

    def send_signal(self, sig: int) -> None:
        self.calls.append(signal.Signals(sig).name)

    def kill(self) -> None:
        self.calls.append("kill")


def test_a_stop_signal_terminates_mpiexec_then_kills_after_a_grace_or_a_second_ctrl_c() -> None:
    from canary.launch import STOP_GRACE, _Stopper

    early = _Stopper()
    early._handle(signal.SIGTERM, None)  # before mpiexec started: it is stopped as it starts
    first = FakeMpiexec()
    early.started(first)  # type: ignore[arg-type]
    assert first.calls == ["SIGTERM"] and early.signum == signal.SIGTERM
    early.escalate(early.since + STOP_GRACE / 2)
    assert first.calls == ["SIGTERM"]
    early.escalate(early.since + STOP_GRACE + 1)
    assert first.calls == ["SIGTERM", "kill"]
    impatient, second = _Stopper(), FakeMpiexec()
    impatient.started(second)  # type: ignore[arg-type]
    impatient._handle(signal.SIGINT, None)
    impatient._handle(signal.SIGINT, None)
    assert second.calls == ["SIGTERM", "kill"] and impatient.signum == signal.SIGINT


# -- the rank side and its sentinel, without MPI ---------------------------------------------


def run_env(folder: Path, rank: int = 0, ranks: int = 1, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "CANARY_"))}
    return dict(env, **{RUN_DIR: str(folder), RUN_RANKS: str(ranks), "PMI_RANK": str(rank)},
                **extra)


@pytest.mark.parametrize("body, returncode", [("import os; os._exit(0)", 0),
                                              ("import os; os.kill(os.getpid(), 9)", -9)])
def test_the_sentinel_notes_a_rank_that_ends_without_finishing_and_ends_alike(
        tmp_path: Path, body: str, returncode: int) -> None:
    r = subprocess.run([*sentinel_command(), sys.executable, "-c", body],
                       env=run_env(tmp_path, rank=2, ranks=3), timeout=60)
    assert r.returncode == returncode  # MPI sees what it would have seen without a sentinel
    gone = read_records(tmp_path).gone
    assert list(gone) == [2] and gone[2].returncode == returncode


def test_the_sentinel_notes_a_signal_from_the_process_that_started_it(tmp_path: Path) -> None:
    # the test stands for MPI's process manager: what it sends, mpiexec received; what another
    # process sends (here: `kill`) is not noted
    for sender in ("parent", "other"):
        folder = tmp_path / sender
        folder.mkdir()
        up = folder / "up"
        rank = subprocess.Popen([*sentinel_command(), sys.executable, "-c",
                                 f"import pathlib, time; pathlib.Path({str(up)!r}).touch(); "
                                 "time.sleep(120)"], env=run_env(folder, rank=1, ranks=2))
        try:
            deadline = time.monotonic() + 60
            while not up.exists():
                assert time.monotonic() < deadline and rank.poll() is None
                time.sleep(0.05)
            if sender == "parent":
                rank.send_signal(signal.SIGTERM)
            else:
                subprocess.run(["kill", "-TERM", str(rank.pid)], check=True, timeout=30)
            assert rank.wait(timeout=30) == -signal.SIGTERM  # passed on; ended alike
        finally:
            rank.kill()
            rank.wait()
        rec = read_records(folder)
        assert rec.gone[1].returncode == -signal.SIGTERM
        assert [(r, s.signal) for r, s in rec.signalled.items()] == (
            [(1, signal.SIGTERM)] if sender == "parent" else [])


def test_a_rank_that_records_its_end_is_not_noted_as_gone(tmp_path: Path) -> None:
    code = ("from canary.ranks import end_rank; import sys; "
            "sys.exit(3 if end_rank(3) else 4)")
    r = subprocess.run([*sentinel_command(), sys.executable, "-c", code], cwd=ROOT,
                       env=run_env(tmp_path), timeout=60)
    assert r.returncode == 3  # the only rank has ended: no abort needed
    rec = read_records(tmp_path)
    assert rec.ends == {0: 3} and rec.gone == {}


def test_a_failing_rank_waits_for_the_others_then_says_whether_all_ended(tmp_path: Path) -> None:
    run = RankRun(str(tmp_path), rank=1, ranks=3)
    write_record(str(tmp_path), "end", 0, {"rank": 0, "status": 2})
    assert not run.end(2, wait=0.2)  # rank 2 is still running: the job must be aborted
    write_record(str(tmp_path), "end", 2, {"rank": 2, "status": 2})
    assert run.end(2, wait=0.2)
    assert RankRun.from_environ({RUN_DIR: "/x", RUN_RANKS: "3", "PMI_RANK": "1"}) == RankRun(
        "/x", 1, 3)
    assert RankRun.from_environ({RUN_DIR: "/x", RUN_RANKS: "3"}) is None  # rank unknown


def test_a_failing_rank_aborts_at_once_when_another_is_in_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # rank 0 has entered canary.run and waits there for this one: waiting for it to end would
    # only delay the abort (and the job's end) by the whole wait
    run, other = RankRun(str(tmp_path), rank=1, ranks=2), RankRun(str(tmp_path), rank=0, ranks=2)
    other.in_job(True)

    def no_waiting(seconds: float) -> None:
        raise AssertionError(f"the failing rank waited {seconds} s for a rank in the job")

    monkeypatch.setattr("canary.ranks.time.sleep", no_waiting)
    assert not run.end(2, wait=60.0)
    other.in_job(False)  # the job is over on rank 0, which ends by itself soon: wait for it
    with pytest.raises(AssertionError, match="waited"):
        run.end(2, wait=60.0)
    other.in_job(False)  # leaving twice is harmless


def test_abort_job_ends_the_rank_when_mpi_abort_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # MPICH's MPI_Abort returns once the other ranks have finalized MPI (seen: rank 0 aborting
    # a run that workers had already left); the rank must not go on into the driver
    from canary.ranks import abort_job

    class Finalized:
        def Abort(self, code: int) -> None:  # noqa: N802 - mpi4py's name
            pass

    def exit_now(code: int) -> None:
        raise SystemExit(f"os._exit({code})")

    monkeypatch.setenv(RUN_DIR, str(tmp_path))
    monkeypatch.setenv(RUN_RANKS, "2")
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setattr("canary.ranks.os._exit", exit_now)
    with pytest.raises(SystemExit, match=r"os\._exit\(1\)"):
        abort_job(Finalized(), 1, linger=0.0)
    assert read_records(str(tmp_path)).ends == {0: 1}  # canary run is told how it ended


def test_run_main_turns_a_canary_error_into_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from canary.script import run_main

    pkg = tmp_path / f"drivers_{uuid.uuid4().hex}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "declares.py").write_text(
        "import canary\ndef main(argv):\n    raise canary.DeclarationError('a/2 vs b/3')\n")
    (pkg / "mismatched.py").write_text(
        "import canary\ndef main(argv):\n    p = canary.Program('m')\n"
        "    a, b = p.dataset('a', 2), p.dataset('b', 3)\n"
        "    p.load([a, b], lambda i, n: (i, i))  # raises: partitions\n")
    (pkg / "runs.py").write_text(
        "import canary\ndef main(argv):\n    raise canary.TaskError('stage s failed')\n")
    monkeypatch.setattr(sys, "path", list(sys.path))  # run_main puts the package root on it
    # the driver's own raise words its message for its own user: no line of the driver's added
    assert run_main(str(pkg / "declares.py"), []) == 2
    assert capsys.readouterr().err == "declares: error: a/2 vs b/3\n"
    # one canary raised names the driver line that called canary (here outside the working
    # directory, so absolute), as `canary run` says it
    assert run_main(str(pkg / "mismatched.py"), []) == 2
    at = declared_at("# raises: partitions", pkg / "mismatched.py")
    assert capsys.readouterr().err == (
        f"mismatched: error: {at}: load '<lambda>': dataset 'a' has 2 partitions but 'b' has 3; "
        "all datasets of a stage must be partitioned alike (use scatter_gather to move data "
        "between partitionings)\n")
    # a failed job is said as canary run says it: its message holds the kernel's traceback
    assert run_main(str(pkg / "runs.py"), []) == 1
    assert capsys.readouterr().err == "canary: job aborted: stage s failed\n"


ENDS_WELL = """\
from canary.script import end_script


class Torn:
    def __del__(self):
        print("torn down", flush=True)


keep = Torn()  # the interpreter's teardown deletes it, and so says whether there was one
print("ran", flush=True)
end_script(0)
"""


def test_end_script_skips_the_teardown_only_where_nothing_runs_after_the_script(
        tmp_path: Path) -> None:
    script = tmp_path / "ends_well.py"
    script.write_text(ENDS_WELL)
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *cmd], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)

    for cmd in ([], ["-m", "canary.ranks"]):  # the programs
        r = run(*cmd, str(script))
        assert (r.returncode, r.stdout) == (0, "ran\n"), (cmd, r.stderr)
    # a profiler prints its figures after the script: the ordinary exit, teardown and all
    r = run("-m", "cProfile", str(script))
    assert r.returncode == 0 and r.stdout.startswith("ran\n") and "function calls" in r.stdout
    assert "torn down" in r.stdout, r.stdout
    # a harness that goes on after the script (as IPython's %run): SystemExit; in a process of
    # its own, so that a wrong os._exit(0) cannot end this test run as if it had passed
    plain = tmp_path / "plain.py"
    plain.write_text("from canary.script import end_script\nend_script(0)\n")
    harness = ("import runpy, sys\ntry:\n    runpy.run_path(sys.argv[1], run_name='__main__')\n"
               "except SystemExit as stop:\n    print('the harness goes on after', stop.code)\n")
    r = run("-c", harness, str(plain))
    assert (r.returncode, r.stdout) == (0, "the harness goes on after 0\n"), r.stderr


def test_the_sentinel_stops_its_rank_when_the_launcher_is_gone(tmp_path: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = f"{launcher.pid} {process_start_time(launcher.pid)} {os.uname().nodename}"
        rank = subprocess.Popen([*sentinel_command(), sys.executable, "-c",
                                 "import time; print('up', flush=True); time.sleep(120)"],
                                env=run_env(tmp_path, **{LAUNCHER: me}), stdout=subprocess.PIPE)
        assert rank.stdout is not None and rank.stdout.readline() == b"up\n"
        launcher.kill()
        assert rank.wait(timeout=30) == -signal.SIGTERM
        assert not tmp_path.exists()  # nobody is left to collect the run
    finally:
        launcher.kill()
        launcher.wait()


def test_a_sentinel_whose_rank_ends_as_the_launcher_dies_removes_the_run_folder(
        tmp_path: Path) -> None:
    # the sentinel saw its rank's end first and noted it in the folder of a launcher that was
    # gone (a SIGKILL of canary run makes mpiexec stop every rank at once): it stayed behind
    # Staged with the sentinel stopped, so that it sees both ends at once whatever the
    # machine's load: the rank kills the launcher when told, and ends.
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ctl = tmp_path.parent / f"{tmp_path.name}-ctl"
    ctl.mkdir()
    up, go = ctl / "up", ctl / "go"
    rank = ("import os, pathlib, time\n"
            f"pathlib.Path({str(up)!r}).write_text(str(os.getpid()))\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
            f"os.kill({launcher.pid}, 9)\n"
            "os._exit(0)\n")

    def ended(pid: int) -> bool:  # a zombie: its parent has not collected it yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][1] == "Z"

    me = f"{launcher.pid} {process_start_time(launcher.pid)} {os.uname().nodename}"
    sentinel = subprocess.Popen([*sentinel_command(), sys.executable, "-c", rank],
                                env=run_env(tmp_path, **{LAUNCHER: me}))
    try:
        deadline = time.monotonic() + 60
        while not up.exists() or not up.read_text():
            assert time.monotonic() < deadline and sentinel.poll() is None
            time.sleep(0.01)
        os.kill(sentinel.pid, signal.SIGSTOP)
        go.touch()
        while not (ended(launcher.pid) and ended(int(up.read_text()))):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(sentinel.pid, signal.SIGCONT)
        assert sentinel.wait(timeout=60) == 0 and not tmp_path.exists()
    finally:
        for p in (sentinel, launcher):
            p.kill()
            p.wait()


def test_a_sentinel_whose_process_manager_dies_stops_its_rank_and_keeps_none_of_its_pipes(
        tmp_path: Path) -> None:
    # a stand-in for hydra's proxy: it leaks a pipe to mpiexec (here: to the test) into the
    # sentinel it starts, and is killed while the rank runs
    up = tmp_path / "up"
    r, w = os.pipe()
    proxy = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "subprocess.Popen(sys.argv[1:], close_fds=False); time.sleep(120)",
         *sentinel_command(), sys.executable, "-c",
         f"import pathlib, time; pathlib.Path({str(up)!r}).touch(); time.sleep(120)"],
        pass_fds=(w,), env=run_env(tmp_path, HYDI_CONTROL_FD="7"))
    os.close(w)
    try:
        deadline = time.monotonic() + 60
        while not up.exists():
            assert time.monotonic() < deadline and proxy.poll() is None
            time.sleep(0.05)
        proxy.kill()
        # mpiexec sees the proxy's streams close: neither the sentinel nor the rank holds them
        # (before, they did, and hydra waited for ever)
        assert select.select([r], [], [], 30)[0] == [r] and os.read(r, 1) == b""
        while not (rec := read_records(tmp_path)).gone:  # ... and the rank is stopped
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert list(rec.orphaned) == [0] and rec.orphaned[0].pid == proxy.pid
        assert rec.gone[0].returncode == -signal.SIGTERM
    finally:
        proxy.kill()
        proxy.wait()
        os.close(r)


def test_supervise_passes_another_mpis_output_through_and_reads_the_records(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # a stand-in for another MPI's mpiexec: one rank under its sentinel that exits mid-job
    fake = [*sentinel_command(), sys.executable, "-c",
            "import os; print('rank output', flush=True); os._exit(0)"]
    env = run_env(tmp_path)
    del env[RUN_DIR]  # supervise makes the run folder
    status, lost = supervise_job(fake, env, ranks=1, hydra=False)
    out, err = capfd.readouterr()
    assert out == "rank output\n" and status == 1 and lost  # it ended without finishing
    assert err == ("canary: rank 0 (controller) exited with status 0 before the job finished; "
                   f"{LOST}\n")


def test_an_mpiexec_that_runs_on_after_a_rank_ended_is_stopped_and_that_rank_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    # Seen once in a fresh clone's CI run: a worker's kernel called os._exit(0), and hydra,
    # which ends such a job in milliseconds, left the others waiting for it until the job's
    # time limit. A stand-in for that mpiexec: its one rank ends so, and it sleeps on.
    monkeypatch.setattr(launch, "GONE_GRACE", 1.0)
    rank = [*sentinel_command(), sys.executable, "-c", "import os; os._exit(0)"]
    said = tmp_path / "mpiexec.said"
    fake = [sys.executable, "-c",
            "import pathlib, signal, subprocess, sys, time\n"
            f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(said)!r})"
            ".write_text('stopped'), sys.exit(143)))\n"
            "keep = subprocess.Popen(['sleep', '20'])\n"  # as hydra's proxy: no stuck bootstrap
            f"subprocess.run({rank!r})\n"
            "keep.wait()"]  # (then it ends by itself, unstopped)
    env = run_env(tmp_path)
    del env[RUN_DIR]  # supervise makes the run folder
    status, lost = supervise_job(fake, env, ranks=1, hydra=False)
    assert said.read_text() == "stopped"
    assert (status, lost) == (1, True)  # a rank lost: --restarts relaunches such a job
    assert capfd.readouterr().err == (
        f"canary: rank 0 (controller) exited with status 0 before the job finished; {LOST}\n")


def test_a_stop_signal_once_mpiexec_has_ended_is_no_relaunch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    # it came while the job's end was being said: taken and forgotten, and the job relaunched
    said = launch.verdict

    def verdict_as_the_signal_comes(end: JobEnd) -> tuple[int, list[str]]:
        signal.raise_signal(signal.SIGTERM)  # the launcher's own handler takes it
        return said(end)

    monkeypatch.setattr(launch, "verdict", verdict_as_the_signal_comes)
    fake = [*sentinel_command(), sys.executable, "-c", "import os; os._exit(0)"]  # a rank lost
    env = run_env(tmp_path)
    del env[RUN_DIR]  # supervise makes the run folder
    assert supervise_job(fake, env, ranks=1, hydra=False) == (143, False)
    assert capfd.readouterr().err == (
        "canary: rank 0 (controller) exited with status 0 before the job finished; "
        f"{LOST}\ncanary: terminated as the job ended; it is not relaunched\n")


def start_launcher(tmp: Path) -> subprocess.Popen[str]:
    """A launcher (``supervise_job``) whose mpiexec is a stand-in that starts no rank, with
    ``tmp`` as its temp directory; returns once its run folder is made."""
    stand_in = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"]
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import os, sys; from canary.launch import supervise_job; "
         f"supervise_job({stand_in!r}, dict(os.environ), 1, False)"],
        cwd=ROOT, env=dict(os.environ, TMPDIR=str(tmp)), stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None and launcher.stdout.readline() == "up\n"
    return launcher


def test_a_run_folder_left_by_a_killed_launcher_is_removed_by_the_next_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `canary run` killed with SIGKILL before any sentinel ran (nothing else cleans up) left
    # an empty canary-run-* folder in the temp directory for good
    dead, live = start_launcher(tmp_path), None
    try:
        dead.kill()
        dead.wait()
        left = list(tmp_path.iterdir())
        assert len(left) == 1 and left[0].name.startswith("canary-run-")
        live = start_launcher(tmp_path)  # another run, still going: its folder stays
        kept = set(tmp_path.iterdir()) - set(left)
        older = tmp_path / "canary-run-k2j4h8x1"  # no launcher in its name: kept
        older.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        assert supervise_job([sys.executable, "-c", "pass"], dict(os.environ), 1, False)[0] == 0
        assert set(tmp_path.iterdir()) == kept | {older}
    finally:
        for proc in (dead, live):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_only_a_run_folder_whose_launcher_is_surely_gone_is_removed(tmp_path: Path) -> None:
    folder = Path(launch.make_run_folder(str(tmp_path)))
    me, start, where, rest = folder.name.removeprefix("canary-run-").split("-")
    assert (int(me), start) == (os.getpid(), process_start_time(os.getpid()))
    reused = tmp_path / f"canary-run-{me}-{int(start) + 1}-{where}-{rest}"  # pid now another's
    elsewhere = tmp_path / f"canary-run-{me}-{int(start) + 1}-{'0' * 8}-{rest}"  # another host
    unknown = tmp_path / f"canary-run-{me}-0-{where}-{rest}"  # no start time when made
    for path in (reused, elsewhere, unknown):
        path.mkdir()
    assert launch.remove_stale_run_folders(str(tmp_path)) == [str(reused)]
    assert set(tmp_path.iterdir()) == {folder, elsewhere, unknown}


# -- real runs through `canary run` ---------------------------------------------------------

LR = "apps/logistic_regression.py"
MARK = "CANARY_TEST_MARK"


def canary_run(*args: str, timeout: int = 120, stdin: str | None = None, staged: str = "",
               meanwhile: Callable[[subprocess.Popen[str]], None] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """``python -m canary.cli run -n 2 ARGS`` from the repository, with hard time limits, and
    ``stdin`` as its standard input (default: this process's). ``staged``: Python code the
    launcher runs before canary's ``main`` (it patches canary to stage a moment of the run);
    ``meanwhile(proc)`` is called once it has started, before its output is read."""
    main = "import sys\nfrom canary.cli import main\nsys.exit(main(sys.argv[1:]))"
    how = ["-c", f"{staged}\n{main}"] if staged else ["-m", "canary.cli"]
    proc = subprocess.Popen([sys.executable, *how, "run", "-n", "2", "--timeout", str(timeout),
                             *args], cwd=ROOT, stdin=None if stdin is None else subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if meanwhile is not None:
            meanwhile(proc)
        out, err = proc.communicate(stdin, timeout=timeout + 60)
    finally:
        if proc.poll() is None:  # the test failed or timed out: nothing of it may stay
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_standard_input_reaches_rank_0_and_the_others_read_its_end() -> None:
    # hydra gave the other ranks a pipe that never ends: a driver reading it hung for ever
    r = canary_run(str(DRIVERS / "reads_stdin.py"), timeout=60, stdin="hello\n")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [
        "rank 0 read 'hello\\n'", "rank 1 read ''", "rank 2 read ''"]


def marked(mark: str) -> dict[int, str]:
    """Every process whose environment holds ``MARK=mark``: pid -> command line."""
    found = {}
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                cmdline = (entry / "cmdline").read_bytes()
                found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


class LongJob:
    """A logistic regression that would run for hours, started by ``canary run`` in its own
    session (as a shell starts a foreground job) with a unique marker in its environment."""

    def __init__(self, tmp: Path) -> None:
        self.mark = uuid.uuid4().hex
        self.tmp = tmp  # the job's TMPDIR: what the launcher and the ranks leave there
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "canary.cli", "run", "-n", "2", "--timeout", "300", LR,
             "--generate", "50000,20", "--max-iter", "10000000", "--tol", "1e-300",
             "--print-every", "100"],
            cwd=ROOT, env=dict(os.environ, **{MARK: self.mark, "TMPDIR": str(tmp)}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        out, err = self.proc.stdout, self.proc.stderr
        assert out is not None and err is not None
        threading.Thread(target=lambda: [self.lines.put(x) for x in out], daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(err), daemon=True).start()

    def wait_running(self, timeout: float = 150.0) -> None:
        """Return once the job prints progress (every rank is in the job)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if self.lines.get(timeout=1.0).startswith("iter"):
                    return
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.err)
        raise AssertionError(f"no progress within {timeout} s: {''.join(self.err)}")

    def rank_pid(self, rank: int) -> int:
        for pid, cmd in marked(self.mark).items():
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"PMI_RANK={rank}".encode() in environ and "-m canary.ranks" in cmd \
                    and "sentinel.py" not in cmd:
                return pid
        raise AssertionError(f"rank {rank} not found")

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        status = self.proc.wait(timeout=timeout)
        time.sleep(0.2)  # the reader thread takes the last lines
        return status, "".join(self.err)

    def leftovers(self, timeout: float = 30.0) -> dict[int, str]:
        """The job's processes still there after ``timeout`` seconds (none, we hope)."""
        end = time.monotonic() + timeout
        while (left := marked(self.mark)) and time.monotonic() < end:
            time.sleep(0.2)
        return left

    def clean_up(self) -> None:
        for pid in marked(self.mark):  # only this test's processes carry its marker
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def long_job(tmp_path: Path) -> object:
    job = LongJob(tmp_path)
    yield job
    job.clean_up()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_canary_run_stops_every_process_of_the_job(long_job: LongJob,
                                                            sig: signal.Signals) -> None:
    long_job.wait_running()
    assert len(marked(long_job.mark)) >= 1 + 1 + 1 + 3 + 3  # launcher, mpiexec, proxy, ranks
    os.kill(long_job.proc.pid, sig)  # what `kill PID`, Popen.terminate() or a supervisor does
    status, err = long_job.finish()
    assert long_job.leftovers() == {}
    assert list(long_job.tmp.iterdir()) == []  # no folder of the launcher's, even after SIGKILL
    if sig == signal.SIGTERM:
        assert status == 143 and err == "canary: terminated; job stopped\n"


def test_sigterm_to_mpiexec_stops_the_job_with_one_line_naming_it(long_job: LongJob) -> None:
    # what a batch system or `kill MPIEXEC_PID` does: it was said as a rank killed by SIGTERM
    long_job.wait_running()
    launcher = long_job.proc.pid
    mpiexec = [int(p) for p in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()]
    assert len(mpiexec) == 1, marked(long_job.mark)
    os.kill(mpiexec[0], signal.SIGTERM)
    status, err = long_job.finish()
    # (a worker slowed by a busy machine may have had a partition moved off it, said on stderr)
    assert status == 143 and err.splitlines()[-1] == (
        f"canary: terminated: mpiexec (pid {mpiexec[0]}) received SIGTERM from outside canary "
        "run; job stopped"), err
    assert "killed" not in err
    assert long_job.leftovers() == {}


def test_ctrl_c_stops_the_job_with_one_line(long_job: LongJob) -> None:
    long_job.wait_running()
    os.killpg(long_job.proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the foreground group
    status, err = long_job.finish()
    assert status == 130 and err == "canary: interrupted; job stopped\n"
    assert long_job.leftovers() == {}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_while_canary_run_starts_says_that_no_job_ran(tmp_path: Path,
                                                                   sig: signal.Signals) -> None:
    # before mpiexec was started canary run died of the signal without a word (shell: 143, 129)
    hostfile = tmp_path / "hosts"
    os.mkfifo(hostfile)  # canary run waits in reading it, before it starts mpiexec
    writers: list[int] = []

    def signal_while_it_reads(proc: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 60
        while not writers:
            try:  # succeeds once canary run has opened the hostfile to read it
                writers.append(os.open(hostfile, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "never read"
                time.sleep(0.05)
        proc.send_signal(sig)  # it reads on, for nothing is written: held open until it ends

    try:
        r = canary_run("-f", str(hostfile), LR, timeout=60, meanwhile=signal_while_it_reads)
    finally:
        for fd in writers:
            os.close(fd)
    assert r.returncode == 128 + sig and r.stdout == ""
    word = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}[sig]
    assert r.stderr == f"canary: {word} before the job started: no job ran\n"


def test_a_stop_signal_between_a_lost_job_and_its_restart_names_the_restart(
        tmp_path: Path) -> None:
    # canary run died of it without a word (shell: 143) once it had said how the job ended
    ck = tmp_path / "ck"
    staged = "\n".join([
        "import os, signal, sys",
        "from canary import cli",
        # an mpiexec that is killed: the job lost, and relaunched
        "cli.mpiexec_command = lambda *a, **k: [sys.executable, '-c', "
        "'import os, signal; os.kill(os.getpid(), signal.SIGKILL)']",
        "def choose(*args, **kwargs):",  # as the snapshot to restart from is picked
        "    signal.raise_signal(signal.SIGTERM)",
        "    raise AssertionError('the signal did not stop canary run')",
        "cli.choose = choose"])
    r = canary_run("--checkpoint", str(ck), "--restarts", "2", LR, timeout=60, staged=staged)
    none_yet = (f"the job's results are lost: it had committed no snapshot to {ck} yet (the "
                "first comes --checkpoint-every seconds into the run)")
    assert r.returncode == 143 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert re.fullmatch(r"canary: mpiexec \(pid \d+\) was killed by SIGKILL before the job "
                        rf"finished; {re.escape(none_yet)}", lines[0]), r.stderr
    assert lines[1:] == [f"canary: terminated before restart 1 of 2 was started: the job is not "
                         f"relaunched; {none_yet}"], r.stderr


def test_a_killed_worker_is_named_with_its_signal(long_job: LongJob) -> None:
    long_job.wait_running()
    victim = long_job.rank_pid(2)
    os.kill(victim, signal.SIGKILL)
    status, err = long_job.finish()
    assert status == 128 + signal.SIGKILL
    # (the controller may have complained of the lost peer before MPI killed it: the last word)
    assert err.splitlines()[-1] == (f"canary: rank 2 (worker 1, pid {victim}) was killed by "
                                    f"SIGKILL before the job finished{OUT_OF_MEMORY}; {LOST}")
    assert long_job.leftovers() == {}


def test_a_worker_exiting_with_0_mid_job_fails_the_job() -> None:
    r = canary_run(str(DRIVERS / "worker_exits.py"), "exit")
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("canary: rank 2 (worker 1, pid ")
    assert "exited with status 0 before the job finished; the job's results are lost" in r.stderr
    assert "sum" not in r.stdout and "BAD TERMINATION" not in r.stdout


def test_workers_prints_are_shown_and_the_job_succeeds() -> None:
    r = canary_run(str(DRIVERS / "worker_exits.py"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for part in range(4):
        assert lines.count(f"kernel on partition {part} says hello") == 1, r.stdout
    assert "sum [6.0, 24.0]" in lines and r.stderr == ""


@pytest.mark.parametrize("launcher", ["canary run", "mpiexec"])
def test_what_a_driver_leaves_to_the_exit_is_done_on_every_rank(launcher: str,
                                                                 tmp_path: Path) -> None:
    # a rank that ends well skips the interpreter's teardown (canary.ranks.leave): under
    # `canary run` whatever the driver does, under plain mpiexec when it ends as the apps do;
    # what the teardown would have done for files, threads and MPI must still be done
    import h5py
    import numpy as np

    from tests.conftest import mpirun

    driver = str(DRIVERS / "leaves_files_open.py")
    r = (canary_run(driver, str(tmp_path)) if launcher == "canary run"
         else mpirun(3, driver, str(tmp_path), "end_script", timeout=60))
    assert r.returncode == 0, r.stderr
    for rank in range(3):
        assert (tmp_path / f"text-{rank}.txt").read_text() == f"rank {rank}\n" * 1000
        with h5py.File(tmp_path / f"table-{rank}.h5", "r") as f:
            assert np.array_equal(f["x"][()], np.arange(1000.0) * rank)
        assert (tmp_path / f"thread-{rank}.txt").read_text() == "done; end recorded: False\n"


def test_an_argument_error_and_help_print_once() -> None:
    r = canary_run(LR, "--bogus")
    assert r.returncode == 2
    assert r.stderr.count("unrecognized arguments: --bogus") == 1, r.stderr
    assert r.stderr.count("usage:") == 1 and "Abort" not in r.stderr and r.stdout == ""
    h = canary_run(LR, "--help")
    assert h.returncode == 0 and h.stdout.count("usage:") == 1 and h.stderr == ""


@pytest.mark.parametrize("driver", ["declaration_error", "declaration_error_top_level"])
def test_a_declaration_error_is_one_line_without_traceback(driver: str) -> None:
    # in a main() that run_main calls, or at the top level of the script
    # it names the driver line that declared the load, not canary's where it was found
    r = canary_run(str(DRIVERS / f"{driver}.py"))
    assert r.returncode == 2 and r.stdout == ""
    at = declared_at("# raises: mismatched", DRIVERS / f"{driver}.py", ROOT)
    assert r.stderr.splitlines() == [
        f"{driver}: error: {at}: load '<lambda>': dataset 'a' has 2 partitions but 'b' has 3; "
        "all datasets of a stage must be partitioned alike (use scatter_gather to move data "
        "between partitionings)"]


def test_ranks_that_declare_different_programs_are_told_the_driver_line_on_each_side() -> None:
    # the message named the first statement that differs, not where the driver declared it
    must = ("The driver must declare the same statements on every rank: do not branch on the "
            "rank, time or unseeded randomness while declaring")

    def said(driver: str) -> str:
        r = canary_run(str(DRIVERS / f"{driver}.py"), timeout=60)
        lines = [line for line in r.stderr.splitlines() if "declared a different" in line]
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        return lines[0]

    # a partition count that depends on the rank: one line on both sides (rank 2's count is 2,
    # as rank 0's)
    at = declared_at("# declared: a", DRIVERS / "nondeterministic.py", ROOT)
    assert said("nondeterministic") == (
        "canary: job aborted: rank 1 declared a different program than rank 0 (statement 0: "
        f"rank 0 has 'dataset a/2', declared at {at}; rank 1 has 'dataset a/3', declared at "
        f"{at}). {must}")
    # a statement on rank 0 only: each side's line, the worker's as its own driver said it
    # (either worker's Hello may come first)
    mine = declared_at("# declared: on rank 0 only", DRIVERS / "diverging.py", ROOT)
    theirs = declared_at("# declared: on every rank", DRIVERS / "diverging.py", ROOT)
    assert re.fullmatch(
        r"canary: job aborted: rank ([12]) declared a different program than rank 0 "
        rf"\(statement 2: rank 0 has 'report [^']*', declared at {re.escape(mine)}; "
        rf"rank \1 has 'compute step [^']*', declared at {re.escape(theirs)}\)\. "
        + re.escape(must), said("diverging"))


@pytest.mark.parametrize("fewer,ranks", [("workers", 2), ("rank0", 3)])
def test_ranks_that_run_fewer_programs_end_the_job_at_once_saying_so(fewer: str,
                                                                     ranks: int) -> None:
    # before: the others waited CANARY_STARTUP_TIMEOUT (120 s), then blamed a failed start
    r = subprocess.run([sys.executable, "-m", "canary.cli", "run", "-n", str(ranks), "--timeout",
                        "60", str(DRIVERS / "uneven_runs.py"),
                        "rank0" if fewer == "workers" else "workers"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    workers = list(range(1, ranks + 1))
    said = (f"rank(s) {workers} ended their driver without running program 'second', which "
            "rank 0 runs" if fewer == "workers" else
            "rank 0 (the controller) ended its driver without running program 'again', which "
            "the workers run")
    lines = r.stderr.splitlines()
    assert lines[0] == f"canary: job aborted: {said}: every rank must call canary.run for the " \
        "same programs in the same order (is a canary.run inside a branch on a result? a " \
        "result is None on every rank but 0)", r.stderr
    assert "Traceback" not in r.stderr and len(lines) <= 2, r.stderr


def test_a_report_callback_that_raises_fails_the_job_naming_the_report(tmp_path: Path) -> None:
    # it was "canary: rank 0 failed: RuntimeError(...)" and a traceback through the runtime
    driver = tmp_path / "callback_raises.py"
    driver.write_text(
        "import numpy as np\nimport canary\n\n\ndef explode(ev):\n"
        "    raise RuntimeError('callback exploded')\n\n\n"
        "p = canary.Program('cb')\nx = p.dataset('x', 3)\n"
        "p.load([x], lambda i, n: np.zeros(2))\nwith p.loop(3):\n"
        "    p.compute(lambda v: v + 1, [x], [x], name='inc')\n"
        "    p.report(x, callback=explode)\ncanary.run(p)\n")
    r = canary_run(str(driver))
    assert r.returncode == 1 and r.stdout == ""
    at = declared_at("p.report(x, callback=explode)", driver, ROOT)  # not under ROOT: absolute
    assert r.stderr.splitlines() == [
        "canary: job aborted: rank 0 (controller): report 'report_x' of 'x' (iteration (0,), "
        f"declared at {at}), its callback failed:", "Traceback (most recent call last):",
        f'  File "{driver}", line 6, in explode', "    raise RuntimeError('callback exploded')",
        "RuntimeError: callback exploded"], r.stderr


def test_a_program_declared_and_never_run_is_warned_of(tmp_path: Path) -> None:
    # it exited 0 having computed nothing, without a word
    driver = tmp_path / "forgets.py"
    driver.write_text("import numpy as np\nimport canary\n\np = canary.Program('forgotten')\n"
                      "a = p.dataset('a', 2)\np.load([a], lambda i, n: np.ones(2))\n")
    r = canary_run(str(driver))
    assert r.returncode == 0 and r.stdout == ""
    assert r.stderr == "canary: warning: program 'forgotten' was declared but never run (call " \
        "canary.run(p) to run it)\n"
    ran = canary_run(str(DRIVERS / "counting.py"), "2", "2")  # a program that did run
    assert ran.returncode == 0 and "never run" not in ran.stderr, ran.stderr


def test_malformed_input_read_by_a_task_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:0.5 2:1.0\n0 1:0.25 2:oops\n1 1:1.0 2:2.0\n")
    r = canary_run(LR, "--input", str(bad), "--partitions", "1")
    assert r.returncode == 1 and r.stdout == ""
    at = declared_at('name="load_rows")', ROOT / LR, ROOT)
    assert r.stderr.splitlines() == [
        f"canary: job aborted: rank 1 (worker 0): stage 'load_rows' (id 0, declared at {at}), "
        "load task on partition 0 failed:",
        f"{bad}:2: value 'oops' of feature 2 is not a number (expected INDEX:VALUE with "
        "numeric VALUE)"]


def test_a_failing_kernel_shows_its_traceback_once_and_no_mpi_banners() -> None:
    r = canary_run(str(DRIVERS / "failing_kernel.py"))
    assert r.returncode == 1 and r.stdout == ""
    err = r.stderr
    assert err.count("Traceback") == 1, err
    assert err.count("ZeroDivisionError: kernel blew up on purpose") == 1, err
    # and the driver line that declared the stage, relative to the job's working directory
    at = declared_at('name="explode")', DRIVERS / "failing_kernel.py", ROOT)
    assert at.startswith("tests/drivers/failing_kernel.py:"), at
    assert err.splitlines()[0] == "canary: job aborted: rank 2 (worker 1): stage 'explode' " \
        f"(id 1, iteration (3,), declared at {at}), compute task on partition 2 failed:", err
    assert "Abort(" not in err


def test_a_lost_controller_abort_is_ended_by_the_worker_and_shown_once() -> None:
    r = canary_run(str(DRIVERS / "lost_abort.py"))
    assert r.returncode == 1 and r.stdout == ""
    err = r.stderr
    assert err.count("ZeroDivisionError: kernel blew up on purpose") == 1, err
    assert err.startswith("canary: job aborted: rank 2 (worker 1): stage 'explode'")
    assert "Abort(" not in err and "before the job finished" not in err, err


def test_an_error_on_one_rank_only_is_shown_once_and_ends_the_job() -> None:
    r = canary_run(str(DRIVERS / "one_rank_fails.py"))
    assert r.returncode == 2
    assert r.stderr == "one_rank_fails: error: rank 2 cannot read its input\n"


def test_a_rank_that_stops_before_its_driver_imports_mpi_ends_the_job() -> None:
    # MPI started only when the driver reached canary.run: the other ranks waited in MPI_Init
    # for ever, out of the startup timeout's reach
    r = canary_run(str(DRIVERS / "exits_before_mpi.py"), timeout=60)
    assert r.returncode == 2, r.stderr
    assert "exits_before_mpi: error: data.svm not found on this host" in r.stderr


def test_a_driver_that_raises_on_one_rank_is_named_with_its_rank() -> None:
    # the traceback came alone: nothing said it was rank 2's
    r = canary_run(str(DRIVERS / "rank_raises.py"))
    assert r.returncode == 1
    assert re.search(r"canary: rank 2 \(worker 1, pid \d+\): the driver raised "
                     r"FileNotFoundError:\nTraceback", r.stderr), r.stderr
    assert r.stderr.count("FileNotFoundError") == 2, r.stderr  # the header and the traceback


def test_the_time_limit_stops_the_job_with_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "canary.cli", "run", "-n", "1", "--timeout", "5", LR,
                        "--generate", "20000,5", "--max-iter", "10000000", "--tol", "1e-300",
                        "--print-every", "0"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 124 and r.stdout == ""
    # a busy machine (another job's ranks on the worker's core) adds canary's word on that,
    # rightly; nothing else may come
    said = [line for line in r.stderr.splitlines(keepends=True) if not re.match(
        r"canary: worker 0 \(rank 1\) has a core of its own but waited for it ", line)]
    assert "".join(said) == ("canary: the job ran past its time limit of 5 s (--timeout or "
                             f"MPIEXEC_TIMEOUT) and was stopped; {LOST}\n")
