"""k-means app: scikit-learn's Lloyd iterations reproduced, on any number of workers."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import mpirun
from sklearn.cluster import KMeans
from sklearn.datasets import dump_svmlight_file, load_digits

import apps.kmeans as km
import canary
from canary.generate import blobs
from canary.io import InputFormatError
from tests.app_helpers import strict_loads


def run_km(argv: list[str], workers: int = 2, seed: int = 0, labels: bool = True,
           progress: list | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    args = km.parse_args(argv)
    args.want_labels = labels
    if progress is not None:
        args.on_progress = lambda ev: progress.append(ev.value.copy())
    prog, _ = km.build(args, workers)
    res = canary.run_local(prog, workers=workers, seed=seed)
    lab = res.concat("labels") if labels else None
    return res.value("result"), res.value("centers"), lab


def sk_fit(X: np.ndarray, C0: np.ndarray, tol: float = 0.0, max_iter: int = 300) -> KMeans:
    return KMeans(C0.shape[0], init=C0, n_init=1, algorithm="lloyd", tol=tol,
                  max_iter=max_iter).fit(X)


def assert_matches(sk: KMeans, X: np.ndarray, r: np.ndarray, c: np.ndarray, lab: np.ndarray) -> None:
    scale = max(1.0, float(np.abs(X).max()))
    np.testing.assert_array_equal(lab, sk.labels_)
    assert np.abs(c - sk.cluster_centers_).max() <= 1e-10 * scale
    assert int(r[0]) == sk.n_iter_
    assert abs(r[1] - sk.inertia_) <= 1e-10 * max(1.0, sk.inertia_)


def perturbed_rows(X: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k data rows nudged off the integer grid: integer data and integer centres tie exactly,
    and scikit-learn breaks exact ties by its BLAS rounding (after centring the data)."""
    rng = np.random.default_rng(seed)
    return X[rng.choice(len(X), k, replace=False)] + 1e-3 * rng.standard_normal((k, X.shape[1]))


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, Path, np.ndarray]:
    d = tmp_path_factory.mktemp("digits")
    X = load_digits().data.astype(np.float64)
    C0 = perturbed_rows(X, 10, 0)
    np.save(d / "X.npy", X)
    np.save(d / "C0.npy", C0)
    return d / "X.npy", X, d / "C0.npy", C0


def test_digits_matches_sklearn(digits: tuple) -> None:
    path, X, c0path, C0 = digits
    r, c, lab = run_km(["--input", str(path), "--init", str(c0path), "--tol", "0",
                        "--partitions", "5"])
    assert_matches(sk_fit(X, C0), X, r, c, lab)


@pytest.mark.parametrize("tol", [0.0, 1e-4])
def test_blobs_match_sklearn(tmp_path: Path, tol: float) -> None:
    X, _ = blobs(3000, 4, 5, seed=3)  # what --generate 3000,4,5 --seed 3 makes
    C0 = perturbed_rows(X, 6, 1)
    np.save(tmp_path / "C0.npy", C0)
    r, c, lab = run_km(["--generate", "3000,4,5", "--seed", "3", "--k", "6",
                        "--init", str(tmp_path / "C0.npy"), "--tol", str(tol),
                        "--partitions", "7"], workers=3)
    sk = sk_fit(X, C0, tol=tol)
    assert_matches(sk, X, r, c, lab)


def test_empty_cluster_relocated_as_sklearn(tmp_path: Path) -> None:
    X, _ = blobs(600, 2, 3, seed=5)
    C0 = perturbed_rows(X, 4, 2)
    C0[2] = [1e3, 1e3]  # nobody's nearest: empty in the first iteration
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "C0.npy", C0)
    prog: list[np.ndarray] = []
    r, c, lab = run_km(["--input", str(tmp_path / "X.npy"), "--init", str(tmp_path / "C0.npy"),
                        "--tol", "0", "--partitions", "3"], progress=prog)
    assert prog[0][km.S_EMPTY] == 1
    assert_matches(sk_fit(X, C0), X, r, c, lab)


def test_independent_of_workers_partitions_and_interleaving() -> None:
    ref = None
    for workers, parts, seed in [(1, 1, 0), (1, 4, 1), (2, 4, 2), (3, 6, 3), (3, 9, 4)]:
        r, c, lab = run_km(["--generate", "4000,3,6", "--seed", "7", "--partitions", str(parts),
                            "--tol", "0"], workers=workers, seed=seed)
        if ref is None:
            ref = (r, c, lab)
            continue
        np.testing.assert_array_equal(lab, ref[2])
        assert r[0] == ref[0][0]
        np.testing.assert_allclose(c, ref[1], rtol=0, atol=1e-12)
        assert abs(r[1] - ref[0][1]) <= 1e-10 * ref[0][1]


