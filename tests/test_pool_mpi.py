"""A pool on real MPI ranks (2 and 3 workers): jobs at once give their solo answers, a failing
job ends alone, cancel, stop; and every bad request gets a clear error."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from canary.cli import find_mpiexec, mpiexec_env
from canary.pool import client
from canary.pool.client import PoolError
from canary.pool.spool import read_json
from tests.conftest import ROOT, declared_at, shm_left_behind, shm_segments

DRIVER = """
import sys
import time
import numpy as np
import canary
from mpi4py import MPI


def main(argv):
    iters, scale, fail, out = int(argv[0]), float(argv[1]), argv[2] == "fail", argv[3]
    comm = MPI.COMM_WORLD
    p = canary.Program("small")
    x = p.dataset("x", 3)
    if argv[2] == "mismatch" and comm.Get_rank() == 1:
        p.dataset("only_on_rank_1", 2)
    s = p.dataset("s", 1)
    local = p.dataset("local", 3)
    p.load([x], lambda i, n: np.arange(4.0) + i * scale, name="load")
    p.load([s], lambda i, n: np.zeros(4), name="init")

    def step(a, b):
        if fail and b[0] > 0.5:
            raise ValueError("the kernel failed on purpose")
        time.sleep(0.002)
        return a * 1.01 + b * 0.001

    def final(ev):
        if argv[2] == "callback":
            raise ValueError("the callback failed on purpose")
        print("iteration", ev.iteration)

    with p.loop(iters):  # declared: the loop
        p.broadcast(s, local)
        p.compute(step, [x, local], [x])
        p.reduce(x, s)
        p.report(s, name="progress")  # what `canary jobs` counts iterations by
    p.report(s, name="final", callback=final)  # declared: final
    result = canary.run(p, comm)
    if result is not None:
        np.save(out, result.value("s"))
        print("done on", comm.Get_size() - 1, "workers")
        print("controller cpu", result.controller_cpu_seconds)
    if argv[2] == "twice":
        canary.run(p, comm)  # raises: twice
    return 0
