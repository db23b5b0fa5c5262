"""Every command that README.md and docs/ show running an app still parses, and the README's
own commands run as shown (after `pip install -e .` they are the first thing a user types)."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.app_helpers import strict_loads
from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "docs" / "apps").glob("*.md"))]
APP = re.compile(r"^apps/(\w+)\.py$")
LAUNCHERS = (["canary", "run"], ["mpiexec"], ["python"])


def shell_lines(text: str) -> list[str]:
    """The command lines of a markdown text's fenced code blocks: prompts (``$ ``) and
    comments dropped, backslash continuations joined, ``a && b`` split in two."""
    lines: list[str] = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            line = re.sub(r"\s+#\s.*$", "", line)
            lines += [part.strip() for part in line.split("&&") if part.strip()]
    return lines


def app_commands() -> list[tuple[str, str, str, list[str]]]:
    """(document, command, app, app arguments) for every documented command running an app."""
    found = []
    for doc in DOCS:
        for line in shell_lines(doc.read_text()):
            if "apps/" not in line or not line.startswith(("canary ", "mpiexec ", "python ")):
                continue  # code, output, or a command that runs no app
            words = shlex.split(line)
            where = [i for i, w in enumerate(words) if APP.match(w)]
            if where and any(words[:len(lw)] == lw for lw in LAUNCHERS):
                app = APP.match(words[where[0]]).group(1)  # type: ignore[union-attr]
                found.append((doc.relative_to(ROOT).as_posix(), line, app,
                              words[where[0] + 1:]))
    return found


COMMANDS = app_commands()


def test_the_docs_show_commands_for_every_app() -> None:
    assert {app for _, _, app, _ in COMMANDS} == {"logistic_regression", "kmeans", "pagerank",
                                                   "power_iteration"}
    assert any(doc == "README.md" for doc, *_ in COMMANDS)


@pytest.mark.parametrize(("doc", "command", "app", "argv"), COMMANDS,
                         ids=[f"{d}:{c[:60]}" for d, c, _, _ in COMMANDS])
def test_documented_command_parses(doc: str, command: str, app: str, argv: list[str]) -> None:
    module = importlib.import_module(f"apps.{app}")
    module.parse_args(argv)  # argparse exits (SystemExit) on a flag the app no longer has


def readme_runs() -> list[str]:
    """README commands that run an app on generated data (no input file to bring)."""
    return [c for d, c, _, argv in COMMANDS
            if d == "README.md" and not {"--input", "--init", "-f"} & set(c.split())]


@pytest.mark.parametrize("command", readme_runs())
def test_readme_command_runs_as_shown(command: str) -> None:
    words = shlex.split(command)
    if words[0] == "python":  # the one-process path: a driver run with plain python
        cmd = [sys.executable, *words[1:]]
    else:
        assert words[:2] == ["canary", "run"]
        # `canary` on PATH may belong to another checkout: run this one's CLI the same way
        cmd = [sys.executable, "-m", "canary.cli", "run", "--timeout", "150", *words[2:]]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    if "power_iteration" in command:
        assert last.startswith("largest eigenvalue of A^T A: ")
    else:
        summary = strict_loads(last)
        workers = int(words[words.index("-n") + 1]) if "-n" in words else 1
        assert summary["converged"] and summary["workers"] == workers
