"""Loading numba's array functions without the BLAS probe's cost.

The first time a process compiles or loads a kernel, numba imports its NumPy implementations
(``numba.np.arraymath``). That module probes for BLAS at import by importing
``scipy.linalg.cython_blas``, which loads all of ``scipy.linalg``: 0.3 s of every worker rank's
start-up wherever SciPy is installed, for kernels that mostly call no BLAS at all. A kernel that
does (``np.dot``, ``@``, ``np.linalg``) makes numba import it at compile time anyway
(``numba.np.linalg.ensure_blas``), so the probe's import buys nothing up front.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

_PROBED = "scipy.linalg"


class _DeferScipyLinalg(importlib.abc.MetaPathFinder):
    """Refuses ``scipy.linalg`` and its submodules, for the length of one import."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> None:
        if name == _PROBED or name.startswith(_PROBED + "."):
            raise ImportError(f"{name} is imported when a kernel needs it (canary.numba_load)")
        return None


def blas_available() -> bool:
    """Whether ``scipy.linalg.cython_blas`` can be imported, found without importing
    ``scipy.linalg`` (which is what costs)."""
    try:
        import scipy
    except ImportError:
        return False
    folders = [f"{p}/linalg" for p in getattr(scipy, "__path__", [])]
    return importlib.machinery.PathFinder.find_spec("scipy.linalg.cython_blas",
                                                    folders) is not None


def load_array_functions() -> None:
    """Import ``numba.np.arraymath`` so that its BLAS probe does not import ``scipy.linalg``,
    then give the probe's flag (``_HAVE_BLAS``) the value the probe would have found.

    Guarantees: afterwards numba behaves as if it had imported the module itself (the flag
    picks BLAS or a plain loop for ``np.correlate``/``np.convolve`` of floats), and
    ``scipy.linalg`` is imported only when a kernel calls BLAS. Does nothing when either module
    is already imported, and when numba is not: a process that has not imported numba by the
    time its tasks start has no numba kernel to load (and importing numba costs 0.3 s). Raises
    nothing of its own; an ImportError of numba's passes through.
    """
    if ("numba" not in sys.modules or "numba.np.arraymath" in sys.modules
            or _PROBED in sys.modules):
        return
    finder = _DeferScipyLinalg()
    sys.meta_path.insert(0, finder)
    try:
        import numba.np.arraymath as arraymath
    finally:
        sys.meta_path.remove(finder)
    if hasattr(arraymath, "_HAVE_BLAS"):
        arraymath._HAVE_BLAS = blas_available()
