"""Logistic regression against scikit-learn on standardised breast cancer, in-process."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from sklearn.datasets import dump_svmlight_file, load_breast_cancer
from sklearn.linear_model import LogisticRegression

import canary
from apps import logistic_regression as lr

REG = 1e-2


@pytest.fixture(scope="module")
def cancer(tmp_path_factory: pytest.TempPathFactory) -> dict:
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    d = tmp_path_factory.mktemp("cancer")
    np.savez(d / "cancer.npz", X=X, y=y.astype(float))
    with h5py.File(d / "cancer.h5", "w") as f:
        f["X"], f["y"] = X, y.astype(float)
    dump_svmlight_file(X, np.where(y > 0, 1, -1), str(d / "cancer.svm"), zero_based=False)
    ref = LogisticRegression(C=1.0 / (len(y) * REG), tol=1e-14, max_iter=100_000).fit(X, y)
    coef, b = ref.coef_.ravel(), float(ref.intercept_[0])
    z = X @ coef + b
    obj = float(np.mean(np.logaddexp(0, z) - y * z) + 0.5 * REG * coef @ coef)
    return {"dir": d, "X": X, "y": y, "coef": coef, "intercept": b, "objective": obj}


def solve(path: Path, workers: int, partitions: int, seed: int = 0,
          max_iter: int = 5000) -> np.ndarray:
    args = lr.parse_args(["--input", str(path), "--reg", str(REG), "--tol", "1e-10",
                          "--max-iter", str(max_iter), "--partitions", str(partitions)])
    prog, _ = lr.build(args, workers)
    res = canary.run_local(prog, workers=workers, seed=seed)
    return res.value("result")


def check_optimum(r: np.ndarray, ref: dict) -> None:
    d = ref["X"].shape[1]
    assert abs(r[1] - ref["objective"]) <= 1e-8 * abs(ref["objective"])
    coef = np.append(r[3:3 + d], r[3 + d])
    want = np.append(ref["coef"], ref["intercept"])
    assert np.linalg.norm(coef - want) <= 1e-5 * np.linalg.norm(want)


@pytest.mark.parametrize("fmt", ["npz", "h5", "svm"])
def test_reaches_sklearn_optimum_from_every_format(cancer: dict, fmt: str) -> None:
    check_optimum(solve(cancer["dir"] / f"cancer.{fmt}", workers=2, partitions=4), cancer)


@pytest.mark.parametrize("workers,per_worker", [(1, 1), (2, 3), (3, 16)])
def test_answer_does_not_depend_on_workers_or_partitions(cancer: dict, workers: int,
                                                         per_worker: int) -> None:
    r = solve(cancer["dir"] / "cancer.npz", workers, workers * per_worker)
    check_optimum(r, cancer)


def test_same_answer_under_fifty_interleavings(cancer: dict) -> None:
    """Seeds change message interleaving and task order; sums are in partition order, so the
    result is bit-identical. A sum taken in another order shows in the last bits of the first
    iterations' gradients, and later iterations carry it on: 25 iterations show it as well as a
    run to convergence would."""
    first = solve(cancer["dir"] / "cancer.npz", 3, 6, seed=0, max_iter=25)
    assert first[0] == 25  # not converged: every run does all 25
    for seed in range(1, 50):
        assert np.array_equal(solve(cancer["dir"] / "cancer.npz", 3, 6, seed=seed, max_iter=25),
                              first)


def test_progress_reports_each_iteration(cancer: dict) -> None:
    args = lr.parse_args(["--input", str(cancer["dir"] / "cancer.npz"), "--reg", str(REG),
                          "--max-iter", "7", "--partitions", "4"])
    seen: list[canary.ReportEvent] = []
    args.on_progress = seen.append
    prog, _ = lr.build(args, 2)
    canary.run_local(prog, workers=2)
    assert [int(e.value[0]) for e in seen] == list(range(1, 8))
    objs = [e.value[1] for e in seen]
    assert objs[-1] < objs[0]
    assert all(b > a for a, b in zip([e.tasks for e in seen], [e.tasks for e in seen][1:]))


def test_default_is_one_partition_per_worker() -> None:
    # more would cost each iteration a task and two moves per partition for no balance gained
    # (apps/logistic_regression.py, PARTITIONS_PER_WORKER); --partitions still chooses
    for workers in (1, 2, 3):
        _, shape = lr.build(lr.parse_args(["--generate", "60,3"]), workers)
        assert shape["partitions"] == workers
    _, shape = lr.build(lr.parse_args(["--generate", "60,3", "--partitions", "7"]), 2)
    assert shape["partitions"] == 7


def test_arguments_parse_to_the_problem_they_describe() -> None:
    args = lr.parse_args(["--generate", "10,3", "--partitions", "11", "--reg", "0",
                          "--max-iter", "0"])
    assert (args.input, args.n, args.d, args.partitions) == (None, 10, 3, 11)
    assert (args.reg, args.tol, args.max_iter, args.seed) == (0.0, 1e-6, 0, 0)
    assert (args.output, args.metrics, args.trace, args.print_every) == (None, None, None, 1)
    default = lr.parse_args([])  # no input: the generated 20,000 x 20 problem
    assert (default.generate, default.n, default.d) == ("20000,20", 20000, 20)
    given = lr.parse_args(["--input", "data.svm", "--features", "7"])
    assert (given.input, given.generate, given.features) == ("data.svm", None, 7)


def test_bad_arguments_are_refused() -> None:
    for argv in (["--generate", "10"], ["--generate", "0,3"], ["--tol", "-1"],
                 ["--max-iter", "-1"], ["--reg", "-1"], ["--partitions", "0"],
                 ["--input", "a.svm", "--generate", "10,3"]):
        with pytest.raises(SystemExit):
            lr.parse_args(argv)
    args = lr.parse_args(["--generate", "10,3", "--partitions", "11"])
    with pytest.raises(canary.DeclarationError,
                       match=r"^--partitions 11 exceeds the 10 data rows of --generate 10,3$"):
        lr.build(args, 2)
    # the default asks for no more partitions than there are rows: 3 rows, 4 workers
    _, shape = lr.build(lr.parse_args(["--generate", "3,2"]), 4)
    assert shape["partitions"] == 3


def test_zero_iterations_return_the_start_with_its_true_objective_and_gradient(
        cancer: dict) -> None:
    """--max-iter 0 returns w = 0; its objective is ln 2 (every margin is 0), not 0, and its
    gradient norm is the gradient's at 0, not infinity: the same two numbers that the first
    iteration reports for the point it evaluates, which is also 0."""
    path = cancer["dir"] / "cancer.npz"
    got = {}
    for iters in (0, 1):
        args = lr.parse_args(["--input", str(path), "--reg", str(REG), "--max-iter", str(iters),
                              "--partitions", "3"])
        prog, _ = lr.build(args, 2)
        got[iters] = canary.run_local(prog, workers=2).value("result")
    r = got[0]
    X, y = cancer["X"], cancer["y"]
    grad = np.append(X.T @ (0.5 - y), np.sum(0.5 - y)) / len(y)
    assert r[0] == 0 and not r[3:].any()
    assert r[1] == pytest.approx(np.log(2.0), rel=1e-13)
    assert r[2] == pytest.approx(np.linalg.norm(grad), rel=1e-12)
    assert got[1][0] == 1 and np.array_equal(got[1][1:3], r[1:3])


def test_tol_0_runs_exactly_max_iter_iterations(cancer: dict) -> None:
    # it was refused ("--tol must be > 0"), though k-means and power iteration take 0, and a
    # fixed number of iterations is what a timing wants
    args = lr.parse_args(["--input", str(cancer["dir"] / "cancer.npz"), "--reg", str(REG),
                          "--tol", "0", "--max-iter", "40", "--partitions", "3"])
    prog, _ = lr.build(args, 2)
    r = canary.run_local(prog, workers=2).value("result")
    assert r[0] == 40 and r[2] > 0  # not converged, as no gradient is below 0


@pytest.mark.parametrize("scale", [1e-3, 1.0, 40.0])
def test_gradient_kernel_matches_numpy_across_loss_blocks(scale: float) -> None:
    # 1,303 rows span two full loss blocks, a partial one and 3 rows past the last group of
    # four. Near z = 0 every (1 + e^-|z|) factor is ~2, so a block product that were never
    # reset would overflow past 1,024 rows; at scale 40 most factors are 1 and the sigmoid
    # takes both sign branches at saturation.
    rng = np.random.default_rng(7)
    n, d = 1_303, 6
    X = rng.standard_normal((n, d))
    y = (rng.random(n) < 0.5).astype(float)
    w = rng.standard_normal(d + 1) * scale
    z = X @ w[:d] + w[d]
    r = 1.0 / (1.0 + np.exp(-z)) - y
    want = np.concatenate([X.T @ r, [r.sum(), np.sum(np.logaddexp(0.0, z) - y * z), n]])
    got = lr.gradient_kernel(X, y, w)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * n)


def test_features_whose_squares_overflow_are_refused_not_fitted(tmp_path: Path) -> None:
    # the step 1/L was 0: 1000 iterations left w at 0, exit 0, "converged false"
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3)) * 1e160
    np.savez(tmp_path / "huge.npz", X=X, y=(X[:, 0] > 0).astype(float))
    prog, _ = lr.build(lr.parse_args(["--input", str(tmp_path / "huge.npz")]), 2)
    with pytest.raises(canary.TaskError, match=r"stage 'init_kernel'.*\n(.*\n)*ValueError: the "
                                               r"features' sum of squares overflows float64"):
        canary.run_local(prog, workers=2)
