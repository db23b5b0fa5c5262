"""The `canary run` launcher: the mpiexec command it builds, and a real run through it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from canary.cli import main, mpiexec_command, mpiexec_env
from canary.launch import checkout_root, hydra_options, is_hydra, sentinel_command
from tests.conftest import ROOT


def test_command_is_one_controller_plus_n_workers_unbuffered_each_under_its_sentinel() -> None:
    cmd = mpiexec_command(3, "apps/x.py", ["--reg", "1"], mpiexec="/opt/mpi/bin/mpiexec")
    assert cmd == ["/opt/mpi/bin/mpiexec", "-n", "4", *sentinel_command(), sys.executable, "-u",
                   "-m", "canary.ranks", "apps/x.py", "--reg", "1"]
    assert sentinel_command()[:3] == [sys.executable, "-I", "-S"]
    hydra = mpiexec_command(1, "a.py", [], mpiexec="mpiexec", hydra=True)
    assert hydra[1:1 + len(hydra_options())] == hydra_options() and hydra[-1] == "a.py"


def test_the_default_mpi_is_recognised_as_hydra_and_ranks_import_this_checkout() -> None:
    from canary.cli import find_mpiexec

    assert is_hydra(find_mpiexec())  # the mpich wheel: its output is read per rank
    assert not is_hydra(sys.executable) and not is_hydra("/does/not/exist")
    assert checkout_root() == str(ROOT)


def test_mpiexec_env_sets_timeout_unbuffered_output_and_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("MPIEXEC_TIMEOUT", raising=False)
    env = mpiexec_env(30, "/repo")
    assert env["MPIEXEC_TIMEOUT"] == "30" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == ["/repo", "/elsewhere"]
    plain = mpiexec_env(None)  # no timeout asked: none set; PYTHONPATH left as it was
    assert "MPIEXEC_TIMEOUT" not in plain and plain["PYTHONPATH"] == "/elsewhere"
    monkeypatch.delenv("PYTHONPATH")
    assert mpiexec_env(None, "/repo")["PYTHONPATH"] == "/repo"  # no empty entry (the cwd)
    # numba's colour codes reached the ranks' pipes as "[1m"; a user's own choice stays
    monkeypatch.delenv("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", raising=False)
    assert mpiexec_env(None)["NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"] == "1"
    monkeypatch.setenv("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "0")
    assert mpiexec_env(None)["NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"] == "0"


def test_hostfile_is_passed_through() -> None:
    cmd = mpiexec_command(2, "a.py", [], hostfile="hosts.txt", mpiexec="mpiexec")
    assert cmd[:4] == ["mpiexec", "-f", "hosts.txt", "-n"] and cmd[4] == "3"


def test_bad_invocations_are_clear(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="at least 1 worker"):
        mpiexec_command(0, "a.py", [], mpiexec="mpiexec")
    assert main(["run", "-n", "2", "does/not/exist.py"]) == 2
    assert "script not found: does/not/exist.py" in capsys.readouterr().err
    assert main(["run", "-n", "0", "apps/power_iteration.py"]) == 2
    assert "at least 1 worker" in capsys.readouterr().err
    assert main(["run", "--checkpoint", "README.md/ck", "apps/power_iteration.py"]) == 2
    assert capsys.readouterr().err == "canary run: --checkpoint README.md/ck: cannot create the " \
        "folder (Not a directory)\n"


@pytest.mark.parametrize("bad,says", [
    (["--timeout", "-5"], "--timeout must be at least 1 second, got -5 (leave it out for no "
                          "time limit)"),
    (["--timeout", "0"], "--timeout must be at least 1 second, got 0"),
    (["--keep", "0", "--checkpoint", "ck"], "--keep must be >= 1, got 0"),
    (["--restarts", "-1"], "--restarts must be >= 0, got -1"),
    (["--checkpoint-every", "nan", "--checkpoint", "ck"],
     "--checkpoint-every must be a number of seconds >= 0, got nan"),
    # without a folder they were silently ignored
    (["--keep", "3"], "--checkpoint-every and --keep need --checkpoint DIR"),
    (["--checkpoint-every", "5"], "--checkpoint-every and --keep need --checkpoint DIR"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_bad_run_option_is_said_with_canary_runs_usage(
        bad: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    # a time limit of 0 or less used to mean none at all, silently
    with pytest.raises(SystemExit) as stop:
        main(["run", *bad, "apps/power_iteration.py"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"canary run: error: {says}" in err
    assert err.startswith("usage: canary run ")


def test_canary_balance_set_in_the_environment_reaches_the_ranks() -> None:
    # canary run used to overwrite it with its own default, so a wrong value went unseen too
    env = {**os.environ, "CANARY_BALANCE": "maybe"}
    r = subprocess.run([sys.executable, "-m", "canary.cli", "run", "-n", "1", "--timeout", "60",
                        "apps/power_iteration.py"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("CANARY_BALANCE='maybe' is not one of on, off") == 1, r.stderr


def test_canary_run_executes_the_default_example_end_to_end() -> None:
    env = dict(os.environ, MPIEXEC_TIMEOUT="120")
    r = subprocess.run([sys.executable, "-m", "canary.cli", "run", "-n", "2", "--timeout", "120",
                        "apps/logistic_regression.py", "--generate", "3000,5", "--print-every",
                        "10"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "iter    10  objective" in r.stdout and "training accuracy" in r.stdout
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["workers"] == 2 and s["rows"] == 3000 and s["converged"]


def test_a_never_ending_while_shows_its_line_and_a_growing_iteration_count() -> None:
    # the job's only output until --timeout: without these lines it ran silently
    driver = ROOT / "tests" / "drivers" / "forever.py"
    line = next(k for k, text in enumerate(driver.read_text().splitlines(), 1)
                if "with p.while_(" in text)
    env = dict(os.environ, CANARY_PROGRESS_S="1", CANARY_SPIN_US="0", MPIEXEC_TIMEOUT="60")
    r = subprocess.run([sys.executable, "-m", "canary.cli", "run", "-n", "2", "--timeout", "9",
                        "tests/drivers/forever.py"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 124, r.stderr[-3000:]
    # rank 0 writes each line whole, but another rank's output may sit beside it
    found = re.findall(r"canary: [\d.]+ s: while_ 'never_converges' at "
                       r"tests/drivers/forever\.py:(\d+) iteration ([\d,]+)", r.stderr)
    assert len(found) >= 2, r.stderr[-3000:]
    assert {int(at) for at, _ in found} == {line}
    iterations = [int(n.replace(",", "")) for _, n in found]
    assert iterations == sorted(iterations) and iterations[-1] > iterations[0], iterations


def test_a_bad_progress_period_is_said_once_at_start_up() -> None:
    env = {**os.environ, "CANARY_PROGRESS_S": "often"}
    r = subprocess.run([sys.executable, "-m", "canary.cli", "run", "-n", "1", "--timeout", "60",
                        "tests/drivers/forever.py"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("environment variable CANARY_PROGRESS_S='often' is not a number") == 1, \
        r.stderr
