"""The pool's directory: how submitters and the pool's rank 0 talk, with no network port.

Layout of a pool directory ``DIR``:

* ``pool.json``: the pool (state ``starting``, ``ready``, ``stopping``, ``stopped``; workers,
  policies), written by rank 0; ``launcher.json``: the mpiexec process, written by
  ``cluster start``; ``pool.log``: mpiexec's output.
* ``jobs/ID/``: one folder per job: ``spec.json`` (what was submitted), ``status.json`` (state
  ``queued``, ``placing``, ``running``, ``done``, ``failed``, ``cancelled``, ``lost``: left
  unfinished by a pool that died, marked when the next pool starts here; exit status,
  error, workers, progress, times), ``out.log`` (the driver's output on rank 0, the job's
  notes), ``rank-R.log`` (what its driver and tasks printed on worker rank R, if anything),
  ``result.npz`` (the reported datasets of a finished job).
* ``queue/ID``: a job waiting to be read by rank 0; ``cancel/ID``: a cancellation asked for;
  ``stop``: stop asked for (``wait`` or ``now``).
* ``wake``: a named pipe rank 0 reads; a submitter on the same host writes a byte to it after
  each request so that rank 0 reads the directory at once rather than at its next look.

Every JSON file is written whole to a temporary name and renamed, so a reader never sees half.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FINAL_STATES = ("done", "failed", "cancelled")
DIR_ENV = "CANARY_POOL_DIR"


def default_dir() -> Path:
    """Where a pool lives when no ``--dir``/``--cluster`` is given: ``$CANARY_POOL_DIR``, else
    ``canary/pool`` under the user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    given = os.environ.get(DIR_ENV, "").strip()
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(
        os.path.expanduser("~"), ".cache")
    return Path(cache) / "canary" / "pool"


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` to ``path`` atomically (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None if there is no such file."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


class Spool:
    """The files of the pool at ``root`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()

    @property
    def pool_file(self) -> Path:
        return self.root / "pool.json"

    @property
    def launcher_file(self) -> Path:
        return self.root / "launcher.json"

    @property
    def log_file(self) -> Path:
        return self.root / "pool.log"

    @property
    def stop_file(self) -> Path:
        return self.root / "stop"

    @property
    def wake_file(self) -> Path:
        return self.root / "wake"

    def wake(self) -> bool:
        """Tell rank 0 to read the directory now; whether it was told. Never blocks and never
        raises: without a pool reading the pipe (none running, another host, a filesystem
        without named pipes) rank 0 finds the request at its next look."""
        try:
            fd = os.open(self.wake_file, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no pipe, or no reader (ENXIO)
            return False
        try:
            os.write(fd, b"!")
            return True
        except OSError:  # the pipe is full: rank 0 is already due to look
            return False
        finally:
            os.close(fd)

    def open_wake(self) -> int | None:
        """Rank 0: a fresh ``wake`` pipe, opened for reading (reads block until a byte
        comes); None where named pipes are not available (then only the periodic look)."""
        try:
            self.wake_file.unlink(missing_ok=True)
            os.mkfifo(self.wake_file)
            # read-write: the pipe always has a writer, so reads block instead of seeing EOF
            return os.open(self.wake_file, os.O_RDWR)
        except (OSError, AttributeError):
            return None

    def folder(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def job_dir(self, job: int) -> Path:
        return self.root / "jobs" / str(job)

    def status_file(self, job: int) -> Path:
        return self.job_dir(job) / "status.json"

    def job_ids(self) -> list[int]:
        """Every job this pool directory has seen, in submission order."""
        jobs = self.root / "jobs"
        if not jobs.is_dir():
            return []
        return sorted(int(p.name) for p in jobs.iterdir() if p.name.isdigit())

    def new_job(self, spec: dict[str, Any]) -> int:
        """Allocate the next job id (safe against concurrent submitters: the folder is
        created exclusively), write its spec and status, and queue it for rank 0."""
        jobs = self.folder("jobs")
        job = max(self.job_ids(), default=0) + 1
        while True:
            try:
                (jobs / str(job)).mkdir()
                break
            except FileExistsError:
                job += 1
        write_json(self.job_dir(job) / "spec.json", spec)
        write_json(self.status_file(job), {"job": job, "state": "queued"})
        marker = self.folder("queue") / str(job)
        marker.touch()
        self.wake()
        return job

    def mark_lost(self) -> list[int]:
        """Mark ``lost``, for good, the jobs that a pool that died in this directory left
        unfinished, queued ones included, and return their ids: a new pool here must neither
        run them nor list them as running, and ``canary cancel`` and waiting submitters must
        see that they ended. For a pool starting, before it says it is ready."""
        queued = set(self.take("queue"))
        lost = []
        for job in self.job_ids():
            st = read_json(self.status_file(job))
            if st is not None and st.get("state") in (*FINAL_STATES, "lost"):
                continue
            lost.append(job)
            write_json(self.status_file(job), dict(
                st or {"job": job}, state="lost", error="the pool ended before the job"
                + (" started" if job in queued else "") + f" (see {self.log_file})"))
        return lost

    def take(self, folder: str) -> list[int]:
        """The job ids marked in ``folder`` (``queue``, ``cancel``), markers removed."""
        path = self.root / folder
        try:
            names = os.listdir(path)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if name.isdigit():
                try:
                    os.unlink(path / name)
                except FileNotFoundError:
                    continue
                out.append(int(name))
        return sorted(out)
