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
