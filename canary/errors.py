"""The exceptions canary raises. Every message says which dataset, stage, rank or file is at fault."""

from __future__ import annotations

from canary.sites import call_site


class CanaryError(Exception):
    """Base class of every error canary raises on purpose."""


class DeclarationError(CanaryError, ValueError):
    """The driver declared an impossible program (raised while declaring, before anything runs)."""


class PartitionMismatchError(DeclarationError):
    """A compute stage names datasets whose partition counts differ."""


class TaskError(CanaryError):
    """A task (kernel, loader, signal or gather function) raised; the message names rank, stage and partition."""


class GatherError(CanaryError, ValueError):
    """A built-in gather (``"sum"``, ``"concat"``) got pieces it cannot combine: their shapes
    differ where the gather needs them alike."""


class JobAborted(CanaryError):
    """Another rank failed and the controller aborted the job."""


class ProgramMismatchError(JobAborted):
    """Two ranks declared different statement lists (a nondeterministic driver): the controller
    aborts the job, naming the first statement that differs."""


class JobStopped(CanaryError):
    """An in-process run stopped on purpose before its end (``run_local(stop_after=...)``), as a
    crash would stop it: the tests of resuming from snapshots use it."""


def user_error_line(name: str, exc: BaseException) -> str | None:
    """The one line, ``NAME: error: MESSAGE``, that a driver's own mistake escaping it is
    reported as: a :class:`CanaryError` raised while declaring or reading input. A
    :class:`DeclarationError` that canary raised is said as ``NAME: error: FILE:LINE: MESSAGE``,
    FILE:LINE being the driver statement that called canary (see
    :func:`canary.sites.call_site`): its message names the stage but not the line, and no
    traceback is shown. Other messages already say where (an input file and line). None for
    anything else, a failed job (:class:`TaskError`, :class:`JobAborted`) included: its
    traceback is kept."""
    if not isinstance(exc, CanaryError) or isinstance(exc, (TaskError, JobAborted)):
        return None
    site = call_site(exc) if isinstance(exc, DeclarationError) else ""
    return f"{name}: error: {site}: {exc}" if site else f"{name}: error: {exc}"
