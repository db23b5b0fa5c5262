"""Canary: iterative dataflow programs whose workers schedule their own tasks.

Declare a :class:`Program` (datasets, compute stages, scatter-gathers, signals, loops) on every
rank, then call :func:`run` under ``mpiexec`` (or ``canary run -n N``), or :func:`run_local` to
run all roles in one process.
"""

from canary.errors import (
    CanaryError,
    DeclarationError,
    JobAborted,
    PartitionMismatchError,
    ProgramMismatchError,
    TaskError,
)
from canary.harness import JobResult, run_local
from canary.program import Dataset, Program, ReportEvent, Stage
from canary.runtime import run

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
