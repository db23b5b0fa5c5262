"""The apps run as a user runs them: outputs checked before any work, input errors in one line,
strict JSON summaries, and the zero-iteration case reporting true values."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests.app_helpers import ONE_RANK_NOTE, run_python, strict_loads
from tests.conftest import ROOT, declared_at, mpirun

SMALL = {  # a few seconds each with the numba cache warm
    "logistic_regression": ["--generate", "300,4"],
    "kmeans": ["--generate", "300,3,3"],
    "pagerank": ["--generate", "100,500"],
}
OUTPUT_FILE = {"logistic_regression": "model.npz", "kmeans": "km.npz", "pagerank": "ranks.txt"}


@pytest.mark.parametrize(("app", "flag"), [("logistic_regression", "--output"),
                                           ("kmeans", "--metrics"), ("pagerank", "--trace"),
                                           ("pagerank", "--output")])
def test_an_output_that_cannot_be_written_stops_the_app_before_any_work(
        tmp_path: Path, app: str, flag: str) -> None:
    bad = tmp_path / "nope" / "out.npz"
    kept = tmp_path / "kept.jsonl"
    kept.write_text("an earlier run's metrics\n")
    extra = ["--metrics", str(kept)] if flag != "--metrics" else []
    r = run_python(f"apps/{app}.py", *SMALL[app], flag, str(bad), *extra)
    assert r.returncode == 2
    # one line, naming the app, the flag and the path; no traceback, no iteration, no job
    assert r.stderr == f"{app}.py: error: {flag} {bad}: directory {bad.parent} does not exist\n"
    assert r.stdout == ""
    assert kept.read_text() == "an earlier run's metrics\n"  # nothing truncated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl"]


def test_an_output_at_the_input_file_is_refused_and_the_input_kept(tmp_path: Path) -> None:
    # opening --metrics for writing truncated the input before the workers read it
    X = np.random.default_rng(3).normal(size=(40, 3))
    data = tmp_path / "data.npz"
    np.savez(data, X=X, y=(X[:, 0] > 0).astype(np.float64))
    before = data.read_bytes()
    r = run_python("apps/logistic_regression.py", "--input", str(data), "--metrics", str(data))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"logistic_regression.py: error: --metrics {data} is the --input file: "
                        "writing there would destroy the input; name another file\n")
    assert data.read_bytes() == before


def test_a_job_that_fails_in_one_process_is_said_as_canary_run_says_it(tmp_path: Path) -> None:
    # in one process the failure reached the driver as TaskError: 20 lines of canary's
    # frames around the two that say what is wrong
    X = np.random.default_rng(4).normal(size=(30, 3))
    data = tmp_path / "labels12.npz"
    np.savez(data, X=X, y=np.where(X[:, 0] > 0, 1.0, 2.0))
    r = run_python("apps/logistic_regression.py", "--input", str(data))
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stdout == ""
    at = declared_at('name="load_rows")', ROOT / "apps/logistic_regression.py", ROOT)
    assert r.stderr.splitlines()[1:] == [
        f"canary: job aborted: rank 1 (worker 0): stage 'load_rows' (id 0, declared at {at}), "
        "load task on partition 0 failed:",
        f"{data}: row {int(np.argmax(X[:, 0] <= 0))} (0-based) of y: label 2.0 is not a binary "
        "label (expected 0/1 or -1/+1)"]


def test_the_npz_output_is_written_at_exactly_the_path_given(tmp_path: Path) -> None:
    # numpy.savez appends .npz to a name without it: "km" became km.npz, and a directory's
    # name passed the check and got a file beside it
    folder = tmp_path / "models.d"
    folder.mkdir()
    r = run_python("apps/logistic_regression.py", *SMALL["logistic_regression"], "--output",
                   str(folder))
    assert r.returncode == 2
    assert r.stderr == f"logistic_regression.py: error: --output {folder}: is a directory " \
        "(expected a file name)\n"
    r = run_python("apps/kmeans.py", *SMALL["kmeans"], "--output", str(tmp_path / "km"))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["km", "models.d"]
    assert set(np.load(tmp_path / "km")) == {"centers", "labels", "inertia"}


def test_every_rank_stops_on_an_unwritable_output(tmp_path: Path) -> None:
    bad = tmp_path / "file_not_dir"
    bad.write_text("")
    r = mpirun(3, "apps/kmeans.py", *SMALL["kmeans"], "--output", str(bad / "km.npz"), timeout=60)
    assert r.returncode == 2
    want = f"kmeans.py: error: --output {bad / 'km.npz'}: {bad} is not a directory"
    assert r.stderr.count(want) == 1 and "Traceback" not in r.stderr
    assert "iter" not in r.stdout


GARBAGE = np.random.default_rng(11).integers(0, 256, 4000, dtype=np.uint8).tobytes()


@pytest.mark.parametrize(("app", "flag", "name", "says"), [
    ("logistic_regression", "--input", "data.svm", "not svmlight text"),
    ("kmeans", "--init", "c0.npy", "not a numeric .npy array"),
    ("pagerank", "--input", "graph.txt", "not an edge-list text file"),
    ("kmeans", "--input", "X.npy", "not a numeric .npy array"),
])
def test_a_garbage_input_is_refused_in_one_line_before_the_run(tmp_path: Path, app: str,
                                                               flag: str, name: str,
                                                               says: str) -> None:
    f = tmp_path / name
    f.write_bytes(GARBAGE)
    data = [] if flag == "--input" else SMALL[app]
    r = run_python(f"apps/{app}.py", *data, flag, str(f))
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{app}.py: error: {f}: {says}")
    assert "allow_pickle" not in r.stderr and r.stdout == ""


def objective_and_gradient_at_zero(n: int, d: int) -> tuple[float, float]:
    from canary.generate import logistic_data

    X, y = logistic_data(n, d, 0)
    r = 0.5 - y  # sigmoid(0) - y
    grad = np.append(X.T @ r, r.sum()) / n
    return math.log(2.0), float(np.linalg.norm(grad))


@pytest.mark.parametrize("app", ["logistic_regression", "kmeans", "pagerank"])
def test_zero_iterations_report_true_values_as_strict_json(tmp_path: Path, app: str) -> None:
    out = tmp_path / OUTPUT_FILE[app]
    met = tmp_path / "m.jsonl"
    r = run_python(f"apps/{app}.py", *SMALL[app], "--max-iter", "0", "--output", str(out),
                   "--metrics", str(met))
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(ONE_RANK_NOTE)
    summary = strict_loads(r.stdout.splitlines()[-1])
    assert summary["iterations"] == 0 and summary["converged"] is False
    assert met.read_text() == "" and out.exists()
    if app == "logistic_regression":
        obj, gnorm = objective_and_gradient_at_zero(300, 4)
        assert summary["objective"] == pytest.approx(obj, rel=1e-13)
        assert summary["gradient_norm"] == pytest.approx(gnorm, rel=1e-12)
        assert not np.load(out)["coef"].any()
    elif app == "kmeans":
        assert summary["labels_changed"] is None and summary["center_shift"] is None
        z = np.load(out)
        assert summary["inertia"] == pytest.approx(float(z["inertia"]), rel=0)
    else:
        assert summary["l1_change"] is None and summary["rank_sum"] == pytest.approx(1.0)
        ranks = [float(line.split()[1]) for line in out.read_text().splitlines()]
        assert ranks == [1.0 / summary["vertices"]] * summary["vertices"]


def test_iterations_write_strict_json_metrics_and_summary(tmp_path: Path) -> None:
    met = tmp_path / "m.jsonl"
    r = run_python("apps/logistic_regression.py", *SMALL["logistic_regression"], "--max-iter",
                   "3", "--metrics", str(met), "--print-every", "0")
    assert r.returncode == 0, r.stderr
    rows = [strict_loads(line) for line in met.read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [1, 2, 3]
    assert strict_loads(r.stdout.splitlines()[-1])["iterations"] == 3


@pytest.mark.parametrize("app", sorted(SMALL))
def test_the_loop_reports_to_rank_0_only_when_the_progress_is_shown(tmp_path: Path,
                                                                   app: str) -> None:
    # a report inside the loop is a message to the controller every iteration: with nothing
    # printed and no --metrics, the controller hears only the final reports
    import importlib

    import canary

    mod = importlib.import_module(f"apps.{app}")
    received = {}
    for shown in (["--print-every", "0"], ["--print-every", "5"],
                  ["--print-every", "0", "--metrics", str(tmp_path / "m.jsonl")]):
        tol = "0" if app == "kmeans" else "1e-300"
        args = mod.parse_args([*SMALL[app], "--max-iter", "6", "--tol", tol, *shown])
        r = canary.run_local(mod.build(args, 2)[0], workers=2)
        received[tuple(shown)] = r.controller_received.get("ReportPart", 0)
    quiet = received[("--print-every", "0")]
    assert received[("--print-every", "5")] >= quiet + 2  # one an iteration
    assert received[("--print-every", "0", "--metrics", str(tmp_path / "m.jsonl"))] == \
        received[("--print-every", "5")]


@pytest.mark.parametrize(("app", "bad", "says"), [
    ("logistic_regression", ["--reg", "-1"], "--reg must be >= 0, got -1.0"),
    ("logistic_regression", ["--tol", "-1"], "--tol must be >= 0, got -1.0"),
    ("kmeans", ["--max-iter", "-2"], "--max-iter must be >= 0, got -2"),
    ("pagerank", ["--top", "-1"], "--top must be >= 0, got -1"),
])
def test_an_argument_out_of_range_is_named_with_its_value(
        app: str, bad: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    # not "--reg must be >= 0, --tol > 0 and --max-iter >= 0" for whichever one it was
    module = __import__(f"apps.{app}", fromlist=["parse_args"])
    with pytest.raises(SystemExit) as stop:
        module.parse_args(bad)
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"{app}.py: error: {says}"
