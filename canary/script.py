"""Running an app file as a script under its package module name."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def run_main(file: str, argv: list[str] | None = None) -> int:
    """Import the driver at ``file`` as ``<package>.<module>`` and return its ``main(argv)``.

    Why: numba's on-disk cache (``cache=True``) records the module a kernel was compiled in.
    Run as a script the module is ``__main__``; imported by tests or benchmarks it is
    ``apps.<name>``. Mixing the two makes numba load a cache entry whose module cannot be
    imported, and the job dies. Running every driver under its package name keeps one name.
    The package root (the folder above the file's package) goes on ``sys.path``. A file that is
    not inside a package (no ``__init__.py`` beside it) runs as it is.
    """
    path = Path(file).resolve()
    if not (path.parent / "__init__.py").exists():
        main_mod = sys.modules["__main__"]
        return int(main_mod.main(argv))
    root = str(path.parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module(f"{path.parent.name}.{path.stem}")
    return int(module.main(argv))