def test_kmeanspp_picks_distinct_data_points() -> None:
    X, _ = blobs(2000, 3, 5, seed=11)
    _, c, _ = run_km(["--generate", "2000,3,5", "--seed", "11", "--partitions", "6",
                      "--max-iter", "0"], labels=False)
    rows = {tuple(x) for x in X}
    assert all(tuple(x) in rows for x in c)
    assert len({tuple(x) for x in c}) == 5
    # D^2 sampling on well-separated blobs lands near a local optimum as good as sklearn's
    r, _, _ = run_km(["--generate", "2000,3,5", "--seed", "11", "--partitions", "6"],
                     labels=False)
    best = KMeans(5, n_init=10, random_state=0).fit(X).inertia_
    assert r[1] <= 1.5 * best


def test_formats_give_the_same_answer(tmp_path: Path, digits: tuple) -> None:
    _, X, c0path, C0 = digits
    X = X[:500]
    np.savez(tmp_path / "d.npz", X=X)
    with h5py.File(tmp_path / "d.h5", "w") as h:
        h["X"] = X
    dump_svmlight_file(X, np.zeros(len(X)), str(tmp_path / "d.svm"), zero_based=False)
    sk = sk_fit(X, C0)
    for name in ["d.npz", "d.h5", "d.svm"]:
        argv = ["--input", str(tmp_path / name), "--init", str(c0path), "--tol", "0",
                "--partitions", "3"]
        if name == "d.svm":
            argv += ["--features", "64"]
        r, c, lab = run_km(argv)
        assert_matches(sk, X, r, c, lab)


def test_bool_initial_centres_give_the_answer_of_the_same_centres_as_floats(
        tmp_path: Path) -> None:
    # bool data was accepted and bool centres (rows of it, say) refused. (Not against
    # scikit-learn: 0/1 points tie on distances, which each breaks its own way.)
    X = np.random.default_rng(3).random((300, 6)) < 0.4
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "C0.npy", X[[0, 50, 100, 150]])
    np.save(tmp_path / "C0f.npy", X[[0, 50, 100, 150]].astype(float))
    runs = [run_km(["--input", str(tmp_path / "X.npy"), "--init", str(tmp_path / name),
                    "--tol", "0"]) for name in ("C0.npy", "C0f.npy")]
    for got, want in zip(runs[0], runs[1]):
        np.testing.assert_array_equal(got, want)
    assert runs[0][0][0] >= 2  # iterations: the centres moved


def test_k_larger_than_points(tmp_path: Path) -> None:
    np.save(tmp_path / "small.npy", np.arange(10.0).reshape(5, 2))
    args = km.parse_args(["--input", str(tmp_path / "small.npy"), "--k", "6"])
    with pytest.raises(InputFormatError, match=r"small\.npy: k=6 is larger than the number of "
                                                r"points \(5\)"):
        km.build(args, 1)


def test_nan_input_names_file_and_row(tmp_path: Path) -> None:
    X = np.arange(40.0).reshape(20, 2)
    X[13, 1] = np.nan
    np.save(tmp_path / "nan.npy", X)
    args = km.parse_args(["--input", str(tmp_path / "nan.npy"), "--k", "2", "--partitions", "4"])
    prog, _ = km.build(args, 2)
    with pytest.raises(canary.TaskError, match=r"nan\.npy: row 13 \(0-based\).*NaN"):
        canary.run_local(prog, workers=2)


def test_bad_svmlight_line_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.svm"
    f.write_text("1 1:0.5 2:1.0\n0 1:0.25 2:x\n1 1:1 2:2\n")
    args = km.parse_args(["--input", str(f), "--k", "2", "--partitions", "1"])
    prog, _ = km.build(args, 1)
    with pytest.raises(canary.TaskError, match=r"bad\.svm:2"):
        canary.run_local(prog, workers=1)


def test_bad_init_shape(tmp_path: Path, digits: tuple) -> None:
    path = digits[0]
    np.save(tmp_path / "c.npy", np.zeros((3, 5)))
    args = km.parse_args(["--input", str(path), "--init", str(tmp_path / "c.npy")])
    with pytest.raises(InputFormatError, match=r"c\.npy: initial centres have shape \(3, 5\)"):
        km.build(args, 1)


