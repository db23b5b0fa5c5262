"""Workers load numba's array functions without importing ``scipy.linalg`` (canary.numba_load),
and numba then behaves as if it had run its own BLAS probe."""

from __future__ import annotations

import json
import re
import sys

import pytest

from canary.numba_load import blas_available
from tests.app_helpers import run_python
from tests.conftest import mpirun

# What numba's own probe finds, in a process that loads numba either way.
PROBE = """
import json, sys
{load}
import numba.np.arraymath as arraymath
print(json.dumps({{"blas": arraymath._HAVE_BLAS, "linalg": "scipy.linalg" in sys.modules}}))
"""
OURS = """
from canary.numba_load import load_array_functions
load_array_functions()
assert "numba" not in sys.modules  # a process without numba kernels is left without numba
import numba
load_array_functions()
"""


def _probe(load: str) -> dict[str, object]:
    r = run_python("-c", PROBE.format(load=load), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(json.loads(r.stdout.splitlines()[-1]))


def test_numba_behaves_as_after_its_own_blas_probe() -> None:
    # The flag picks BLAS or a plain loop for a float np.correlate/np.convolve: the same flag,
    # the same answers bit for bit.
    assert _probe("") == {"blas": True, "linalg": True}
    assert _probe(OURS) == {"blas": True, "linalg": False}


def test_without_scipy_there_is_no_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    assert blas_available()
    monkeypatch.setitem(sys.modules, "scipy", None)  # as if scipy were not installed
    assert not blas_available()


def test_a_job_imports_scipy_linalg_only_once_a_kernel_calls_blas() -> None:
    code = """
import sys
import numba
import numpy as np
from canary.script import run_main
assert run_main("apps/logistic_regression.py", ["--generate", "300,4", "--max-iter", "3"]) == 0
print("after the job", "scipy.linalg" in sys.modules)

@numba.njit
def dot(a, b):
    return a @ b

a = np.arange(12.0).reshape(3, 4)
assert np.array_equal(dot(a, a.T), a @ a.T)
print("after a BLAS kernel", "scipy.linalg" in sys.modules)
"""
    r = run_python("-c", code, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "after the job False" in r.stdout and "after a BLAS kernel True" in r.stdout, r.stdout


def test_worker_ranks_run_kernels_without_scipy_linalg() -> None:
    code = ("import sys; from mpi4py import MPI; from canary.script import run_main; "
            "assert run_main('apps/kmeans.py', ['--generate', '400,3,3', '--max-iter', '3']) == 0; "
            "print(f'rank {MPI.COMM_WORLD.rank} linalg {\"scipy.linalg\" in sys.modules}', "
            "flush=True)")  # the newline may come after another rank's output
    r = mpirun(3, "-c", code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(re.findall(r"rank (\d) linalg (True|False)", r.stdout)) == [
        (str(k), "False") for k in range(3)], r.stdout
