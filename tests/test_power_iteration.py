"""The documentation's example driver, against numpy's eigensolver."""

from __future__ import annotations

import numpy as np
import pytest

from apps import power_iteration as pi
from tests.conftest import mpirun


def reference(parts: int) -> float:
    A = np.vstack([pi.rows(i, parts) for i in range(parts)])
    return float(np.linalg.eigvalsh(A.T @ A)[-1])


@pytest.mark.parametrize("ranks", [2, 3])
def test_power_iteration_over_mpi_matches_numpy(ranks: int) -> None:
    r = mpirun(ranks, "apps/power_iteration.py", "--partitions", "6")
    assert r.returncode == 0, r.stderr
    lam = float(r.stdout.split("A^T A: ")[1].split()[0])
    assert lam == pytest.approx(reference(6), rel=1e-9)


def test_script_run_after_import_shares_the_numba_cache() -> None:
    """Compiling a kernel through `import apps.power_iteration` writes numba's cache under that
    module name; the script run must still work (it used to die loading that cache entry)."""
    pi.local_product(np.ones((3, 30)), np.ones(30))
    r = mpirun(2, "apps/power_iteration.py", "--partitions", "2")
    assert r.returncode == 0, r.stderr
    assert "largest eigenvalue" in r.stdout
