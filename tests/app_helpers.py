"""Helpers for tests that run the apps as a user would: strict JSON and one-rank script runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.conftest import ROOT

# The first line a one-rank run prints to stderr (canary.run), before its own output.
ONE_RANK_NOTE = "canary: one MPI rank, so running in-process with one worker"


def strict_loads(line: str) -> Any:
    """json.loads that, like a strict (RFC 8259) parser, refuses NaN and Infinity."""
    def refuse(word: str) -> None:
        raise ValueError(f"not strict JSON: {word}")
    return json.loads(line, parse_constant=refuse)


def run_python(*args: str, prelude: str | None = None, timeout: int = 240,
               cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with no mpiexec (one MPI rank), importing canary from this checkout.

    ``prelude``, if given, is Python run first in the same interpreter (``-c``), and then
    ``ARGS[0]`` runs as ``python ARGS`` would run it: as ``__main__`` with ``sys.argv = ARGS``.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, *args]
    if prelude is not None:
        launch = ("import runpy, sys; sys.argv = sys.argv[1:]; "
                  "sys.path[0] = __import__('os').path.dirname(__import__('os').path.abspath("
                  "sys.argv[0])); runpy.run_path(sys.argv[0], run_name='__main__')")
        cmd = [sys.executable, "-c", f"{prelude}\n{launch}", *args]
    return subprocess.run(cmd, env=env, cwd=cwd or ROOT, capture_output=True, text=True,
                          timeout=timeout)