"""


@pytest.fixture
def driver(tmp_path: Path) -> str:
    path = tmp_path / "small_driver.py"
    path.write_text(DRIVER)
    return str(path)


def _expected(iters: int, scale: float) -> np.ndarray:
    """The same program in-process (its answer does not depend on the workers)."""
    import canary

    p = canary.Program("small")
    x = p.dataset("x", 3)
    s = p.dataset("s", 1)
    local = p.dataset("local", 3)
    p.load([x], lambda i, n: np.arange(4.0) + i * scale, name="load")
    p.load([s], lambda i, n: np.zeros(4), name="init")
    with p.loop(iters):
        p.broadcast(s, local)
        p.compute(lambda a, b: a * 1.01 + b * 0.001, [x, local], [x])
        p.reduce(x, s)
    p.report(s, name="final")
    return canary.run_local(p, workers=2).value("s")


@pytest.fixture
def pool_dir(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "pool"
    yield root
    launcher = read_json(root / "launcher.json")
    try:
        client.stop(root, now=True, timeout=30)
    except PoolError:
        pass
    finally:  # never leave a pool behind
        pid = (launcher or {}).get("pid")
        if pid:
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _start(root: Path, workers: int, policy: str = "fair") -> None:
    env = mpiexec_env(120, str(ROOT))
    client.start(workers, find_mpiexec(), env, root, policy=policy, timeout=90)


@pytest.mark.parametrize("workers", [2, 3])
def test_two_jobs_at_once_a_failing_one_and_a_cancel(workers: int, driver: str,
                                                     pool_dir: Path, tmp_path: Path) -> None:
    _start(pool_dir, workers)
    outs = [str(tmp_path / f"out{k}.npy") for k in range(3)]
    a = client.submit(driver, ["8", "1.0", "ok", outs[0]], pool_dir, user="ann")
    bad = client.submit(driver, ["8", "1.0", "fail", outs[1]], pool_dir, user="bob")
    b = client.submit(driver, ["5", "2.0", "ok", outs[2]], pool_dir, user="bob", priority=1)
    long = client.submit(driver, ["100000", "1.0", "ok", outs[1]], pool_dir, workers=1)
    for job, iters in ((a, 8), (b, 5)):
        st = client.wait(job, pool_dir, timeout=120)
        assert st["state"] == "done" and st["exit_code"] == 0, client.logs(job, pool_dir)
        assert st["iteration"] == iters  # the loop's passes, not the last one's 0-based count
    assert np.array_equal(np.load(outs[0]), _expected(8, 1.0))
    assert np.array_equal(np.load(outs[2]), _expected(5, 2.0))
    assert np.array_equal(client.result(a, pool_dir).value("s"), _expected(8, 1.0))
    st = client.wait(bad, pool_dir, timeout=120)
    assert st["state"] == "failed" and st["exit_code"] != 0
    assert "the kernel failed on purpose" in client.logs(bad, pool_dir)
    with pytest.raises(PoolError) as failed:  # its error, and nothing after it
        client.result(bad, pool_dir)
    assert str(failed.value).startswith(f"job {bad} failed: ")
    assert str(failed.value).endswith(st["error"])
    # the kernel's traceback, once: not again through canary's frames from the driver's thread
    assert client.logs(bad, pool_dir).count("Traceback") == 1, client.logs(bad, pool_dir)
    assert f"done on {workers} workers" in client.logs(a, pool_dir)
    # rank 0 serves every job at once: a job's share of its CPU is not known, not 0
    assert "controller cpu nan" in client.logs(a, pool_dir)
    assert math.isnan(client.result(a, pool_dir).controller_cpu_seconds)
    assert "iteration ()" in client.logs(a, pool_dir)  # the callback ran, into the log
    client.cancel(long, pool_dir)
    st = client.wait(long, pool_dir, timeout=60)
    assert st["state"] == "cancelled" and "canary cancel" in st["error"]
    assert st["exit_code"] == 130 and "Traceback" not in client.logs(long, pool_dir)
    with pytest.raises(PoolError, match="already ended"):
        client.cancel(long, pool_dir)
    # the pool goes on after all that
    c = client.submit(driver, ["3", "1.0", "ok", outs[1]], pool_dir)
    assert client.wait(c, pool_dir, timeout=120)["state"] == "done"
    assert np.array_equal(np.load(outs[1]), _expected(3, 1.0))
    client.stop(pool_dir, timeout=60)
    with pytest.raises(PoolError, match="no pool is running"):
        client.submit(driver, [], pool_dir)


def test_a_long_job_says_how_far_it_is_and_a_failing_callback_its_report(
        driver: str, pool_dir: Path, tmp_path: Path) -> None:
    # a pool job printed no progress line, so a long one looked hung; and its report callback
    # that raised said neither which report nor its line, which canary run says
    env = dict(mpiexec_env(120, str(ROOT)), CANARY_PROGRESS_S="1", CANARY_REPORT_MS="100")
    client.start(2, find_mpiexec(), env, pool_dir, timeout=90)
    out = str(tmp_path / "o.npy")
    long = client.submit(driver, ["1000", "1.0", "ok", out], pool_dir)  # 4 s of sleeps or more
    bad = client.submit(driver, ["2", "1.0", "callback", out], pool_dir)
    assert client.wait(long, pool_dir, timeout=120)["state"] == "done"
    said = client.logs(long, pool_dir)
    loop = re.escape(declared_at("# declared: the loop", driver))
    assert re.search(rf"^canary pool: job {long}: [\d.]+ s: loop\(1,000\) at {loop} iteration "
                     r"[\d,]+, stage instance [\d,]+; [\d.]+K? tasks, ", said, re.M), said
    assert client.wait(bad, pool_dir, timeout=120)["state"] == "failed"
    said = client.logs(bad, pool_dir)
    assert f"canary: job aborted: rank 0 (controller): report 'final' of 's' (iteration (), " \
           f"declared at {declared_at('# declared: final', driver)}), its callback failed:\n" \
           "Traceback" in said, said
    assert said.count("Traceback") == 1 and "the callback failed on purpose" in said, said


def test_stop_now_ends_a_pool_whose_job_is_stuck_before_canary_run(
        pool_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a driver that never reaches canary.run never hears of its cancel: `cluster stop --now`
    # waited for it forever
    sleepy = tmp_path / "sleepy.py"
    sleepy.write_text("import time\n\n\ndef main(argv):\n    time.sleep(1e6)\n")
    # a pool's killed rank left its MPICH file for good: a start now removes such files (those
    # no process maps, unchanged for a minute), as canary run does
    swept: list[bool] = []
    monkeypatch.setattr(client, "remove_stale", lambda: swept.append(True) or [])
    before = shm_segments()
    _start(pool_dir, 2)
    assert swept == [True]
    job = client.submit(str(sleepy), [], pool_dir)
    while client.status(job, pool_dir)["state"] != "running":
        time.sleep(0.05)
    client.stop(pool_dir, now=True, timeout=60)
    st = client.status(job, pool_dir)
    assert st["state"] == "cancelled" and "stopped with --now" in st["error"], st
    # `canary cancel` of such a job: it stayed "running" until the pool stopped
    _start(pool_dir, 2)
    job = client.submit(str(sleepy), [], pool_dir)
    while client.status(job, pool_dir)["state"] != "running":
        time.sleep(0.05)
    client.cancel(job, pool_dir)
    st = client.wait(job, pool_dir, timeout=60)
    assert st["state"] == "cancelled" and "canary cancel" in st["error"], st
    client.stop(pool_dir, now=True, timeout=60)
    assert shm_left_behind(before) == set()


def test_the_commands_work_end_to_end(driver: str, pool_dir: Path, tmp_path: Path) -> None:
    def canary(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "canary.cli", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=150,
                              env=mpiexec_env(120, str(ROOT)))

    r = canary("cluster", "start", "-n", "2", "--dir", str(pool_dir), "--policy", "priority")
    assert r.returncode == 0 and "2 worker(s), policy priority" in r.stdout, r.stderr
    out = str(tmp_path / "o.npy")
    r = canary("submit", "--cluster", str(pool_dir), "--wait", driver, "4", "1.0", "ok", out)
    assert r.returncode == 0, r.stderr
    assert "done on 2 workers" in r.stdout and "placed on worker(s)" in r.stdout
    r = canary("submit", "--cluster", str(pool_dir), "--wait", driver, "4", "1.0", "fail", out)
    # stdout elsewhere: stderr says the error whole
    assert r.returncode == 1 and "ValueError: the kernel failed on purpose" in r.stderr
    # stdout and stderr in one place, as in a terminal: the kernel's traceback once, in the
    # job's log; the last line only says the job failed
    both = subprocess.run([sys.executable, "-m", "canary.cli", "submit", "--cluster",
                           str(pool_dir), "--wait", driver, "4", "1.0", "fail", out], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=150, env=mpiexec_env(120, str(ROOT)))
    said = both.stdout
    assert both.returncode == 1
    assert said.count("ValueError: the kernel failed on purpose") == 1, said
    assert said.rstrip().endswith("canary: job 3 failed (TaskError, said above)"), said
    r = canary("submit", "--cluster", str(pool_dir), "--wait", driver, "4", "1.0", "mismatch",
               out)
    assert r.returncode == 1 and "declared a different program" in r.stderr
    # a waiting submitter that is killed takes its job with it
    waiter = subprocess.Popen([sys.executable, "-m", "canary.cli", "submit", "--cluster",
                               str(pool_dir), "--wait", driver, "100000", "1.0", "ok", out],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=mpiexec_env(120, str(ROOT)))
    assert waiter.stdout is not None
    assert "placed on worker(s)" in waiter.stdout.readline().decode()
    waiter.kill()
    waiter.wait(30)
    st = client.wait(5, pool_dir, timeout=60)
    assert st["state"] == "cancelled" and "its submitter" in st["error"]
    # one stopped with SIGTERM cancels it and says so, as Ctrl-C does (it said nothing)
    waiter = subprocess.Popen([sys.executable, "-m", "canary.cli", "submit", "--cluster",
                               str(pool_dir), "--wait", driver, "100000", "1.0", "ok", out],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=mpiexec_env(120, str(ROOT)))
    assert waiter.stdout is not None and waiter.stderr is not None
    assert "placed on worker(s)" in waiter.stdout.readline().decode()
    waiter.terminate()
    assert waiter.wait(30) == 128 + signal.SIGTERM
    assert "canary: job 6 cancelled" in waiter.stderr.read().decode()
    assert client.wait(6, pool_dir, timeout=60)["state"] == "cancelled"
    r = canary("submit", "--cluster", str(pool_dir), "--wait", driver, "4", "1.0", "twice", out)
    said = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in said, said
    at = declared_at("# raises: twice", driver)
    assert f"small_driver: error: {at}: canary.run called a second time: a pool job runs " \
           "one program" in said
    # a syntax error: where it is, not the pool's and importlib's frames
    broken = tmp_path / "broken.py"
    broken.write_text("def main(argv):\n    return (1 +\n")
    r = canary("submit", "--cluster", str(pool_dir), "--wait", str(broken))
    said = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in said and "importlib" not in said, said
    assert f'File "{broken}", line 2' in said and "SyntaxError" in said
    r = canary("jobs", "--cluster", str(pool_dir))
    assert r.returncode == 0 and " done " in r.stdout and " failed " in r.stdout
    r = canary("cluster", "status", "--cluster", str(pool_dir))
    assert "pool ready: 2 worker(s)" in r.stdout
    assert "2 cancelled, 1 done, 5 failed" in r.stdout, r.stdout
    r = canary("logs", "99", "--cluster", str(pool_dir))
    assert r.returncode == 2 and "no job 99 in the pool" in r.stderr
    # two users' pkg/job.py: the second ran the first's code, with its answer
    for who in ("alice", "bob"):
        (tmp_path / who / "pkg").mkdir(parents=True)
        (tmp_path / who / "pkg" / "__init__.py").write_text("")
        (tmp_path / who / "pkg" / "job.py").write_text(f"def main(argv):\n    print('{who}')\n")
    r = canary("submit", "--cluster", str(pool_dir), "--wait", str(tmp_path / "alice/pkg/job.py"))
    assert r.returncode == 0 and "alice" in r.stdout, r.stderr
    # it declared no program: that is no abort (it said "job aborted: the driver ... gave up")
    assert "aborted" not in r.stdout + r.stderr, r.stdout + r.stderr
    r = canary("submit", "--cluster", str(pool_dir), "--wait", str(tmp_path / "bob/pkg/job.py"))
    said = r.stdout + r.stderr
    assert r.returncode == 1 and "alice\n" not in said.splitlines(keepends=True)
    assert f"{tmp_path / 'bob/pkg/job.py'} is imported as pkg.job, the name of " \
           f"{tmp_path / 'alice/pkg/job.py'}, which this pool has already run" in said
    r = canary("cluster", "stop", "--cluster", str(pool_dir))
    assert r.returncode == 0 and "stopped" in r.stdout


def test_bad_requests_get_clear_errors(driver: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "nowhere"
    with pytest.raises(PoolError, match="no pool is running at .*canary cluster start"):
        client.submit(driver, [], root)
    with pytest.raises(PoolError, match="script not found: missing.py"):
        client.submit("missing.py", [], root)
    with pytest.raises(PoolError, match=f"{tmp_path} is a folder: give the driver script's file"):
        client.submit(str(tmp_path), [], root)
    for weight in (-1.0, math.inf):  # inf went into status.json as non-standard JSON
        with pytest.raises(PoolError, match=f"--weight must be a number > 0, got {weight}"):
            client.submit(driver, [], root, weight=weight)
    with pytest.raises(PoolError, match="--priority must be >= 0"):
        client.submit(driver, [], root, priority=-2)
    # a directory no pool ever used: said so, not an empty list or "no job 7"
    for ask in (lambda: client.status(7, root), lambda: client.jobs(root),
                lambda: client.logs(7, root)):
        with pytest.raises(PoolError, match="no pool is running at .*canary cluster start"):
            ask()
    with pytest.raises(PoolError, match="unknown queue policy 'lifo'; choose from fifo"):
        client.start(2, "mpiexec", {}, root, policy="lifo")
    with pytest.raises(PoolError, match="unknown placement policy 'best'"):
        client.start(2, "mpiexec", {}, root, placement="best")
    from canary.cli import main

    assert main(["cancel", "3", "--cluster", str(root)]) == 2
    assert main(["submit", "--cluster", str(root), "--weight", "-1", driver]) == 2
    # it was the top parser's "unrecognized arguments", its usage line the wrong one
    capsys.readouterr()
    assert main(["submit", "--cluster", str(root), "--balance", "off", driver]) == 2
    assert capsys.readouterr().err.startswith("canary submit: error: --balance is not available "
                                              "for a pool job")
    with pytest.raises(PoolError, match="CANARY_CHECKPOINT is set, but a pool takes no snapsh"):
        client.start(2, "mpiexec", {"CANARY_CHECKPOINT": "/tmp/snaps"}, root)
    # these were ignored by a pool, or ended its workers while it said it was ready
    for env, says in (({"CANARY_CHAOS_MIGRATE": "3"}, "CANARY_CHAOS_MIGRATE is set, but a pool "
                                                      "moves no partition"),
                      ({"CANARY_BALANCE": "off"}, "a pool does not balance its jobs"),
                      ({"CANARY_SLOWDOWN": "zz"}, "CANARY_SLOWDOWN is set, but a pool slows"),
                      ({"CANARY_CHECKPOINT_EVERY": "-5"}, "a pool takes no snapshots")):
        with pytest.raises(PoolError, match=says):
            client.start(2, "mpiexec", env, root)
    # a worker's setting it cannot use: said by the ranks before the pool says it is ready
    with pytest.raises(PoolError, match=r"the pool did not start: rank 0: environment variable "
                                        r"CANARY_SPIN_US='zz' is not a number"):
        client.start(1, find_mpiexec(), dict(mpiexec_env(60, str(ROOT)), CANARY_SPIN_US="zz"),
                     tmp_path / "spin", timeout=60)
    for ratio in (math.inf, 1e9, math.nan):  # inf crashed rank 0; 1e9 grew it to 3.6 GB
        with pytest.raises(PoolError, match="the probe ratio must be between 1 and 64"):
            client.start(2, "mpiexec", {}, root, probe_ratio=ratio)


def test_snapshot_options_of_a_pool_job_are_refused_saying_what_to_do(
        driver: str, capsys: pytest.CaptureFixture[str]) -> None:
    from canary.cli import main

    for option, value in (("--checkpoint", "snaps"), ("--resume", "snaps"), ("--restarts", "2")):
        assert main(["submit", option, value, driver]) == 2
        err = capsys.readouterr().err
        assert f"{option} is not available for a pool job" in err
        assert f"`canary run {option} ...`" in err
