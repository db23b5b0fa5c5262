"""``canary.worker`` and ``canary.controller`` in a source checkout, as they are once installed.

An install maps the repository's top-level ``worker/`` and ``controller/`` folders to these
names (setuptools ``package_dir``). Imported first by ``canary/__init__.py``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys


class _CheckoutRoles(importlib.abc.MetaPathFinder):
    """Finds ``canary.worker`` and ``canary.controller`` in a source checkout.

    An install maps the repository's top-level ``worker/`` and ``controller/`` folders to these
    names (setuptools ``package_dir``). When canary is imported straight from a checkout (it is
    on ``sys.path``, as when the benchmarks compare two checkouts side by side), the two roles
    must come from that same checkout, not from whichever one is installed.
    """

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in ("canary.worker", "canary.controller"):
            return None
        folder = os.path.join(self.root, fullname.rpartition(".")[2])
        return importlib.util.spec_from_file_location(
            fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])


def _find_roles_in_checkout() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if os.path.isdir(os.path.join(here, "worker")):  # installed: the roles are subpackages
        return
    if all(os.path.isfile(os.path.join(root, *parts)) for parts in
           (("pyproject.toml",), ("worker", "__init__.py"), ("controller", "__init__.py"))):
        sys.meta_path.insert(0, _CheckoutRoles(root))


_find_roles_in_checkout()
