"""Snapshots in the in-process runner and on disk: a job stopped at any event resumes from its
latest snapshot, on any number of workers, with the uninterrupted answer; damaged snapshots are
found and passed over; a snapshot that cannot be written fails alone."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import canary
from apps import kmeans as km
from apps import logistic_regression as lr
from apps import pagerank as pr
from canary import Program
from canary.errors import JobStopped
from canary.snapshot import (
    SnapshotConfig,
    SnapshotError,
    SnapshotMismatchError,
    choose,
    committed,
    describe,
    read_arrays,
    write_arrays,
)
from tests.conftest import declared_at
from tests.seeds import over_seeds
from tests.sequential import run_sequential
from tests.test_random_programs import outcome, random_program


def lr_program(workers: int = 2) -> Program:
    args = lr.parse_args(["--generate", "300,4", "--max-iter", "12", "--tol", "1e-300",
                          "--partitions", "5", "--print-every", "0"])
    return lr.build(args, workers)[0]


def km_program(workers: int = 2) -> Program:
    args = km.parse_args(["--generate", "400,3,4", "--k", "4", "--max-iter", "8", "--tol", "0",
                          "--partitions", "5", "--print-every", "0"])
    args.want_labels = True
    return km.build(args, workers)[0]


def pr_program(workers: int = 2) -> Program:
    args = pr.parse_args(["--generate", "128,1024", "--max-iter", "6", "--print-every", "0",
                          "--partitions", "4"])
    args.want_ranks = True
    return pr.build(args, workers)[0]


APPS: dict[str, Callable[[], Program]] = {"logistic_regression": lr_program, "kmeans": km_program,
                                          "pagerank": pr_program}


def same(a: dict[str, list[np.ndarray]], b: dict[str, list[np.ndarray]]) -> bool:
    return a.keys() == b.keys() and all(
        len(a[k]) == len(b[k]) and all(x.dtype == y.dtype and np.array_equal(x, y)
                                       for x, y in zip(a[k], b[k])) for k in a)


def crash_and_resume(make: Callable[[], Program], folder: Path, rng: random.Random,
                     every: float, crashes: int) -> tuple[canary.JobResult, int]:
    """Run with snapshots, stop at a random event, resume from the latest snapshot on a random
    number of workers (from the start if none was committed), ``crashes`` times; then finish.
    Half the runs also move partitions at random moments (no snapshot is taken while one
    moves). Returns the final result and how many resumes started from a snapshot."""
    cfg = SnapshotConfig(str(folder), every_s=every, keep=2)
    chaos = rng.randrange(1000) if rng.random() < 0.5 else None
    full = canary.run_local(make(), workers=rng.randint(1, 3), seed=rng.randrange(1000),
                            checkpoint=cfg)
    resume = None
    from_snapshot = 0
    for _ in range(crashes):
        try:
            canary.run_local(make(), workers=rng.randint(1, 3), seed=rng.randrange(1000),
                             checkpoint=cfg, resume=resume, validate=True,
                             shuffle_ready=rng.random() < 0.5, chaos=chaos,
                             stop_after=rng.randint(1, full.events))
        except JobStopped:
            pass
        try:
            resume = choose(str(folder))[0]
            from_snapshot += 1
        except SnapshotError:
            resume = None
    last = canary.run_local(make(), workers=rng.randint(1, 3), seed=rng.randrange(1000),
                            checkpoint=cfg, resume=resume, validate=True, chaos=chaos)
    return last, from_snapshot


@pytest.fixture
def snap_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder for the many-seed tests' snapshots, in memory (``/dev/shm``) where the machine
    has it, else ``tmp_path``. The snapshot code runs the same (temporary name, fsync, rename),
    but a fsync on a disk cost a millisecond each: a quarter of these tests' time."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="canary-test-snapshots-", dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("app", sorted(APPS))
def test_apps_stopped_at_random_events_resume_with_the_same_answer(app: str,
                                                                   snap_dir: Path) -> None:
    reference = canary.run_local(APPS[app](), workers=2).results

    def resumes(seed: int) -> int:
        rng = random.Random(seed)
        got, n = crash_and_resume(APPS[app], snap_dir / str(seed), rng, every=rng.choice([2, 8]),
                                  crashes=rng.randint(1, 2))
        assert same(got.results, reference), (app, seed)
        return n

    # most stops came after a snapshot: the resumes were real
    assert sum(over_seeds(resumes, range(45))) >= 40


@pytest.mark.parametrize("prog_seed", range(20))
def test_random_programs_stopped_at_random_events_resume_with_the_sequential_answer(
        prog_seed: int, snap_dir: Path) -> None:
    reference = outcome(run_sequential(random_program(prog_seed)))

    def resumes(run: int) -> int:
        rng = random.Random(1000 * prog_seed + run)
        got, n = crash_and_resume(lambda: random_program(prog_seed), snap_dir / str(run), rng,
                                  every=rng.choice([1, 3]), crashes=rng.randint(1, 2))
        assert outcome(got.results) == reference, (prog_seed, run)
        return n

    assert sum(over_seeds(resumes, range(4))) >= 1


def test_partitions_moved_as_a_job_resumes_give_the_sequential_answer(snap_dir: Path) -> None:
    # Moves that reach workers before their snapshot's values are in (fast messages, a move at
    # once): a partition left its worker without its value (KeyError or a kernel given None)
    def resumed_with_moves(seed: int) -> None:
        rng = random.Random(seed)
        prog_seed = rng.randrange(20)
        folder = snap_dir / str(seed)
        canary.run_local(random_program(prog_seed), workers=rng.randint(1, 3), seed=seed,
                         checkpoint=SnapshotConfig(str(folder), every_s=1, keep=1))
        moves = rng.randint(1, 3)

        def inject(ctrl: Any, states: Any) -> list[tuple[int, int, int]]:
            nonlocal moves
            if not moves or rng.random() < 0.5:
                return []
            moves -= 1
            g = rng.randrange(len(ctrl.map.owners))
            return [(g, rng.randrange(len(ctrl.map.owners[g])), rng.randrange(ctrl.n_workers))]

        got = canary.run_local(random_program(prog_seed), workers=rng.randint(2, 4), seed=seed,
                               resume=choose(str(folder))[0], inject=inject, mean_delay=0.01,
                               validate=True)
        assert outcome(got.results) == outcome(run_sequential(random_program(prog_seed)))

    over_seeds(resumed_with_moves, range(6))


# ------------------------------------------------------------------ on disk
@pytest.fixture
def three_snapshots(tmp_path: Path) -> tuple[Path, dict[str, list[np.ndarray]]]:
    """A finished job's checkpoint directory holding its last three snapshots, and its answer."""
    folder = tmp_path / "ck"
    r = canary.run_local(lr_program(), workers=2, checkpoint=SnapshotConfig(str(folder), 6, 3))
    assert r.snapshots >= 3 and len(committed(str(folder))) == 3  # older ones were deleted
    return folder, r.results


