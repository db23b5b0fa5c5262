"""Canary: iterative dataflow programs whose workers schedule their own tasks.

Declare a :class:`Program` (datasets, compute stages, scatter-gathers, signals, loops) on every
rank, then call :func:`run` under ``mpiexec`` (or ``canary run -n N``), or :func:`run_local` to
run all roles in one process.
"""

from canary import _checkout  # noqa: F401 - first: the roles' import names
from canary.errors import (
    CanaryError,
    DeclarationError,
    JobAborted,
    PartitionMismatchError,
    ProgramMismatchError,
    TaskError,
)
from canary.local_runner import run_local
from canary.mpi_runner import run
from canary.program import Dataset, Program, ReportEvent, Stage
from canary.result import JobResult

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