@pytest.mark.parametrize("ranks", [2, 3])
def test_mpiexec(tmp_path: Path, digits: tuple, ranks: int) -> None:
    path, X, c0path, C0 = digits
    out = tmp_path / "out.npz"
    met = tmp_path / "m.jsonl"
    cp = mpirun(ranks, "apps/kmeans.py", "--input", str(path), "--init", str(c0path),
                "--tol", "0", "--partitions", "5", "--output", str(out), "--metrics", str(met),
                timeout=60)
    assert cp.returncode == 0, cp.stderr
    summary = strict_loads(cp.stdout.strip().splitlines()[-1])
    sk = sk_fit(X, C0)
    assert summary["iterations"] == sk.n_iter_ and summary["workers"] == ranks - 1
    assert summary["converged"] and summary["tasks"] > 0
    assert 0 < summary["controller_cpu_percent"] < 100  # only logistic regression's said it
    z = np.load(out)
    assert_matches(sk, X, np.array([summary["iterations"], float(z["inertia"])]), z["centers"],
                   z["labels"])
    rows = [strict_loads(line) for line in met.read_text().splitlines()]
    assert [row["iteration"] for row in rows] == list(range(1, sk.n_iter_ + 1))


def test_cli_error_exit_code(tmp_path: Path) -> None:
    np.save(tmp_path / "small.npy", np.arange(10.0).reshape(5, 2))
    cp = mpirun(2, "apps/kmeans.py", "--input", str(tmp_path / "small.npy"), "--k", "9",
                timeout=60)
    assert cp.returncode == 2
    assert "small.npy: k=9 is larger than the number of points (5)" in cp.stderr


def test_points_with_no_features_are_refused_in_one_line(tmp_path: Path) -> None:
    # they ended in a ZeroDivisionError traceback from the tolerance kernel
    from tests.app_helpers import run_python

    np.save(tmp_path / "none.npy", np.empty((20, 0)))
    r = run_python("apps/kmeans.py", "--input", str(tmp_path / "none.npy"), "--k", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.endswith(f"{tmp_path / 'none.npy'}: the points have no features "
                             "(0 columns); k-means needs at least one\n")


def test_data_whose_squares_overflow_is_refused_or_said_not_clustered(tmp_path: Path) -> None:
    from tests.app_helpers import run_python

    # the tolerance was inf: no iteration, every point in cluster 0, exit 0
    np.save(tmp_path / "huge.npy", np.random.default_rng(0).normal(40, 3, (40, 2)) * 1e160)
    prog, _ = km.build(km.parse_args(["--input", str(tmp_path / "huge.npy"), "--k", "3"]), 2)
    with pytest.raises(canary.TaskError, match=r"stage 'tolerance_kernel'.*\n(.*\n)*ValueError: "
                                               r"the features' squared deviations overflow"):
        canary.run_local(prog, workers=2)
    # deviations that fit, distances to the centre that do not: the answer is said to be wrong
    np.save(tmp_path / "far.npy", np.vstack([np.full(100, 1e153), np.full(100, -1e153)]))
    r = run_python("apps/kmeans.py", "--input", str(tmp_path / "far.npy"), "--k", "1")
    assert r.returncode == 1 and r.stderr.splitlines()[-1].startswith(
        "kmeans.py: error: the inertia overflowed float64"), r.stderr


def test_nearest_center_breaks_ties_to_the_lower_index_and_keeps_nan() -> None:
    centers = np.array([[9.0, 9.0], [2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    X = np.array([[1.0, 0.0], [0.0, 0.0], [5.0, 0.0], [np.nan, 0.0]])
    want = [(1, 1.0), (2, 0.0), (1, 9.0)]  # row 0 ties centres 1, 2, 3; row 1 ties 2 and 3
    for i, (j, dist) in enumerate(want):
        assert km.nearest_center(X, i, centers) == (j, dist)
    j, dist = km.nearest_center(X, 3, centers)
    assert j == 0 and np.isnan(dist)  # a NaN row is visible in the inertia, not silently 0


def test_default_partitions_fit_a_tiny_input_and_a_given_count_is_checked(tmp_path: Path) -> None:
    np.save(tmp_path / "three.npy", np.array([[0.0, 0.0], [1.0, 0.0], [5.0, 5.0]]))
    args = km.parse_args(["--input", str(tmp_path / "three.npy"), "--k", "2"])
    prog, shape = km.build(args, 2)  # 4 per worker would be 8 partitions of 3 points
    assert shape["partitions"] == 3
    assert canary.run_local(prog, workers=2).value("result")[1] == pytest.approx(0.5)
    args = km.parse_args(["--input", str(tmp_path / "three.npy"), "--k", "2", "--partitions", "4"])
    with pytest.raises(canary.DeclarationError,
                       match=r"^--partitions 4 exceeds the 3 data points of .*three\.npy$"):
        km.build(args, 2)
