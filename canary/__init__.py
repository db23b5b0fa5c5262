"""Canary: iterative dataflow programs whose workers schedule their own tasks.

Declare a :class:`Program` (datasets, compute stages, scatter-gathers, signals, loops) on every
rank, then call :func:`run` under ``mpiexec`` (or ``canary run -n N``), or :func:`run_local` to
run all roles in one process.

The names below are imported on first use: ``canary run`` and the other commands import the
package without the engine (numpy, the roles, the runners), which saves their start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from canary import _checkout  # noqa: F401 - first: the roles' import names
from canary.errors import (
    CanaryError,
    DeclarationError,
    JobAborted,
    PartitionMismatchError,
    ProgramMismatchError,
    TaskError,
)

if TYPE_CHECKING:
    from canary.local_runner import run_local
    from canary.mpi_runner import run
    from canary.program import Dataset, Program, ReportEvent, Stage
    from canary.result import JobResult

# name: the module that defines it
_LAZY = {"run_local": "canary.local_runner", "run": "canary.mpi_runner",
         "Dataset": "canary.program", "Program": "canary.program",
         "ReportEvent": "canary.program", "Stage": "canary.program",
         "JobResult": "canary.result"}

__all__ = [
    "CanaryError",
    "Dataset",
    "DeclarationError",
    "JobAborted",
    "JobResult",
    "PartitionMismatchError",
    "Program",
    "ProgramMismatchError",
    "ReportEvent",
    "Stage",
    "TaskError",
    "run",
    "run_local",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'canary' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
