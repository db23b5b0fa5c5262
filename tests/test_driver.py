"""The shared app scaffolding: progress lines, metrics JSON lines, input errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from canary.driver import Progress, add_output_args, declare
from canary.io import count_rows


def test_progress_writes_every_iteration_and_prints_every_k(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.jsonl"
    pr = Progress(str(path), print_every=2, enabled=True)
    for it in range(1, 6):
        pr.record({"iteration": it, "objective": 1.0 / it}, f"line {it}")
    pr.close()
    assert [json.loads(x)["iteration"] for x in path.read_text().splitlines()] == [1, 2, 3, 4, 5]
    assert capsys.readouterr().out.split() == ["line", "2", "line", "4"]


def test_progress_is_silent_off_rank_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pr = Progress(str(tmp_path / "m.jsonl"), print_every=1, enabled=False)
    pr.record({"iteration": 1}, "line")
    assert not (tmp_path / "m.jsonl").exists() and capsys.readouterr().out == ""


def test_declare_reports_unreadable_input_once(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "none.npz")
    assert declare("app", count_rows, missing, is_root=True) is None
    err = capsys.readouterr().err
    assert err.startswith("app: error: ") and missing in err
    assert declare("app", count_rows, missing, is_root=False) is None
    assert capsys.readouterr().err == ""
    bad = tmp_path / "bad.npy"
    np.save(bad, np.arange(3.0))  # 1-D: not a table
    assert declare("app", count_rows, str(bad)) is None
    assert str(bad) in capsys.readouterr().err
    with pytest.raises(ZeroDivisionError):  # program bugs are not input errors
        declare("app", lambda: 1 / 0)


def test_output_args() -> None:
    ap = argparse.ArgumentParser()
    add_output_args(ap)
    a = ap.parse_args(["--metrics", "m", "--print-every", "5", "--trace", "t.json"])
    assert (a.metrics, a.print_every, a.trace) == ("m", 5, "t.json")
