"""The shared app scaffolding: progress lines, strict JSON lines, output checks, input errors."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from canary.driver import (
    Progress,
    add_output_args,
    check_outputs,
    declare,
    json_line,
    output_problem,
    save_npz,
    unwritable_output,
    write_outputs,
)
from canary.io import count_rows
from tests.app_helpers import strict_loads


def test_progress_writes_every_iteration_and_prints_every_k(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.jsonl"
    pr = Progress(str(path), print_every=2, enabled=True)
    for it in range(1, 6):
        pr.record({"iteration": it, "objective": 1.0 / it}, f"line {it}")
    pr.record({"iteration": 6, "objective": math.inf}, "line 6")
    pr.close()
    rows = [strict_loads(x) for x in path.read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6] and rows[-1]["objective"] is None
    assert capsys.readouterr().out.split() == ["line", "2", "line", "4", "line", "6"]


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


def test_json_line_is_strict_json_with_null_for_non_finite_values() -> None:
    row = {"a": math.nan, "b": [1.5, -math.inf, {"c": math.inf}], "d": np.float64(np.nan),
           "e": 0.1, "f": np.float64(2.5), "g": 3, "h": None, "i": "x", "j": True}
    line = json_line(row)
    assert "\n" not in line
    assert strict_loads(line) == {"a": None, "b": [1.5, None, {"c": None}], "d": None, "e": 0.1,
                                  "f": 2.5, "g": 3, "h": None, "i": "x", "j": True}
    with pytest.raises(ValueError, match="not strict JSON"):
        strict_loads(json.dumps({"a": math.nan}))  # what json.dumps alone writes
    # numpy's scalars and arrays, which a driver's values are: they raised TypeError
    assert strict_loads(json_line({"n": np.int64(1), "x": np.float32(0.5), "ok": np.bool_(True),
                                   "v": np.array([1.0, np.inf]), "m": np.arange(4).reshape(2, 2)})
                        ) == {"n": 1, "x": 0.5, "ok": True, "v": [1.0, None], "m": [[0, 1], [2, 3]]}
    with pytest.raises(TypeError):
        json_line({"s": {1, 2}})


def test_save_npz_writes_exactly_the_path_given(tmp_path: Path) -> None:
    # numpy.savez would write model.npz for "model": beside the file that was checked
    for given in ("model", "model.npz", "model.txt"):
        save_npz(str(tmp_path / given), a=np.arange(3.0))
        np.testing.assert_array_equal(np.load(tmp_path / given)["a"], np.arange(3.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.npz", "model.txt"]


def test_output_problem_says_why_without_creating_anything(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    before = sorted(os.listdir(tmp_path))
    assert output_problem(str(tmp_path / "new.npz")) is None
    assert output_problem(str(tmp_path / "file")) is None  # overwriting is fine
    nope = tmp_path / "nope"
    assert output_problem(str(nope / "m.npz")) == f"directory {nope} does not exist"
    under_file = str(tmp_path / "file" / "m.npz")
    assert output_problem(under_file) == f"{tmp_path / 'file'} is not a directory"
    assert output_problem(str(tmp_path / "folder")) == "is a directory (expected a file name)"
    monkeypatch.chdir(tmp_path)
    assert output_problem("m.npz") is None
    real_access = os.access
    monkeypatch.setattr(os, "access",
                        lambda p, mode: False if str(p) == "." else real_access(p, mode))
    assert output_problem("m.npz") == (
        f"directory {tmp_path} (the current directory) is not writable")
    monkeypatch.setattr(os, "access", lambda p, mode: not str(p).endswith("file"))
    assert output_problem(str(tmp_path / "file")) == "the file exists and is not writable"
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "file").read_text() == "x"


def test_unwritable_output_names_the_flag_and_the_path(tmp_path: Path) -> None:
    ok = str(tmp_path / "m.jsonl")
    bad = str(tmp_path / "nope" / "t.json")
    assert unwritable_output({"--output": None, "--metrics": ok}) is None
    assert unwritable_output({"--output": None, "--metrics": ok, "--trace": bad}) == (
        f"--trace {bad}: directory {tmp_path / 'nope'} does not exist")


def test_outputs_that_clash_with_each_other_or_an_input_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "data.npz"
    data.write_bytes(b"the input")
    m = str(tmp_path / "m.jsonl")
    # an output at the input file would be truncated when opened, before the job reads it
    assert unwritable_output({"--metrics": str(data)}, {"--input": str(data)}) == (
        f"--metrics {data} is the --input file: writing there would destroy the input; "
        "name another file")
    # the same file by another spelling is the same file
    other = str(tmp_path / "." / "data.npz")
    assert unwritable_output({"--output": other}, {"--input": None, "--init": str(data)}) == (
        f"--output {other} is the --init file: writing there would destroy the input; "
        "name another file")
    assert unwritable_output({"--output": None, "--metrics": m, "--trace": m}) == (
        f"--metrics and --trace both name {m}: one would replace the other; "
        "give each its own file")
    assert unwritable_output({"--metrics": ""}) == (
        "--metrics '': an empty file name; give a path or leave the option out")
    assert unwritable_output({"--metrics": m, "--trace": str(tmp_path / "t.json")},
                             {"--input": str(data)}) is None
    assert data.read_bytes() == b"the input" and sorted(os.listdir(tmp_path)) == ["data.npz"]


def test_print_every_must_be_a_count(capsys: pytest.CaptureFixture[str]) -> None:
    ap = argparse.ArgumentParser(prog="app.py")
    add_output_args(ap)
    assert ap.parse_args(["--print-every", "0"]).print_every == 0
    for bad, why in (("-1", "must be >= 0 (0: no progress lines), got -1"),
                     ("x", "expected an integer >= 0, got 'x'")):
        with pytest.raises(SystemExit):
            ap.parse_args(["--print-every", bad])
        assert f"app.py: error: argument --print-every: {why}" in capsys.readouterr().err


class FakeComm:
    """An mpi4py communicator's rank, size and bcast, for ``check_outputs``."""

    def __init__(self, rank: int, size: int, root_says: str | None = None) -> None:
        self.rank, self.size, self.root_says = rank, size, root_says

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.rank

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's name
        return self.size

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj if self.rank == root else self.root_says


