"""What every app driver does the same way: output flags, progress on rank 0, input errors.

An app declares its program on every rank; these helpers keep the rank-0 side (progress lines,
``--metrics`` JSON lines, ``--trace``), the checks of output paths before any work, and the
handling of unreadable input identical across apps.

Every JSON line an app writes (``--metrics`` rows, the summary) goes through
:func:`json_line`: strict JSON, with a value that is not a finite number written as ``null``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import IO, Any, TypeVar

import numpy as np

from canary.errors import CanaryError

T = TypeVar("T")


def add_output_args(ap: argparse.ArgumentParser) -> None:
    """Add ``--metrics PATH``, ``--print-every K`` and ``--trace PATH`` to an app's parser."""
    ap.add_argument("--metrics", metavar="PATH",
                    help="write one JSON line per iteration to this file (rank 0)")
    ap.add_argument("--print-every", type=_count, default=1, metavar="K",
                    help="print a progress line every K iterations (0: none; with no "
                         "--metrics either, the loop then sends rank 0 no report)")
    ap.add_argument("--trace", metavar="PATH", default=None,
                    help="write a Chrome trace-event JSON of the run (open it in Perfetto)")


def _count(text: str) -> int:
    """An integer >= 0 (argparse type): a negative one would silently mean 'never'."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: no progress lines), got {value}")
    return value


def reports_each_iteration(args: argparse.Namespace) -> bool:
    """Whether an app's loop should report its progress to rank 0 every iteration: only when
    someone reads it, on the console (``--print-every`` above 0) or in ``--metrics``. Each
    report is a message to the controller and work there, every iteration; ``--print-every 0``
    without ``--metrics`` leaves the controller with only its fixed-rate traffic. Depends on the
    arguments alone, so every rank declares the same program."""
    return args.print_every > 0 or bool(args.metrics)


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, np.generic):  # np.float32, np.int64, np.bool_: their Python value
        value = value.item()
    elif isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def json_line(row: Mapping[str, Any]) -> str:
    """``row`` as one line of strict JSON (RFC 8259), which every JSON parser reads.

    Python's ``json`` would write NaN and infinities as the bare words ``NaN`` and
    ``Infinity``, which strict parsers reject; here a float that is not finite, at any depth
    of nested dicts and lists, is written as ``null`` (the value is unknown or meaningless:
    a change before any iteration, an overflow). numpy scalars and arrays are written as
    their Python values and lists. Raises TypeError for a value JSON cannot hold.
    """
    return json.dumps(_finite_or_null(row), allow_nan=False)


def out_of_range(*checks: tuple[str, Any, bool, str]) -> str | None:
    """``FLAG must be RULE, got VALUE`` for the first of ``checks`` — (flag, value, whether
    it is in range, the rule in words) — whose value is not in range; None if all are."""
    for flag, value, ok, rule in checks:
        if not ok:
            return f"{flag} must be {rule}, got {value}"
    return None


def save_npz(path: str, **arrays: Any) -> None:
    """Write ``arrays`` as an ``.npz`` archive (``numpy.load`` reads it) at exactly ``path``:
    ``numpy.savez(path)`` would append ``.npz`` to a name without it, so ``--output model``
    (or a directory's name) would write beside what was asked for."""
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def output_problem(path: str) -> str | None:
    """Why a file cannot be written at ``path``, or None if it can (as far as can be known
    without writing). Creates, opens and truncates nothing.

    Checked: the directory exists, is a directory and is writable; an existing ``path`` is not
    a directory and is writable.
    """
    folder = os.path.dirname(path)
    shown = folder or f"{os.getcwd()} (the current directory)"
    folder = folder or "."
    if not os.path.exists(folder):
        return f"directory {shown} does not exist"
    if not os.path.isdir(folder):
        return f"{shown} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"directory {shown} is not writable"
    if os.path.isdir(path):
        return "is a directory (expected a file name)"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "the file exists and is not writable"
    return None


def unwritable_output(outputs: Mapping[str, str | None],
                      inputs: Mapping[str, str | None] | None = None) -> str | None:
    """``FLAG PATH: why`` for the first of ``outputs`` (flag -> path, None: not asked for) that
    cannot be written (see :func:`output_problem`), or None when all can.

    Also refused, as nothing can be right after them: an empty path (the option given, the
    output silently dropped), two outputs at one file (the last written would replace the
    others), and an output at one of ``inputs`` (flag -> path: the files the job reads), which
    opening it for writing would destroy before the job read it."""
    seen: dict[str, str] = {}
    read = {os.path.realpath(p): flag for flag, p in (inputs or {}).items() if p}
    for flag, path in outputs.items():
        if path is None:
            continue
        if not path:
            return f"{flag} '': an empty file name; give a path or leave the option out"
        why = output_problem(path)
        if why is not None:
            return f"{flag} {path}: {why}"
        real = os.path.realpath(path)
        if real in read:
            return (f"{flag} {path} is the {read[real]} file: writing there would destroy the "
                    "input; name another file")
        if real in seen:
            return (f"{seen[real]} and {flag} both name {path}: one would replace the other; "
                    "give each its own file")
        seen[real] = flag
    return None


def check_outputs(app: str, outputs: Mapping[str, str | None], comm: Any,
                  inputs: Mapping[str, str | None] | None = None) -> bool:
    """Before any work: can rank 0 write every output it was asked for?

    A result that cannot be saved must be found out before the run, not after hours of it.
    Rank 0 (which writes the outputs) checks ``outputs`` (flag -> path) against ``inputs``
    (see :func:`unwritable_output`) and tells every rank of ``comm`` (an mpi4py communicator), so
    all return the same; when a path is bad, rank 0 prints ``APP: error: FLAG PATH: why`` to
    stderr and every rank returns False (the caller exits with status 2). Collective: every
    rank must call it.
    """
    problem = unwritable_output(outputs, inputs) if comm.Get_rank() == 0 else None
    if comm.Get_size() > 1:
        problem = comm.bcast(problem, root=0)
    if problem is None:
        return True
    if comm.Get_rank() == 0:
        print(f"{app}: error: {problem}", file=sys.stderr, flush=True)
    return False


class Progress:
    """Per-iteration progress on rank 0: a JSON line per iteration to ``metrics_path`` and a
    console line every ``print_every`` iterations. Does nothing where ``enabled`` is false
    (the workers), so report callbacks can be declared on every rank."""

    def __init__(self, metrics_path: str | None, print_every: int, enabled: bool) -> None:
        self.print_every = print_every
        self.enabled = enabled
        self._file: IO[str] | None = None
        if enabled and metrics_path:
            self._file = open(metrics_path, "w")  # noqa: SIM115 - closed in close()

    def record(self, row: dict[str, Any], line: str) -> None:
        """Write ``row`` (must hold ``iteration``) as a :func:`json_line` and print ``line``
        when it is time to."""
        if not self.enabled:
            return
        if self._file is not None:
            self._file.write(json_line(row) + "\n")
            self._file.flush()
        if self.print_every and row["iteration"] % self.print_every == 0:
            print(line, flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


RESUME_ENV = "CANARY_RESUME"  # the snapshot folder a job resumes from (set by canary run)


def planned_workers(comm: Any) -> int:
    """The number of workers to declare the program for: the job's (ranks minus the
    controller), or, when the job resumes from a snapshot (``canary run --resume``), the number
    the snapshot was taken on. Partition counts that default to a multiple of the workers then
    stay those the snapshot holds, so a job resumes on any number of workers.

    Raises :class:`canary.snapshot.SnapshotError` if the snapshot's manifest cannot be read."""
    folder = os.environ.get(RESUME_ENV, "").strip()
    if folder:
        from canary.snapshot import read_manifest

        return read_manifest(folder).workers
    return max(int(comm.Get_size()) - 1, 1)


def declare(app: str, build: Callable[..., T], *args: Any, is_root: bool = True) -> T | None:
    """Call ``build(*args)``; if the input cannot be read, say why once and return None.

    Every rank declares the program, so every rank meets the same missing file or malformed
    header at once; only rank 0 prints ``APP: error: ...`` (the message names the file and
    line). The caller exits with status 2. Other exceptions propagate.
    """
    try:
        return build(*args)
    except (OSError, CanaryError) as exc:
        if is_root:
            print(f"{app}: error: {exc}", file=sys.stderr, flush=True)
        return None


def write_outputs(app: str, writers: Mapping[str, tuple[str, Callable[[str], None]]]) -> int:
    """Write the run's end-of-run outputs: ``writers`` maps a flag to (path, write(path)).

    Returns 0, or 1 after printing ``APP: error: FLAG PATH: could not write it (reason)`` for
    each that failed (the directory went away during the run, the disk filled): the caller
    still prints its summary, so a long run's result is not lost with its file.
    """
    status = 0
    for flag, (path, write) in writers.items():
        try:
            write(path)
        except OSError as exc:
            print(f"{app}: error: {flag} {path}: could not write it ({exc.strerror or exc})",
                  file=sys.stderr, flush=True)
            status = 1
    return status
