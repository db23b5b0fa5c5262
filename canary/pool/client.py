"""Using a pool from Python or the command line: start, submit, wait, result, cancel, stop.

Everything goes through the pool's directory (:mod:`canary.pool.spool`); nothing needs a
network port. Every function takes the directory (``root``; default
:func:`~canary.pool.spool.default_dir`) and raises :class:`PoolError` with a message that says
what to do: no pool running there, an unknown job id, a script that does not exist, a bad
priority, weight or worker count, an unknown policy.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from canary.env import BALANCE_ENV, CHAOS_ENV, CHECKPOINT_EVERY_ENV, KEEP_ENV, SLOWDOWN_ENV
from canary.errors import CanaryError
from canary.mpich_shm import remove_stale
from canary.pool.spool import FINAL_STATES, Spool, default_dir, read_json, write_json
from canary.result import JobResult
from canary.sched.placement import MAX_PROBE_RATIO, PLACEMENT_POLICIES
from canary.sched.queues import QUEUE_POLICIES
from canary.sentinel import is_running

__all__ = ["PoolError", "cancel", "jobs", "logs", "pool_info", "result", "start", "status",
           "stop", "submit", "wait"]


# what `canary run --checkpoint/--resume` set for a job's ranks: a pool's jobs never read them
SNAPSHOT_ENV = ("CANARY_CHECKPOINT", "CANARY_RESUME", CHECKPOINT_EVERY_ENV, KEEP_ENV)
# what only `canary run` does: a pool would run its jobs without it, saying nothing
RUN_ONLY_ENV = {CHAOS_ENV: "moves no partition", BALANCE_ENV: "does not balance its jobs",
                SLOWDOWN_ENV: "slows no worker"}


class PoolError(CanaryError):
    """A pool request that cannot be carried out; the message says why and what to do."""


def _spool(root: str | os.PathLike[str] | None) -> Spool:
    return Spool(default_dir() if root is None else root)


def pool_info(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The running pool's ``pool.json`` (state ``ready`` or ``stopping``).

    Raises PoolError if no pool runs at ``root`` (never started, stopped, or its mpiexec
    ended)."""
    sp = _spool(root)
    info = read_json(sp.pool_file)
    launcher = read_json(sp.launcher_file) or {}
    pid = launcher.get("pid")
    if (info is None or info.get("state") not in ("ready", "stopping")
            or (pid is not None and not is_running(int(pid)))):
        died = info is not None and info.get("state") in ("ready", "stopping")
        why = (f"the pool at {sp.root} ended unexpectedly (see {sp.log_file})" if died
               else f"no pool is running at {sp.root}")
        raise PoolError(f"{why}: start one with `canary cluster start -n N --dir {sp.root}`")
    return dict(info)


