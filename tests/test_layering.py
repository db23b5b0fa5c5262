"""Imports go one way: core <- roles <- runners <- public API, with no cycle anywhere.

Every ``import`` statement of the installed package is read (those inside functions too), so a
lazy import cannot hide a dependency that goes the wrong way.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

from tests.conftest import ROOT

# Where each import name lives in the repository (setuptools' package_dir in pyproject.toml).
FOLDERS = {"canary": ROOT / "canary", "canary.worker": ROOT / "worker",
           "canary.controller": ROOT / "controller"}
CORE, ROLES, RUNNERS, PUBLIC = 0, 1, 2, 3


def modules() -> dict[str, Path]:
    """Every module of the package by its import name."""
    found: dict[str, Path] = {}
    for prefix, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([prefix, *parts])
            if name.split(".")[1:2] in (["worker"], ["controller"]) and prefix == "canary":
                continue  # not part of canary/ itself
            found[name] = path
    return found


def layer(name: str) -> int:
    if name.startswith(("canary.worker", "canary.controller")):
        return ROLES
    # the pool's runners: its in-process runner and its ranks' MPI shell (canary.pool.*)
    if name in ("canary.local_runner", "canary.mpi_runner", "canary.virtual_runner",
                "canary.pool.local", "canary.pool.host", "canary.pool.transport"):
        return RUNNERS
    if name in ("canary", "canary.cli", "canary.script"):
        return PUBLIC
    return CORE


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The package's modules that ``path`` (module ``name``) imports."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            # a package's own __init__ is imported before any of its modules anyway
            if t and t != name and not name.startswith(t + "."):
                out.add(t)
    return out


def import_graph() -> nx.DiGraph:
    mods = modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for t in imports(path, name, set(mods)):
            g.add_edge(name, t)
    return g


def test_every_role_module_is_found_under_its_install_name() -> None:
    mods = modules()
    assert "canary.worker.state" in mods and "canary.controller.state" in mods
    assert "canary.worker.execute" in mods and "canary.local_runner" in mods


def test_imports_go_one_way_from_core_to_roles_to_runners_to_the_public_api() -> None:
    g = import_graph()
    wrong = [(a, b) for a, b in g.edges if layer(b) > layer(a)]
    assert not wrong, f"imports against the layering: {wrong}"
    across = [(a, b) for a, b in g.edges if layer(a) == ROLES and layer(b) == ROLES
              and a.split(".")[1] != b.split(".")[1]]
    assert not across, f"a role imports the other role: {across}"


def test_the_import_graph_has_no_cycle() -> None:
    g = import_graph()
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles: {cycles}"


def test_the_install_adds_one_import_name_and_every_package_under_it() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, folders = config["packages"], config["package-dir"]
    assert {p.split(".")[0] for p in packages} == {"canary"}
    assert {k: ROOT / v for k, v in folders.items()} == FOLDERS
    # every folder of modules below a mapped folder is a listed package (none left out)
    listed = set(packages)
    for prefix, folder in FOLDERS.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            name = ".".join([prefix, *rel])
            if prefix == "canary" and rel[:1] in (("worker",), ("controller",)):
                continue
            assert name in listed, f"{init.parent} holds modules but {name} is not in packages"


def test_mpi_is_imported_in_the_few_modules_that_talk_to_it() -> None:
    importers = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "mpi4py" for n in names):
                importers.add(name)
    assert importers == {"canary.mpi_transport", "canary.mpi_runner", "canary.ranks",
                         "canary.worker.runtime", "canary.controller.runtime",
                         # a pool's ranks (its job-tagged transport speaks through MpiTransport)
                         "canary.pool.host",
                         "canary.doctor"}  # doctor: its ranks time MPI links themselves


def test_the_commands_start_without_the_engine() -> None:
    # `canary run` and the other commands import canary's package, whose public names load on
    # first use: the launcher must not pay for the runners, the roles and their imports
    code = ("import sys, canary.cli; "
            "print(sorted(m for m in sys.modules if m.startswith(('canary.local_runner', "
            "'canary.mpi_runner', 'canary.worker', 'canary.controller', 'numba'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    # and each public name still comes from its module
    import canary
    import canary.local_runner
    import canary.program

    assert canary.run_local is canary.local_runner.run_local
    assert canary.Program is canary.program.Program and "Program" in dir(canary)