def _flip_a_data_byte(path: Path) -> None:
    import h5py

    with h5py.File(path, "r") as f:
        name = next(k for k in f)
        ds = f[name][next(k for k in f[name])]
        offset = ds.id.get_offset()
    with open(path, "r+b") as fh:
        fh.seek(offset + 3)
        b = fh.read(1)
        fh.seek(offset + 3)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_arrays_of_every_kind_a_kernel_returns_read_back_as_written(tmp_path: Path) -> None:
    import h5py

    rows = [("w", 0, np.arange(5.0), 3), ("w", 7, np.array(2.5), 4),
            ("empty", 0, np.zeros((0, 3)), 1), ("mask", 2, np.array([True, False]), 1),
            ("counts", 3, np.arange(6, dtype=np.int32).reshape(2, 3), 2),
            ("z", 0, np.array([1 + 2j, -3j]), 0), ("bytes", 1, np.arange(3, dtype=np.uint8), 0),
            ("fortran", 0, np.asfortranarray(np.arange(6.0).reshape(2, 3)), 0)]
    entries = write_arrays(str(tmp_path / "part.h5"), rows)
    assert [(e["dataset"], e["index"], e["last_seq"]) for e in entries] == \
        [(n, k, seq) for n, k, _, seq in rows]
    for (_, _, want, _), got in zip(rows, read_arrays(str(tmp_path), entries)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)
    with h5py.File(tmp_path / "part.h5", "r") as f:  # an ordinary HDF5 file: /<dataset>/<index>
        assert sorted(f) == sorted({n for n, *_ in rows})
        assert np.array_equal(f["counts/3"][()], rows[4][2]) and f["w/7"][()] == 2.5
    # a file whose array is not the manifest's shape, or lacks it, is named with the partition
    with pytest.raises(SnapshotError, match=r"part\.h5: cannot read partition 0 of 'w'"):
        read_arrays(str(tmp_path), [dict(entries[0], shape=[7], nbytes=56)])
    with pytest.raises(SnapshotError, match="cannot read partition 0 of 'gone'"):
        read_arrays(str(tmp_path), [dict(entries[0], dataset="gone")])


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_a_damaged_snapshot_is_found_and_the_one_before_it_is_used(
        damage: str, three_snapshots: tuple[Path, dict[str, list[np.ndarray]]]) -> None:
    folder, answer = three_snapshots
    snaps = committed(str(folder))
    victim = Path(snaps[-1].path) / "worker-0001.h5"
    if damage == "flip":
        _flip_a_data_byte(victim)
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:100])
    else:
        victim.unlink()
    assert describe(snaps[-1])["checksums"].startswith("damaged: ")
    assert describe(snaps[-2])["checksums"] == "ok"
    snap, notes = choose(str(folder))
    assert snap.id == snaps[-2].id
    why = {"flip": "fails its checksum", "truncate": "truncated", "remove": "missing"}[damage]
    assert len(notes) == 1 and f"snapshot {snaps[-1].id} is damaged" in notes[0]
    assert why in notes[0] and "worker-0001.h5" in notes[0]
    r = canary.run_local(lr_program(), workers=3, resume=snap)
    assert same(r.results, answer)