def test_check_outputs_fails_every_rank_and_rank_zero_says_why_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = str(tmp_path / "nope" / "model.npz")
    outputs = {"--output": bad, "--metrics": None}
    assert check_outputs("app.py", outputs, FakeComm(0, 3)) is False
    err = capsys.readouterr().err
    assert err == f"app.py: error: --output {bad}: directory {tmp_path / 'nope'} does not exist\n"
    # a worker does not look at paths (on another host they may not exist): it gets rank 0's word
    assert check_outputs("app.py", outputs, FakeComm(2, 3, root_says="--output x: why")) is False
    assert check_outputs("app.py", outputs, FakeComm(2, 3, root_says=None)) is True
    assert capsys.readouterr().err == ""
    assert check_outputs("app.py", {"--output": str(tmp_path / "m.npz")}, FakeComm(0, 1)) is True
    assert not (tmp_path / "nope").exists() and not (tmp_path / "m.npz").exists()


def test_write_outputs_reports_a_failed_write_and_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "a.txt"
    gone = tmp_path / "gone" / "b.txt"
    status = write_outputs("app.py", {"--metrics": (str(gone), lambda p: open(p, "w").close()),
                                      "--output": (str(good), lambda p: good.write_text("ok"))})
    assert status == 1 and good.read_text() == "ok"
    err = capsys.readouterr().err.splitlines()
    assert err == [f"app.py: error: --metrics {gone}: could not write it "
                   "(No such file or directory)"]
    assert write_outputs("app.py", {"--output": (str(good), lambda p: None)}) == 0
