"""The documentation's example driver, against numpy's eigensolver."""

from __future__ import annotations

import numpy as np
import pytest

from apps import power_iteration as pi
from tests.app_helpers import ONE_RANK_NOTE, run_python
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


def test_plain_python_runs_in_process_with_one_worker() -> None:
    """`python apps/power_iteration.py`, as docs/programming.md shows it: no mpiexec, one MPI
    rank, so canary.run runs the controller and one worker in this process."""
    r = run_python("apps/power_iteration.py", "--partitions", "3")
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(ONE_RANK_NOTE)
    lam = float(r.stdout.split("A^T A: ")[1].split()[0])
    assert lam == pytest.approx(reference(3), rel=1e-9)


def test_the_matrix_is_the_same_whatever_the_partition_count() -> None:
    # it was drawn per partition, so --partitions changed the answer
    whole = np.vstack([pi.rows(i, 1) for i in range(1)])
    assert whole.shape == (4000, 30)
    for parts in (3, 6, 7, 4000):
        assert np.array_equal(np.vstack([pi.rows(i, parts) for i in range(parts)]), whole)


def test_local_product_is_the_partition_share_of_ata_v() -> None:
    a = pi.rows(1, 3)
    v = np.random.default_rng(2).standard_normal(a.shape[1])
    np.testing.assert_allclose(pi.local_product(a, v), a.T @ (a @ v), rtol=1e-12)


def test_bad_arguments_are_refused_in_one_line() -> None:
    r = run_python("apps/power_iteration.py", "--partitions", "0")
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        "power_iteration.py: error: --partitions must be >= 1 and --tol a finite number >= 0, "
        "got 0 and 1e-10")
    # a nan or inf tolerance ended the loop at once: "largest eigenvalue 0", exit 0
    for tol in ("nan", "inf", "-1"):
        with pytest.raises(SystemExit) as e:
            pi.parse_args(["--tol", tol])
        assert e.value.code == 2