def start(workers: int, mpiexec: str, env: Mapping[str, str],
          root: str | os.PathLike[str] | None = None, policy: str = "fair",
          placement: str = "batch-late", hostfile: str | None = None, seed: int = 0,
          probe_ratio: float = 2.0, timeout: float = 120.0) -> dict[str, Any]:
    """Launch a pool of ``workers`` workers plus rank 0 under ``mpiexec`` in the background
    (its own session: it outlives the caller) and return its ``pool.json`` once ready.

    Raises PoolError for a bad count, policy or probe ratio, a missing hostfile, a pool
    already running there, or a pool that did not come up within ``timeout`` seconds (with
    the end of its log)."""
    if workers < 1:
        raise PoolError(f"a pool needs at least 1 worker, got -n {workers}")
    if policy not in QUEUE_POLICIES:
        raise PoolError(f"unknown queue policy {policy!r}; choose from "
                        f"{', '.join(QUEUE_POLICIES)}")
    if placement not in PLACEMENT_POLICIES:
        raise PoolError(f"unknown placement policy {placement!r}; choose from "
                        f"{', '.join(PLACEMENT_POLICIES)}")
    if not 1 <= probe_ratio <= MAX_PROBE_RATIO:  # also NaN
        raise PoolError(f"the probe ratio must be between 1 and {MAX_PROBE_RATIO:g}, got "
                        f"{probe_ratio}")
    if hostfile and not os.path.exists(hostfile):
        raise PoolError(f"hostfile not found: {hostfile}")
    for name in SNAPSHOT_ENV:
        if env.get(name, "").strip():
            raise PoolError(f"{name} is set, but a pool takes no snapshots (its jobs would run "
                            f"without them): unset {name} to start a pool, and run a job that "
                            "needs snapshots with `canary run --checkpoint DIR`")
    for name, why in RUN_ONLY_ENV.items():
        if env.get(name, "").strip():
            raise PoolError(f"{name} is set, but a pool {why} (that is `canary run`'s): unset "
                            f"{name} to start a pool")
    sp = _spool(root)
    try:
        info = pool_info(sp.root)
    except PoolError:
        info = None
    if info is not None:
        raise PoolError(f"a pool is already running at {sp.root} ({info['workers']} workers): "
                        "stop it with `canary cluster stop` or use another --dir")
    sp.root.mkdir(parents=True, exist_ok=True)
    # what earlier jobs or pools whose ranks were killed left in /dev/shm, as canary run does
    remove_stale()
    for stale in (sp.pool_file, sp.stop_file, sp.launcher_file):
        stale.unlink(missing_ok=True)
    for marker in sp.folder("cancel").iterdir():  # queued ones: the pool marks them lost
        marker.unlink(missing_ok=True)
    cmd = [mpiexec, *(["-f", hostfile] if hostfile else []), "-n", str(workers + 1),
           sys.executable, "-u", "-m", "mpi4py", "-m", "canary.pool.host", "--dir",
           str(sp.root), "--policy", policy, "--placement", placement, "--seed", str(seed),
           "--probe-ratio", str(probe_ratio)]
    with open(sp.log_file, "ab") as log:
        proc = subprocess.Popen(cmd, env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    write_json(sp.launcher_file, {"pid": proc.pid, "command": cmd, "since": time.time()})
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        info = read_json(sp.pool_file)
        if info is not None and info.get("state") == "ready":
            return dict(info)
        if info is not None and info.get("state") == "failed":  # a rank refused its settings
            raise PoolError(f"the pool did not start: {info.get('error')}")
        if proc.poll() is not None:
            raise PoolError(f"the pool did not start (mpiexec exited with status "
                            f"{proc.returncode}):\n{_tail(sp.log_file)}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    raise PoolError(f"the pool did not come up within {timeout:.0f} s:\n{_tail(sp.log_file)}")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(root: str | os.PathLike[str] | None = None, now: bool = False,
         timeout: float = 600.0) -> None:
    """Stop the pool: it takes no new job, lets running jobs end (``now``: cancels them), and
    leaves. Returns once mpiexec has ended; PoolError if no pool runs there or it did not end
    within ``timeout`` seconds."""
    sp = _spool(root)
    pool_info(sp.root)
    sp.stop_file.write_text("now" if now else "wait")
    sp.wake()
    pid = int((read_json(sp.launcher_file) or {}).get("pid", 0))
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        info = read_json(sp.pool_file) or {}
        if info.get("state") == "stopped" and (not pid or not is_running(pid)):
            return
        if pid and not is_running(pid):
            return
        time.sleep(0.05)
    raise PoolError(f"the pool at {sp.root} did not stop within {timeout:.0f} s "
                    f"(see {sp.log_file})")


def submit(script: str, args: Sequence[str] = (), root: str | os.PathLike[str] | None = None,
           user: str | None = None, priority: int = 0, weight: float = 1.0,
           workers: int = 0, waiter: int | None = None) -> int:
    """Hand ``script`` (a driver as ``canary run`` runs it) with ``args`` to the pool; return
    the job's id. ``waiter``: a process whose end cancels the job (``submit --wait``).

    Raises PoolError for a script that does not exist, a priority below 0, a weight that is
    not > 0, a negative worker count, or no pool running there."""
    if os.path.isdir(script):
        raise PoolError(f"{script} is a folder: give the driver script's file")
    if not os.path.isfile(script):
        raise PoolError(f"script not found: {script}")
    if priority < 0:
        raise PoolError(f"--priority must be >= 0 (0 is the most urgent), got {priority}")
    if not 0 < weight < math.inf:  # inf was written to status.json as non-standard JSON
        raise PoolError(f"--weight must be a number > 0, got {weight}")
    if workers < 0:
        raise PoolError(f"--workers must be >= 0 (0: the whole pool), got {workers}")
    sp = _spool(root)
    info = pool_info(sp.root)
    if info.get("state") != "ready":
        raise PoolError(f"the pool at {sp.root} is stopping and takes no new job")
    spec = {"script": os.path.abspath(script), "args": list(args),
            "user": user or os.environ.get("USER", "user"), "priority": int(priority),
            "weight": float(weight), "workers": int(workers), "cwd": os.getcwd(),
            "submitted": time.time(), "waiter": waiter}
    return sp.new_job(spec)


def status(job: int, root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The job's status (see :mod:`canary.pool.spool`); a job that was not final when its pool
    ended unexpectedly is ``lost``. PoolError for an unknown id, or that no pool runs there if
    none ever ran a job there."""
    sp = _spool(root)
    st = read_json(sp.status_file(job))
    if st is None:
        if not sp.job_ids():  # no pool ever ran jobs here: a wrong --dir, most likely
            pool_info(sp.root)
        raise PoolError(f"no job {job} in the pool at {sp.root} (`canary jobs` lists them)")
    if st.get("state") not in FINAL_STATES:
        try:
            pool_info(sp.root)
        except PoolError:
            st = dict(st, state="lost", error=f"the pool ended before the job (see "
                                              f"{sp.log_file})")
    return dict(st)


def wait(job: int, root: str | os.PathLike[str] | None = None, timeout: float | None = None,
         follow: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Wait until the job ends; return its final status. ``follow(text)`` receives the job's
    output as it is written. Raises PoolError for an unknown job or if ``timeout`` seconds
    pass first."""
    sp = _spool(root)
    out_log = sp.job_dir(job) / "out.log"
    seen = 0
    end = None if timeout is None else time.monotonic() + timeout
    delay = 0.005
    while True:
        st = status(job, sp.root)
        if follow is not None:
            seen = _follow(out_log, seen, follow)
        if st["state"] in (*FINAL_STATES, "lost"):
            if follow is not None:
                _follow(out_log, seen, follow)
            return st
        if end is not None and time.monotonic() > end:
            raise PoolError(f"job {job} did not end within {timeout} s")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.1)


def _follow(path: Path, seen: int, emit: Callable[[str], None]) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(seen)
            data = f.read()
    except FileNotFoundError:
        return seen
    cut = data.rfind(b"\n") + 1  # whole lines only
    if cut:
        emit(data[:cut].decode(errors="replace"))
    return seen + cut


def result(job: int, root: str | os.PathLike[str] | None = None,
           timeout: float | None = None) -> JobResult:
    """Wait for the job and return its :class:`~canary.JobResult` (the reported datasets,
    tasks run, workers, seconds). Raises PoolError if it did not finish successfully, with
    its error."""
    st = wait(job, root, timeout)
    if st["state"] != "done":
        # the hint names the job: inside the `or`, not after it (a stray "79`" followed errors)
        raise PoolError(f"job {job} {st['state']}: "
                        f"{st.get('error') or f'see `canary logs {job}`'}")
    sp = _spool(root)
    results: dict[str, list[np.ndarray]] = {}
    path = sp.job_dir(job) / "result.npz"
    if path.exists():
        with np.load(path) as data:
            for key in data.files:
                name, _, idx = key.rpartition("/")
                parts = results.setdefault(name, [])
                parts.append((int(idx), data[key]))  # type: ignore[arg-type]
        results = {k: [a for _, a in sorted(v, key=lambda t: t[0])]  # type: ignore[misc]
                   for k, v in results.items()}
    return JobResult(results, int(st.get("tasks", 0)), len(st.get("workers", [])),
                     float(st.get("seconds", 0.0)), controller_cpu_seconds=math.nan)


def cancel(job: int, root: str | os.PathLike[str] | None = None) -> None:
    """Ask the pool to end the job (its partitions are freed on every worker). PoolError for
    an unknown job, one that already ended, or no pool running."""
    sp = _spool(root)
    st = status(job, sp.root)
    if st["state"] in (*FINAL_STATES, "lost"):
        raise PoolError(f"job {job} already ended ({st['state']})")
    (sp.folder("cancel") / str(job)).touch()
    sp.wake()


def jobs(root: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Every job of the pool directory, oldest first, with its status (those of a pool that
    has ended too). Raises PoolError if no pool runs there and none left jobs: an empty list
    would look like an idle pool to someone who named the wrong directory."""
    sp = _spool(root)
    ids = sp.job_ids()
    try:
        pool_info(sp.root)
        alive = True
    except PoolError:
        if not ids:
            raise
        alive = False
    out = []
    for job in ids:
        st = read_json(sp.status_file(job)) or {"job": job, "state": "queued"}
        if not alive and st.get("state") not in FINAL_STATES:
            st["state"] = "lost"
        spec = read_json(sp.job_dir(job) / "spec.json") or {}
        st.setdefault("user", spec.get("user"))
        st.setdefault("priority", spec.get("priority"))
        st["script"] = spec.get("script")
        st["submitted"] = spec.get("submitted")
        out.append(st)
    return out


def logs(job: int, root: str | os.PathLike[str] | None = None) -> str:
    """The job's output: rank 0's, then each worker rank's that printed anything."""
    sp = _spool(root)
    status(job, sp.root)
    folder = sp.job_dir(job)
    parts = []
    out = folder / "out.log"
    if out.exists():
        parts.append(out.read_text(errors="replace"))
    said = set(parts[0].splitlines()) if parts else set()
    for path in sorted(folder.glob("rank-*.log"), key=lambda p: int(p.stem.split("-")[1])):
        # what every rank printed alike (a usage error) shows once, as under `canary run`
        text = "".join(line for line in path.read_text(errors="replace").splitlines(True)
                       if line.rstrip("\n") not in said)
        if text:
            parts.append(f"--- {path.stem} ---\n{text}")
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts)
