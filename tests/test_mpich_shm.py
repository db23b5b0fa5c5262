"""MPICH's shared-memory files: removed after a job that aborts or loses a rank, never while a
process maps them (canary.mpich_shm)."""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from canary.mpich_shm import (
    PREFIX,
    mapped_segments,
    remove_orphans,
    remove_stale,
)
from tests.conftest import ROOT, mpirun, shm_left_behind, shm_segments

MAPS = """\
7f00-7f10 rw-s 00000000 00:1a 1001 /dev/shm/mpich_shm_97852cf1_0
7f10-7f20 rw-s 00000000 00:1a 1002 /dev/shm/ucx_shm_posix_26f80bf2 (deleted)
7f20-7f30 rw-s 00001000 00:1a 1001 /dev/shm/mpich_shm_97852cf1_0
7f30-7f40 rw-s 00000000 00:1a 1003 /dev/shm/mpich_shm_0badcafe_0 (deleted)
7f40-7f50 r-xp 00000000 08:01 2000 /usr/lib/libmpi.so.12
7f50-7f60 rw-p 00000000 00:00 0
7f60-7f70 rw-s 00000000 00:1a 1004 /tmp/my data/mpich_shm_1_0
"""


def test_the_mapped_files_are_mpichs_still_named_ones_each_once() -> None:
    assert mapped_segments(MAPS.splitlines()) == ["/dev/shm/mpich_shm_97852cf1_0",
                                                  "/tmp/my data/mpich_shm_1_0"]


def test_only_files_made_since_the_job_started_and_mapped_by_nobody_go(tmp_path: Path) -> None:
    def make(name: str) -> Path:
        path = tmp_path / name
        path.write_bytes(b"\0" * 4096)
        return path

    old = make(PREFIX + "old_0")
    time.sleep(0.05)
    since = time.time()
    time.sleep(0.05)
    orphan, mapped, other = make(PREFIX + "orphan_0"), make(PREFIX + "mapped_0"), make("other")
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096) as held:
        assert remove_orphans(since, folder=str(tmp_path)) == [str(orphan)]
        assert held[0] == 0
    assert old.exists() and mapped.exists() and other.exists() and not orphan.exists()
    assert remove_orphans(since, folder=str(tmp_path)) == [str(mapped)]
    assert remove_orphans(since, folder=str(tmp_path / "absent")) == []
    written = make(PREFIX + "written_0")  # by a process between the two looks: in use
    later = threading.Timer(0.1, lambda: os.utime(written))
    later.start()
    assert remove_orphans(since, settle=0.3, folder=str(tmp_path)) == []
    later.join()
    assert written.exists()


def test_files_unchanged_for_a_minute_and_mapped_by_nobody_go_before_a_job(tmp_path: Path) -> None:
    # what a job killed with its launcher leaves: nothing that ran after it could remove it
    left, mapped, other = (tmp_path / n for n in (PREFIX + "left_0", PREFIX + "mapped_0", "x"))
    topology, held = tmp_path / "hydra_hwloc_xmlfile_a", tmp_path / "hydra_hwloc_xmlfile_b"
    for path in (left, mapped, other, topology, held):
        path.write_bytes(b"\0" * 4096)
    in_a_minute = time.time() + 61
    here = {"folder": str(tmp_path), "topologies": str(tmp_path)}
    assert remove_stale(**here) == []  # just made: may be a starting job's
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096), open(held):
        # a running proxy holds its topology file open
        assert remove_stale(**here, now=in_a_minute) == [str(left), str(topology)]
    assert mapped.exists() and other.exists() and held.exists() and not left.exists()
    assert remove_stale(**here, now=in_a_minute) == [str(mapped), str(held)]
    assert remove_stale(folder=str(tmp_path / "absent"), now=in_a_minute,
                        topologies=str(tmp_path / "absent")) == []


def test_a_file_still_mapped_by_an_exiting_rank_goes_once_it_has_exited(tmp_path: Path) -> None:
    # a plain mpiexec can return while the ranks it killed are still exiting
    since = time.time()
    path = tmp_path / (PREFIX + "exiting_0")
    path.write_bytes(b"\0" * 4096)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import mmap, sys, time\n"
        f"f = open({str(path)!r}, 'r+b'); m = mmap.mmap(f.fileno(), 4096)\n"
        "print('mapped', flush=True); time.sleep(0.5)")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "mapped\n"
    assert remove_orphans(since, folder=str(tmp_path)) == []  # in use: left alone
    assert remove_orphans(since, folder=str(tmp_path), wait=10.0) == [str(path)]
    assert holder.wait(timeout=10) == 0 and not path.exists()


def test_a_job_that_aborts_leaves_no_shared_memory_behind() -> None:
    before = shm_segments()
    r = mpirun(3, "tests/drivers/failing_kernel.py")
    assert r.returncode != 0 and "kernel blew up on purpose" in r.stderr, r.stderr[-2000:]
    assert shm_left_behind(before) == set()


def test_a_driver_that_rejects_its_input_leaves_no_shared_memory_behind() -> None:
    before = shm_segments()
    r = mpirun(3, "apps/logistic_regression.py", "--input", "/nonexistent/data.svm")
    assert r.returncode == 2 and "no such file" in r.stderr, r.stderr[-2000:]
    assert shm_left_behind(before) == set()


def test_a_job_that_loses_a_rank_leaves_no_shared_memory_behind(tmp_path: Path) -> None:
    before = shm_segments()
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "canary.cli", "run", "-n", "2", "--timeout",
                             "120", "apps/logistic_regression.py", "--generate", "20000,10",
                             "--max-iter", "100000", "--tol", "1e-300"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("canary-run-*/start-2.json")) or shm_segments() == before:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    start = json.loads(next(tmp_path.glob("canary-run-*/start-2.json")).read_text())
    assert proc.poll() is None
    os.kill(int(start["pid"]), signal.SIGKILL)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGKILL and b"killed by SIGKILL" in err, err
    assert shm_left_behind(before) == set()
