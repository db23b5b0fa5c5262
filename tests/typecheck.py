"""Run mypy over canary as it installs: ``python tests/typecheck.py`` (``tests/test_lint.py`` too).

mypy names modules after folders and knows nothing of setuptools' ``package_dir``, so run from
the repository root it would see ``worker/`` and ``controller/`` as top-level packages instead of
``canary.worker`` and ``canary.controller``. This builds the installed layout from symbolic
links in a temporary folder (``canary/`` with ``worker`` and ``controller`` inside it, and
``apps/``), runs mypy there with the settings of ``pyproject.toml``, and prints its report with
every path given as the file in the repository. Exits with mypy's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# where each folder of the installed layout comes from, relative to the repository root
LAYOUT = {"canary": "canary", "canary/worker": "worker", "canary/controller": "controller",
          "apps": "apps"}


def stage(dest: Path) -> None:
    """Lay the packages out under ``dest`` as an install would, out of symbolic links."""
    for target, source in LAYOUT.items():
        folder = dest / target
        folder.mkdir(parents=True, exist_ok=True)
        for entry in (ROOT / source).iterdir():
            if entry.name == "__pycache__" or (folder / entry.name).exists():
                continue
            if entry.is_dir() and f"{target}/{entry.name}" in LAYOUT:
                continue
            (folder / entry.name).symlink_to(entry)


def to_repo_paths(report: str) -> str:
    """mypy's report with staged paths (``canary/worker/state.py``) as repository paths."""
    lines = []
    for line in report.splitlines():
        for target, source in sorted(LAYOUT.items(), key=lambda kv: -len(kv[0])):
            if line.startswith(target + "/"):
                line = source + line[len(target):]
                break
        lines.append(line)
    return "\n".join(lines)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="canary-mypy-") as tmp:
        stage(Path(tmp))
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               "--cache-dir", str(ROOT / ".mypy_cache"), "-p", "canary", "-p", "apps"]
        env = dict(os.environ, MYPYPATH=tmp)
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    print(to_repo_paths(proc.stdout + proc.stderr))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