def test_with_no_usable_snapshot_the_error_says_so(
        three_snapshots: tuple[Path, dict[str, list[np.ndarray]]]) -> None:
    folder, _ = three_snapshots
    for snap in committed(str(folder)):
        (Path(snap.path) / "worker-0000.h5").unlink()
    with pytest.raises(SnapshotError, match=r"no usable snapshot \(snapshot \d+ is damaged"):
        choose(str(folder))
    with pytest.raises(SnapshotError, match="no such checkpoint directory"):
        choose(str(folder / "nope"))


def test_a_damaged_manifest_is_named_and_passed_over(
        three_snapshots: tuple[Path, dict[str, list[np.ndarray]]],
        capsys: pytest.CaptureFixture[str]) -> None:
    # a manifest cut short was skipped as if the snapshot had never been committed: listed by
    # nobody, and "no usable snapshot" without a why once none was left
    from canary.cli import main

    folder, _ = three_snapshots
    older, newest = committed(str(folder))[-2:]
    manifest = Path(newest.path) / "manifest.json"
    manifest.write_text(manifest.read_text()[:100])
    snap, notes = choose(str(folder))
    assert snap.id == older.id
    (note,) = notes
    assert note.startswith(f"snapshot {newest.id} is damaged ({manifest}: unreadable manifest: ")
    assert note.endswith("); falling back to the one before")
    assert main(["snapshots", str(folder)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [s.id for s in committed(str(folder))] + [newest.id]
    assert rows[-1]["checksums"].startswith(f"damaged: {manifest}: unreadable manifest")
    for s in committed(str(folder)):
        (Path(s.path) / "manifest.json").write_text("{")
    with pytest.raises(SnapshotError, match=r"no usable snapshot \(snapshot \d+ is damaged "
                                            r"\(.*unreadable manifest.*\); snapshot \d+ is damaged"):
        choose(str(folder))


@pytest.mark.parametrize("edit, says", [
    (lambda d: {"format": d["format"]}, "field 'id' is missing or of the wrong type"),
    (lambda d: {**d, "workers": "2"}, "field 'workers' is missing or of the wrong type"),
    (lambda d: {**d, "arrays": [{"dataset": "x"}]}, "array entry 0 lacks one of dataset"),
    (lambda d: {**d, "id": 99}, "its id 99 is not its folder's"),
])
def test_a_manifest_with_fields_missing_or_wrong_is_damaged_not_a_traceback(
        three_snapshots: tuple[Path, dict[str, list[np.ndarray]]], edit: Callable[..., Any],
        says: str) -> None:
    # {"format": 1} was a KeyError: 'id' out of `canary run --resume` and `canary snapshots`;
    # an id edited to 99 was resumed from as snapshot 99
    folder, _ = three_snapshots
    older, newest = committed(str(folder))[-2:]
    manifest = Path(newest.path) / "manifest.json"
    manifest.write_text(json.dumps(edit(json.loads(manifest.read_text()))))
    snap, (note,) = choose(str(folder))
    assert snap.id == older.id
    assert note.startswith(f"snapshot {newest.id} is damaged ({manifest}: damaged manifest: "
                           f"{says}")


def test_a_folder_without_its_manifest_is_not_a_snapshot(
        three_snapshots: tuple[Path, dict[str, list[np.ndarray]]]) -> None:
    folder, _ = three_snapshots
    newest = committed(str(folder))[-1]
    os.remove(os.path.join(newest.path, "manifest.json"))  # as if the job died before the commit
    assert newest.id not in [s.id for s in committed(str(folder))]


def test_resuming_another_program_or_other_arguments_is_a_clear_error(
        three_snapshots: tuple[Path, dict[str, list[np.ndarray]]]) -> None:
    from canary.snapshot import check_same_job

    folder, _ = three_snapshots
    snap = choose(str(folder))[0]
    args = lr.parse_args(["--generate", "300,4", "--max-iter", "13", "--tol", "1e-300",
                          "--partitions", "5", "--print-every", "0"])
    # the statement named with the driver line that declares it now (the loop's `with`)
    loop = re.escape(declared_at("max_iter=args.max_iter):", lr.__file__))
    with pytest.raises(SnapshotMismatchError,
                       match=rf"statement \d+, declared at {loop}, was '\('while', 5, 12, 13\)' "
                             r"and is now '\('while', 5, 13"):
        canary.run_local(lr.build(args, 2)[0], workers=2, resume=snap)
    # a partition count computed from the job's ranks: the error says what to compute it from
    from canary.snapshot import check_resumable

    def per_worker(workers: int) -> canary.Program:
        p = canary.Program("per_worker")
        p.load([p.dataset("a", 2 * workers)], lambda i, n: np.zeros(1))  # declared: per_worker
        return p

    taken = per_worker(snap.workers)
    snap.data["digest"], snap.data["statements"] = taken.digest, taken.statements()
    now = per_worker(snap.workers + 1)
    line = re.escape(declared_at("# declared: per_worker"))
    with pytest.raises(SnapshotMismatchError, match=rf"statement 0, declared at {line}, was "
                       rf"'dataset a/{2 * snap.workers}' and is now 'dataset a/"
                       rf"{2 * snap.workers + 2}': the snapshot was taken on {snap.workers} "
                       rf"workers and this run has {snap.workers + 1}; .*"
                       r"canary\.driver\.planned_workers\(comm\)"):
        check_resumable(snap, now.digest, now.statements(), snap.workers + 1,
                        sites=now.statement_sites())
    with pytest.raises(SnapshotMismatchError, match="resume with the script and arguments"):
        check_resumable(snap, now.digest, now.statements(), snap.workers)
    # a snapshot whose list is the start of the program's (every program ends with its `end`
    # op, so only a list cut short is): the first statement past it, with its line
    snap.data["statements"] = now.statements()[:1]
    with pytest.raises(SnapshotMismatchError, match=rf"\(1 statements, now 4; statement 1, "
                       rf"declared at {line}, is new\); resume with the script"):
        check_resumable(snap, now.digest, now.statements(), sites=now.statement_sites())
    snap.data["script"], snap.data["args"] = "apps/logistic_regression.py", ["--reg", "1"]
    check_same_job(snap, "apps/logistic_regression.py", ["--reg", "1"])
    with pytest.raises(SnapshotMismatchError, match="argument 2 was '1' and is now '2'"):
        check_same_job(snap, "apps/logistic_regression.py", ["--reg", "2"])
    with pytest.raises(SnapshotMismatchError, match="argument 3 was absent and is now '--tol'"):
        check_same_job(snap, "apps/logistic_regression.py", ["--reg", "1", "--tol"])
    with pytest.raises(SnapshotMismatchError, match="was taken of apps/logistic_regression.py"):
        check_same_job(snap, "apps/kmeans.py", ["--reg", "1"])


def test_a_snapshot_the_disk_refuses_fails_alone_and_the_job_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import canary.snapshot as snapshot_files

    write = snapshot_files.write_arrays
    calls = []

    def full_disk_once(path: str, arrays: Any) -> Any:
        calls.append(path)
        if len(calls) == 2:  # a worker's part of the first snapshot
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return write(path, arrays)

    monkeypatch.setattr(snapshot_files, "write_arrays", full_disk_once)
    folder = tmp_path / "ck"
    answer = canary.run_local(lr_program(), workers=2).results
    r = canary.run_local(lr_program(), workers=2, checkpoint=SnapshotConfig(str(folder), 6, 100))
    assert same(r.results, answer)
    ids = [s.id for s in committed(str(folder))]
    assert ids == list(range(2, 2 + r.snapshots)) and r.snapshots >= 3
    assert not list(folder.glob("snapshot-000001/*.tmp"))  # the half-written file is gone


def test_canary_snapshots_lists_one_json_line_per_snapshot(
        three_snapshots: tuple[Path, dict[str, list[np.ndarray]]],
        capsys: pytest.CaptureFixture[str]) -> None:
    from canary.cli import main

    folder, _ = three_snapshots
    assert main(["snapshots", str(folder)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [s.id for s in committed(str(folder))]
    for r in rows:
        assert r["checksums"] == "ok" and r["workers"] == 2 and r["bytes"] > 0
        assert r["program"] == "logistic_regression" and r["position"].startswith("before ")
    assert main(["snapshots", str(folder / "nope")]) == 2
    assert "no such checkpoint directory" in capsys.readouterr().err


def test_a_resumed_driver_declares_its_partitions_for_the_snapshots_worker_count(
        three_snapshots: tuple[Path, dict[str, list[np.ndarray]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from canary.driver import RESUME_ENV, planned_workers

    class Comm:  # what planned_workers asks of a communicator
        def Get_size(self) -> int:
            return 4  # a controller and 3 workers

    folder, _ = three_snapshots
    monkeypatch.delenv(RESUME_ENV, raising=False)
    assert planned_workers(Comm()) == 3
    snap = choose(str(folder))[0]
    monkeypatch.setenv(RESUME_ENV, snap.path)
    assert planned_workers(Comm()) == 2  # the snapshot was taken on 2
    # so an app's default partitions are the snapshot's, and the resumed program is the same
    args = lr.parse_args(["--generate", "300,4", "--max-iter", "12", "--tol", "1e-300"])
    assert lr.build(args, planned_workers(Comm()))[0].digest == lr.build(args, 2)[0].digest
    assert lr.build(args, 3)[0].digest != lr.build(args, 2)[0].digest


def test_resuming_after_a_kernel_changed_is_refused(tmp_path: Path) -> None:
    # the same statements (same function names, same captured values), other code: the state
    # so far was computed by the old kernel, and the resumed job would silently go on with the
    # new one (a different answer, exit 0)
    def halve(v: np.ndarray) -> np.ndarray:
        return v * 0.5

    def scale(step: Callable[[np.ndarray], np.ndarray]) -> Program:
        p = Program("scale")
        a, total = p.dataset("a", 2), p.dataset("total", 1)
        p.load([a], lambda i, n: np.full(3, 1.0 + i))
        with p.loop(200):
            p.compute(step, [a], [a], name="step")
            p.reduce(a, total)  # a stage boundary each iteration, where snapshots are taken
        p.report(total)
        return p

    folder = str(tmp_path / "ck")
    canary.run_local(scale(halve), workers=2, checkpoint=SnapshotConfig(folder, 0.0, 2))
    snap = committed(folder)[-1]
    assert canary.run_local(scale(halve), workers=2, resume=snap).resumed_from == snap.id
    statements = scale(halve).statements()

    def halve(v: np.ndarray) -> np.ndarray:  # type: ignore[no-redef]  # noqa: F811
        return v * 0.25

    assert scale(halve).statements() == statements  # only the source text tells them apart
    with pytest.raises(SnapshotMismatchError, match=r"was taken with other code: the function of "
                                                    r"stage 'step' \(id \d+\) has changed since"):
        canary.run_local(scale(halve), workers=2, resume=snap)


def test_a_restart_takes_only_this_runs_snapshots_else_the_one_it_resumed_from(
        three_snapshots: tuple[Path, dict[str, list[np.ndarray]]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # A run that lost a rank before its first snapshot restarted from an earlier run's, which
    # may have had other arguments: that run's answer, exit 0
    from canary import cli
    from canary.driver import RESUME_ENV

    ck, _ = three_snapshots
    earlier = committed(str(ck))
    other = tmp_path / "other"
    canary.run_local(lr_program(), workers=2, checkpoint=SnapshotConfig(str(other), 6, 1))
    resumed = committed(str(other))[-1]

    def launches(writes: bool) -> list[str | None]:
        """The snapshot each launch was told to resume from; the first loses a rank after
        committing a snapshot into ck if ``writes``."""
        told: list[str | None] = []

        def supervise_job(cmd: list[str], env: dict[str, str], ranks: int,
                          hydra: bool, kept: cli.launch.JobSnapshots) -> tuple[int, bool]:
            told.append(env.get(RESUME_ENV))
            if len(told) > 1:
                return 0, False
            if writes:  # this run's snapshots follow the earlier run's
                canary.run_local(lr_program(), workers=2,
                                 checkpoint=SnapshotConfig(str(ck), 6, 100))
            return 137, True
        monkeypatch.setattr(cli.launch, "supervise_job", supervise_job)
        return told

    told = launches(writes=False)
    assert cli._supervise_with_restarts(["x"], {}, 2, False, None, str(ck), 1) == 0
    assert told == [None, None]
    assert "restarting the job (1 of 1) from the beginning (this run has committed no " \
           "snapshot)" in capsys.readouterr().err
    told = launches(writes=False)
    assert cli._supervise_with_restarts(["x"], {}, 2, False, resumed, str(ck), 1) == 0
    assert told == [os.path.abspath(resumed.path)] * 2
    assert f"from snapshot {resumed.id} of {other}, which it resumed from" in \
        capsys.readouterr().err
    told = launches(writes=True)
    assert cli._supervise_with_restarts(["x"], {}, 2, False, None, str(ck), 1) == 0
    own = committed(str(ck))[-1]
    assert own.id > earlier[-1].id and told == [None, os.path.abspath(own.path)]
    capsys.readouterr()
    told = launches(writes=False)  # no restart asked for: none made, nothing said of them
    assert cli._supervise_with_restarts(["x"], {}, 2, False, None, str(ck), 0) == 137
    assert told == [None] and "restart" not in capsys.readouterr().err
    told = launches(writes=False)  # every launch loses a rank: it says they are used up
    monkeypatch.setattr(cli.launch, "supervise_job", lambda *a: (137, True))
    assert cli._supervise_with_restarts(["x"], {}, 2, False, None, str(ck), 2) == 137
    err = capsys.readouterr().err
    assert err.count("restarting the job") == 2 and \
        err.endswith("canary: no restart left (--restarts 2 used up)\n"), err


def test_an_unfinished_job_calls_only_its_own_snapshots_its_own(
        three_snapshots: tuple[Path, Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a job run afresh in a folder holding an earlier run's snapshots, and stopped before its
    # first, was told "its snapshots are in DIR: --resume DIR continues": the earlier run's
    from canary import cli

    ck, _ = three_snapshots
    earlier = committed(str(ck))
    told: list[cli.launch.JobSnapshots] = []

    def supervise_job(cmd: list[str], env: dict[str, str], ranks: int, hydra: bool,
                      kept: cli.launch.JobSnapshots) -> tuple[int, bool]:
        told.append(kept)
        return 143, False

    monkeypatch.setattr(cli.launch, "supervise_job", supervise_job)
    assert cli._supervise_with_restarts(["x"], {}, 2, False, None, str(ck), 0) == 143
    assert told[-1] == cli.launch.JobSnapshots(str(ck), earlier[-1].id + 1)
    assert cli.launch.results_left(told[-1]) == (
        f"the job's results are lost: it had committed no snapshot to {ck} yet (the first comes "
        f"--checkpoint-every seconds into the run); the snapshots there are an earlier run's, "
        f"which `--resume {ck}` would continue")
    # resumed from one of them: that one is where it can start again
    assert cli._supervise_with_restarts(["x"], {}, 2, False, earlier[0], str(ck), 0) == 143
    assert told[-1].resumed == (str(ck), earlier[0].id)
    assert cli.launch.results_left(told[-1]) == (
        f"it had committed no snapshot to {ck} since it resumed: `canary run --resume {ck}` "
        f"starts again from snapshot {earlier[0].id}")
    # once it has committed one of its own, those are where it goes on from
    canary.run_local(lr_program(), workers=2, checkpoint=SnapshotConfig(str(ck), 6, 100))
    assert cli.launch.results_left(told[-1]) == (
        f"its snapshots are in {ck}: `canary run --resume {ck}` continues from the last one")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.launch.results_left(cli.launch.JobSnapshots(str(empty))) == (
        f"the job's results are lost: it had committed no snapshot to {empty} yet (the first "
        "comes --checkpoint-every seconds into the run)")


def test_resume_from_a_file_an_empty_folder_or_an_empty_path_says_what_is_wrong(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from canary.cli import main

    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SnapshotError, match=r"afile: is a file, not checkpoint directory"):
        choose(str(afile))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SnapshotError, match=r"no usable snapshot \(it holds none: a job writes "
                                            r"them with `canary run --checkpoint DIR`\)"):
        choose(str(tmp_path / "empty"))
    # an unset shell variable: the job ran without snapshots, or afresh, without a word
    for flag in ("--checkpoint", "--resume"):
        assert main(["run", flag, "", "apps/power_iteration.py"]) == 2
        assert f"canary run: {flag} got an empty path" in capsys.readouterr().err
    assert main(["run", str(tmp_path)]) == 2  # runpy's ImportError, once per rank
    assert f"canary run: {tmp_path} is a folder: give the driver script's file" in \
        capsys.readouterr().err


def test_a_checkpoint_folder_this_user_cannot_write_is_refused_at_launch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # (chattr +i): the job ran without a single snapshot, warning once an interval
    from canary import cli

    real = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if str(p) == str(tmp_path)
                        else real(p, mode))
    assert cli.main(["run", "--checkpoint", str(tmp_path), "apps/power_iteration.py"]) == 2
    assert f"canary run: --checkpoint {tmp_path}: this user cannot write there" in \
        capsys.readouterr().err
