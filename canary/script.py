"""Running an app file as a script under its package module name."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import FrameType
from typing import NoReturn

from canary.errors import CanaryError, JobAborted, TaskError, user_error_line
from canary.ranks import abort_job, active_mpi, end_rank, leave


def run_main(file: str, argv: list[str] | None = None) -> int:
    """Import the driver at ``file`` as ``<package>.<module>`` and return its ``main(argv)``.

    Why: numba's on-disk cache (``cache=True``) records the module a kernel was compiled in.
    Run as a script the module is ``__main__``; imported by tests or benchmarks it is
    ``apps.<name>``. Mixing the two makes numba load a cache entry whose module cannot be
    imported, and the job dies. Running every driver under its package name keeps one name.
    The package root (the folder above the file's package) goes on ``sys.path``. A file that is
    not inside a package (no ``__init__.py`` beside it) runs as it is.

    A :class:`~canary.CanaryError` escaping ``main`` (a ``DeclarationError``, an
    ``InputFormatError``: the user's mistake, and the message already says where) is printed
    as one line, ``NAME: error: MESSAGE``, and the result is 2. Every rank prints it:
    ``canary run`` shows a line that every rank printed once, and an error seen on one rank
    only (a file that one host cannot read) must not be lost. A job that failed in this
    process (``TaskError`` or ``JobAborted`` from ``run_local``) is said as ``canary run`` says
    it, ``canary: job aborted: MESSAGE`` (the message holds the kernel's traceback), and the
    result is 1. A traceback is kept for everything else. A non-zero result on one rank of a
    multi-rank job aborts the whole job unless every rank has ended (see
    :func:`_end_job_on_failure`).
    """
    path = Path(file).resolve()
    if not (path.parent / "__init__.py").exists():
        main_mod = sys.modules["__main__"]
        return _end_job_on_failure(_call_main(main_mod, path.stem, argv))
    root = str(path.parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module(f"{path.parent.name}.{path.stem}")
    return _end_job_on_failure(_call_main(module, path.stem, argv))


def end_script(code: int) -> NoReturn:
    """End a driver script with exit status ``code`` (what :func:`run_main` returned); call it
    at the script's top level.

    0 goes through :func:`canary.ranks.leave`, which skips the interpreter's teardown (0.4 s on
    every rank once numba has loaded a kernel), when the script is the process's program: run
    by ``python``, ``python -m mpi4py`` or ``canary run``, with no profiler or tracer set.
    Run by anything else that may go on after the script (``python -m cProfile`` prints its
    figures then, IPython's ``%run`` returns to the prompt) and for any other code, the script
    ends through ``sys.exit`` as usual.
    """
    caller = sys._getframe(1)
    if code == 0 and sys.getprofile() is None and sys.gettrace() is None \
            and _only_launchers_below(caller):
        leave()
    sys.exit(code)


# what may run the script's top level: Python's runpy, mpi4py's `python -m mpi4py`, and
# canary run's canary.ranks (whose main records the rank's end, as leave() does)
_LAUNCHERS = frozenset({"runpy", "mpi4py.run", "mpi4py.__main__", "canary.ranks"})


def _only_launchers_below(frame: FrameType) -> bool:
    """Whether every frame below ``frame`` (the script's top level) is a launcher's."""
    below = frame.f_back
    while below is not None:
        spec = below.f_globals.get("__spec__")
        name = spec.name if spec is not None else below.f_globals.get("__name__")
        if name not in _LAUNCHERS:
            return False
        below = below.f_back
    return True


def _call_main(module: object, name: str, argv: list[str] | None) -> int:
    try:
        return int(module.main(argv))  # type: ignore[attr-defined]
    except (TaskError, JobAborted) as exc:
        # The job failed, in this process (one rank: run_local). Its message names the task
        # and holds the kernel's own traceback; canary's frames around it would only bury it.
        # (Over MPI the controller says this line and ends the job before the driver sees it.)
        print(f"canary: job aborted: {exc}", file=sys.stderr, flush=True)
        return 1
    except CanaryError as exc:
        line = user_error_line(name, exc)
        if line is None:
            raise
        print(line, file=sys.stderr, flush=True)
        return 2


def _end_job_on_failure(code: int) -> int:
    """A driver that failed on this rank (bad input, say) ends the whole MPI job.

    Under ``python -m mpi4py`` a non-zero exit already aborts every rank; launched with a plain
    ``mpiexec python driver.py`` the other ranks would wait for this one forever. Launched by
    ``canary run``, the rank records its end first, and the job is not aborted when every rank
    has ended (a driver that rejects its input fails on every rank alike): no rank is killed
    before it has said why, and MPI adds no abort messages.
    """
    mpi = active_mpi() if code != 0 else None
    if mpi is not None and mpi.COMM_WORLD.Get_size() > 1 and not end_rank(code):
        abort_job(mpi.COMM_WORLD, code, linger=1.0)
    return code
