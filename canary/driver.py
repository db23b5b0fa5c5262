"""What every app driver does the same way: output flags, progress on rank 0, input errors.

An app declares its program on every rank; these helpers keep the rank-0 side (progress lines,
``--metrics`` JSON lines, ``--trace``) and the handling of unreadable input identical across
apps.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import IO, Any, TypeVar

from canary.errors import CanaryError

T = TypeVar("T")


def add_output_args(ap: argparse.ArgumentParser) -> None:
    """Add ``--metrics PATH``, ``--print-every K`` and ``--trace PATH`` to an app's parser."""
    ap.add_argument("--metrics", metavar="PATH",
                    help="write one JSON line per iteration to this file (rank 0)")
    ap.add_argument("--print-every", type=int, default=1, metavar="K",
                    help="print a progress line every K iterations (0: none)")
    ap.add_argument("--trace", metavar="PATH", default=None,
                    help="write a Chrome trace-event JSON of the run (open it in Perfetto)")


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
        """Write ``row`` (must hold ``iteration``) and print ``line`` when it is time to."""
        if not self.enabled:
            return
        if self._file is not None:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        if self.print_every and row["iteration"] % self.print_every == 0:
            print(line, flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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
