"""Running an app file as a script under its package module name."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def run_main(file: str, argv: list[str] | None = None) -> int:
    """Import the driver at ``file`` as ``<package>.<module>`` and return its ``main(argv)``.

    Why: numba's on-disk cache (``cache=True``) records the module a kernel was compiled in.
    Run as a script the module is ``__main__``; imported by tests or benchmarks it is
    ``apps.<name>``. Mixing the two makes numba load a cache entry whose module cannot be
    imported, and the job dies. Running every driver under its package name keeps one name.
    The package root (the folder above the file's package) goes on ``sys.path``. A file that is
    not inside a package (no ``__init__.py`` beside it) runs as it is. A non-zero result
    on one rank of a multi-rank job aborts the whole job (see :func:`_end_job_on_failure`).
    """
    path = Path(file).resolve()
    if not (path.parent / "__init__.py").exists():
        main_mod = sys.modules["__main__"]
        return _end_job_on_failure(int(main_mod.main(argv)))
    root = str(path.parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module(f"{path.parent.name}.{path.stem}")
    return _end_job_on_failure(int(module.main(argv)))


def _end_job_on_failure(code: int) -> int:
    """A driver that failed on this rank (bad input, say) ends the whole MPI job.

    Under ``python -m mpi4py`` a non-zero exit already aborts every rank; launched with a plain
    ``mpiexec python driver.py`` the other ranks would wait for this one forever.
    """
    if code != 0 and "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            import time

            sys.stderr.flush()
            sys.stdout.flush()
            time.sleep(1.0)  # let the launcher forward what this rank printed
            MPI.COMM_WORLD.Abort(code)
    return code
