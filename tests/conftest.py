"""Shared test helpers: the repo root on sys.path (apps/ is not installed) and mpiexec runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MPI_TIMEOUT = 90  # seconds: MPIEXEC_TIMEOUT; the subprocess gets a little more


def mpirun(ranks: int, script: str, *args: str, timeout: int = MPI_TIMEOUT,
           cwd: str | os.PathLike[str] | None = None,
           env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``mpiexec -n ranks python -m mpi4py script args`` with a hard timeout; never hangs.
    ``env_extra`` is added to the ranks' environment."""
    from canary.cli import find_mpiexec, mpiexec_env

    env = mpiexec_env(timeout, str(ROOT))
    env.update(env_extra or {})
    cmd = [find_mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", script, *args]
    return subprocess.run(cmd, env=env, cwd=cwd or ROOT, capture_output=True, text=True,
                          timeout=timeout + 30)


def declared_at(marker: str, file: str | os.PathLike[str] | None = None,
                cwd: str | os.PathLike[str] | None = None) -> str:
    """``file:line`` of the one line of ``file`` (default: the caller's source file) that ends
    with ``marker`` (a trailing comment such as ``# declared: check``; the call that names it
    does not end with it), said as canary says the driver line that declared a stage: the
    file relative to the working directory when under it, else absolute. ``cwd`` is that
    directory (default: this process's; give a launched job's own). Raises AssertionError
    unless exactly one line ends with it. Tests name the expected line this way so that it
    follows the statement when lines above it move."""
    if file is None:
        file = sys._getframe(1).f_code.co_filename
    path = os.path.abspath(file)
    lines = [k for k, text in enumerate(Path(path).read_text().splitlines(), 1)
             if text.rstrip().endswith(marker)]
    assert len(lines) == 1, f"{marker!r} ends lines {lines} of {path}, expected one"
    here = os.path.abspath(cwd if cwd is not None else os.getcwd())
    shown = os.path.relpath(path, here) if path.startswith(here + os.sep) else path
    return f"{shown}:{lines[0]}"


def shm_segments() -> set[str]:
    """The MPICH shared-memory files in ``/dev/shm`` now, by path."""
    from canary.mpich_shm import PREFIX, SHM_FOLDER

    return {os.path.join(SHM_FOLDER, n) for n in os.listdir(SHM_FOLDER) if n.startswith(PREFIX)}


def shm_left_behind(before: set[str]) -> set[str]:
    """The MPICH files made since ``before`` (a :func:`shm_segments`) that no process maps:
    what a job left behind. A job running beside the test (another test run, a user's job)
    maps its own file, so it is not counted."""
    from canary.mpich_shm import _mapped_anywhere

    new = shm_segments() - before
    return new - _mapped_anywhere() if new else set()
