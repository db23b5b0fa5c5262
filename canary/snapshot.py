"""Snapshots on disk: one folder per snapshot, one HDF5 file per worker, a manifest written last.

Layout of a checkpoint directory::

    DIR/snapshot-000003/worker-0000.h5   partitions worker 0 held: /<dataset>/<index>
    DIR/snapshot-000003/worker-0001.h5
    DIR/snapshot-000003/controller.h5    the reports the controller had received
    DIR/snapshot-000003/manifest.json    written last: the snapshot exists once this does

Every file is written to a temporary name, flushed to the disk (``fsync``) and renamed, and
the folder is synced after the rename, so a crash at any moment leaves either the whole file
or none of it. The manifest lists every array with a checksum of its bytes (XXH3-64), its
dtype and its shape: a file that is missing, truncated or altered is found before its values
are used. :func:`choose` picks the newest snapshot whose files all check out.

This module only reads and writes files; the decisions (when to take a snapshot, which stage
instance is the barrier) are the controller's and the workers' state machines'.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from canary.errors import CanaryError
from canary.sites import declared_at

FORMAT = 1
CHECKSUM = "xxh3_64"  # how the manifest's and the files' checksums are computed
MANIFEST = "manifest.json"
CONTROLLER_FILE = "controller.h5"
_SNAPSHOT_DIR = re.compile(r"snapshot-(\d{6,})$")


class SnapshotError(CanaryError):
    """A snapshot cannot be used or written: the message names the file and what is wrong."""


class SnapshotMismatchError(SnapshotError):
    """The job being resumed is not the one the snapshot was taken of (another program, or other
    script arguments); the message names the first difference."""


@dataclass(frozen=True)
class SnapshotConfig:
    """Where and how often the controller takes snapshots (``canary run --checkpoint``).

    ``every_s``: seconds of run time between snapshots (the first once that much has passed);
    ``keep``: committed snapshots kept (older ones are deleted after each commit); ``script``
    and ``args``: what the manifest records, so that a resume can check it runs the same job.
    """

    directory: str
    every_s: float = 60.0
    keep: int = 2
    script: str = ""
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.every_s < 0:
            raise ValueError(f"--checkpoint-every must be >= 0 seconds, got {self.every_s}")
        if self.keep < 1:
            raise ValueError(f"--keep must be at least 1, got {self.keep}")


@dataclass
class Manifest:
    """A committed snapshot's manifest (see :func:`manifest_dict` for what it holds)."""

    path: str  # the snapshot's folder
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> int:
        return int(self.data["id"])

    @property
    def position(self) -> dict[str, Any]:
        return dict(self.data["position"])

    @property
    def workers(self) -> int:
        return int(self.data["workers"])

    def arrays(self) -> dict[tuple[str, int], dict[str, Any]]:
        """(dataset, index) -> its entry (``file``, ``checksum``, ``nbytes``, ``last_seq``)."""
        return {(e["dataset"], int(e["index"])): e for e in self.data["arrays"]}


def snapshot_folder(root: str, snap: int) -> str:
    return os.path.join(root, f"snapshot-{snap:06d}")


def worker_file_name(worker: int) -> str:
    return f"worker-{worker:04d}.h5"


def checksum(array: np.ndarray) -> str:
    """XXH3-64 of the array's bytes in C order, as 16 hex digits. It runs at memory speed (a
    CRC-32 of zlib's, about 4 GB/s, took a third of the time of writing a snapshot)."""
    a = np.ascontiguousarray(array)
    return xxhash.xxh3_64_hexdigest(a.data if a.nbytes else b"")


def as_storable(dataset: str, index: int, value: Any) -> np.ndarray:
    """``value`` as an array HDF5 can hold; raises SnapshotError naming the partition if it is
    not one (a kernel that returned a Python object)."""
    a = np.asarray(value)
    if a.dtype.hasobject:
        raise SnapshotError(f"partition {index} of '{dataset}' holds a {type(value).__name__}, "
                            "which a snapshot cannot store: return numpy arrays from kernels")
    return a


def write_arrays(path: str, arrays: Sequence[tuple[str, int, np.ndarray, int]]
                 ) -> list[dict[str, Any]]:
    """Write ``(dataset, index, array, last_seq)`` rows to the HDF5 file ``path`` durably
    (temporary name, fsync, rename, fsync of the folder); return one manifest entry per row.

    Raises OSError if the disk refuses (full, read-only), after removing the temporary file,
    and SnapshotError for a value that is not an array of numbers.
    """
    tmp = path + ".tmp"
    entries = []
    try:
        with _ArrayFile(tmp) as f:
            for name, index, value, last_seq in arrays:
                a = as_storable(name, index, value)
                digest = checksum(a)
                # the manifest alone records checksum and last_seq: HDF5 attributes repeating
                # them made writing a small array 1.5x as slow
                f.add(name, index, a)
                entries.append({"dataset": name, "index": index, "file": os.path.basename(path),
                                "checksum": digest, "nbytes": int(a.nbytes), "last_seq": last_seq,
                                "dtype": a.dtype.str, "shape": list(a.shape)})
        _fsync_file(tmp)
        os.replace(tmp, path)
        _fsync_dir(os.path.dirname(path))
    except BaseException:
        _remove(tmp)
        raise
    return entries


class _ArrayFile:
    """A new HDF5 file that arrays are added to as ``/<dataset>/<index>``, through h5py's
    low-level API: h5py's ``create_dataset`` looked up the group path and built a type and a
    property list for every array, which made a file of many small partitions 4x as slow to
    build (2x with its fsync). The file reads back with h5py's high-level API like any other."""

    def __init__(self, path: str) -> None:
        import h5py

        self._h5 = h5py
        self._file = h5py.h5f.create(path.encode(), h5py.h5f.ACC_TRUNC, fapl=_file_access())
        self._groups: dict[str, Any] = {}
        self._types: dict[np.dtype[Any], Any] = {}
        self._dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        self._dcpl.set_obj_track_times(False)  # as h5py's default: same arrays, same bytes
        self._dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # every array is written whole

    def add(self, dataset: str, index: int, a: np.ndarray) -> None:
        """Store ``a`` (an array of numbers) as ``/<dataset>/<index>``."""
        h5 = self._h5
        group = self._groups.get(dataset)
        if group is None:
            group = self._groups[dataset] = h5.h5g.create(self._file, dataset.encode())
        tid = self._types.get(a.dtype)
        if tid is None:
            tid = self._types[a.dtype] = h5.h5t.py_create(a.dtype, logical=True)
        ds = h5.h5d.create(group, str(index).encode(), tid, _space(a.shape), dcpl=self._dcpl)
        if a.size:
            ds.write(h5.h5s.ALL, h5.h5s.ALL, np.ascontiguousarray(a))

    def __enter__(self) -> _ArrayFile:
        return self

    def __exit__(self, *exc: object) -> None:
        for group in self._groups.values():
            group.close()
        self._file.close()


def read_arrays(folder: str, entries: Iterable[dict[str, Any]]) -> list[np.ndarray]:
    """The arrays the manifest ``entries`` name, read from ``folder`` and checked.

    Raises SnapshotError naming the file and the array if a file is missing or unreadable, an
    array is absent or not of the shape the manifest gives, or its bytes fail their checksum.
    """
    import h5py

    out: list[np.ndarray] = []
    files: dict[str, Any] = {}
    try:
        for e in entries:
            fname = e["file"]
            if fname not in files:
                files[fname] = _open(os.path.join(folder, fname))
            # read with the low-level API into an array of the manifest's dtype and shape
            # (h5py's File[...] costs 0.3 ms an array in lookups); a different element count
            # in the file is an HDF5 error, a different dtype or value a failed checksum
            a = np.empty(tuple(e["shape"]), np.dtype(e["dtype"]))
            try:
                ds = h5py.h5d.open(files[fname], f"{e['dataset']}/{e['index']}".encode())
                if a.size:
                    ds.read(_space(a.shape), h5py.h5s.ALL, a)
            except (KeyError, OSError, ValueError, TypeError) as exc:
                raise SnapshotError(f"{os.path.join(folder, fname)}: cannot read partition "
                                    f"{e['index']} of '{e['dataset']}': {exc}") from None
            if checksum(a) != e["checksum"] or a.nbytes != e["nbytes"]:
                raise SnapshotError(f"{os.path.join(folder, fname)}: partition {e['index']} of "
                                    f"'{e['dataset']}' fails its checksum (the file was altered "
                                    "or damaged)")
            out.append(a)
    finally:
        for f in files.values():
            f.close()
    return out


def _space(shape: tuple[int, ...]) -> Any:
    """An HDF5 dataspace of ``shape`` (scalar for ``()``)."""
    import h5py

    return h5py.h5s.create_simple(shape) if shape else h5py.h5s.create(h5py.h5s.SCALAR)


def _file_access() -> Any:
    """File access properties under which closing a file closes whatever is still open in it:
    a written file is then whole on the disk when it is fsynced and renamed."""
    import h5py

    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)
    return fapl


def _open(path: str) -> Any:
    """A low-level HDF5 file id, open read-only; closing it closes what was opened in it."""
    import h5py

    if not os.path.exists(path):
        raise SnapshotError(f"{path}: missing")
    try:
        return h5py.h5f.open(path.encode(), h5py.h5f.ACC_RDONLY, fapl=_file_access())
    except OSError as exc:
        raise SnapshotError(f"{path}: not a readable HDF5 file (truncated?): {exc}") from None


def write_manifest(folder: str, data: dict[str, Any]) -> str:
    """Commit the snapshot in ``folder``: write its manifest durably (temporary name, fsync,
    rename, fsync of the folder). Returns the manifest's path; raises OSError if the disk
    refuses."""
    path = os.path.join(folder, MANIFEST)
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            # one line: with an indent, json falls back to its pure-Python encoder, which
            # took about half the time of committing a snapshot of many small partitions
            f.write(json.dumps(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(folder)
    except BaseException:
        _remove(tmp)
        raise
    return path


def read_manifest(folder: str) -> Manifest:
    """The manifest of the snapshot in ``folder``; raises SnapshotError if there is none (an
    uncommitted snapshot) or it cannot be read."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SnapshotError(f"{folder}: no {MANIFEST}: not a committed snapshot") from None
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SnapshotError(f"{path}: not a canary snapshot manifest of format {FORMAT}")
    problem = _manifest_problem(data, os.path.basename(os.path.normpath(folder)))
    if problem is not None:  # was a KeyError out of a resume
        raise SnapshotError(f"{path}: damaged manifest: {problem}")
    return Manifest(folder, data)


# what a resume reads from a manifest, and its type
_MANIFEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": int, "program": str, "digest": str, "script": str, "args": list, "workers": int,
    "position": dict, "run_seconds": (int, float), "tasks_run": int, "bytes": int,
    "arrays": list}
_ENTRY_FIELDS = ("dataset", "index", "file", "checksum", "nbytes")


def _manifest_problem(data: dict[str, Any], folder_name: str) -> str | None:
    """What is missing or wrong in a manifest's fields (None if nothing): every field a
    resume reads, each array entry's, and the id its folder's name says."""
    for key, kind in _MANIFEST_FIELDS.items():
        value = data.get(key)
        if value is None or isinstance(value, bool) or not isinstance(value, kind):
            return f"field '{key}' is missing or of the wrong type"
    if data["workers"] < 1:
        return f"'workers' is {data['workers']}"
    if not {"where", "seq"} <= set(data["position"]):
        return "'position' lacks 'where' or 'seq'"
    for k, e in enumerate(data["arrays"]):
        if not isinstance(e, dict) or not all(f in e for f in _ENTRY_FIELDS):
            return f"array entry {k} lacks one of {', '.join(_ENTRY_FIELDS)}"
    m = _SNAPSHOT_DIR.match(folder_name)
    if m is not None and int(m.group(1)) != data["id"]:
        return f"its id {data['id']} is not its folder's ({folder_name})"
    return None


def committed(root: str, damaged: dict[int, str] | None = None) -> list[Manifest]:
    """The committed snapshots under ``root``, oldest first. A folder without a manifest (an
    attempt not committed) is skipped; one whose manifest cannot be read is too, and is put
    in ``damaged`` (snapshot id -> why) when given. Raises SnapshotError if ``root`` is not a
    folder."""
    if not os.path.isdir(root):
        what = "is a file, not" if os.path.exists(root) else "no such"
        raise SnapshotError(f"{root}: {what} checkpoint directory")
    found = []
    for name in os.listdir(root):
        m = _SNAPSHOT_DIR.match(name)
        if m is None:
            continue
        try:
            found.append(read_manifest(os.path.join(root, name)))
        except SnapshotError as exc:
            if damaged is not None and os.path.exists(os.path.join(root, name, MANIFEST)):
                damaged[int(m.group(1))] = str(exc)
    return sorted(found, key=lambda s: s.id)


def next_id(root: str) -> int:
    """The id the next snapshot under ``root`` gets: above every folder there, committed or
    not (an abandoned attempt's folder is never reused)."""
    if not os.path.isdir(root):
        return 1
    ids = [int(m.group(1)) for m in map(_SNAPSHOT_DIR.match, os.listdir(root)) if m]
    return max(ids, default=0) + 1


def verify(snap: Manifest) -> list[str]:
    """What is wrong with a committed snapshot's files (empty if nothing): missing, truncated
    or failing files are named. Reads every array once."""
    entries = list(snap.data["arrays"]) + list(snap.data.get("results", []))
    by_file: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_file.setdefault(e["file"], []).append(e)
    problems = []
    for _, rows in sorted(by_file.items()):
        try:
            read_arrays(snap.path, rows)
        except SnapshotError as exc:
            problems.append(str(exc))
    return problems


def choose(root: str, since: int = 1) -> tuple[Manifest, list[str]]:
    """The newest committed snapshot under ``root`` whose manifest and files all check out, and
    one line per newer snapshot passed over (saying why). Only snapshots numbered ``since`` or
    more count (a run restarting takes only its own: :func:`next_id` before it started).
    Raises SnapshotError naming what is wrong with each if none is usable."""
    damaged: dict[int, str] = {}
    snaps = {s.id: s for s in committed(root, damaged)}
    passed: list[str] = []
    for snap_id in sorted({k for k in (*snaps, *damaged) if k >= since}, reverse=True):
        problems = [damaged[snap_id]] if snap_id in damaged else verify(snaps[snap_id])
        if not problems:
            return snaps[snap_id], [f"{p}; falling back to the one before" for p in passed]
        passed.append(f"snapshot {snap_id} is damaged ({'; '.join(problems)})")
    detail = (f" ({'; '.join(passed)})" if passed else
              " (it holds none: a job writes them with `canary run --checkpoint DIR`)")
    raise SnapshotError(f"{root}: no usable snapshot{detail}")


def prune(root: str, keep: int, newest: int) -> None:
    """After snapshot ``newest`` is committed: delete committed snapshots but the newest
    ``keep``, and every uncommitted folder older than ``newest`` (abandoned attempts)."""
    kept = {s.id for s in committed(root)[-keep:]}
    for name in os.listdir(root):
        m = _SNAPSHOT_DIR.match(name)
        if m is None:
            continue
        snap = int(m.group(1))
        if snap < newest and snap not in kept:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def describe(snap: Manifest) -> dict[str, Any]:
    """One line of ``canary snapshots``: id, position, time, bytes, workers, checksum status."""
    problems = verify(snap)
    d = snap.data
    return {"id": snap.id, "path": snap.path, "position": d["position"]["where"],
            "seq": d["position"]["seq"], "created": d["created"],
            "created_iso": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(d["created"])),
            "run_seconds": d["run_seconds"], "bytes": d["bytes"], "workers": d["workers"],
            "program": d["program"], "script": d["script"], "args": d["args"],
            "checksums": "ok" if not problems else "damaged: " + "; ".join(problems)}


def check_resumable(snap: Manifest, digest: str, statements: list[str],
                    workers: int | None = None, sources: dict[str, str] | None = None,
                    sites: Sequence[str] = ()) -> None:
    """Raise SnapshotMismatchError naming the first difference if the declared program (its
    digest and statements, and its functions' ``sources`` where given: see
    :meth:`canary.Program.sources`) is not the one ``snap`` was taken of. Given the
    ``workers`` of the run that resumes, a dataset's partition count that changed with the
    number of workers is said to be that, with what to call instead. Given ``sites`` (the
    declared program's :meth:`canary.Program.statement_sites`), the first statement that
    differs is named with the driver line that declares it now, and when one program is the
    other's beginning, the first statement the declared program has beyond it (the snapshot
    records no lines: a line is not part of the program)."""
    if snap.data["digest"] == digest:
        theirs_src = snap.data.get("sources")
        if sources is None or theirs_src is None:  # a snapshot taken before sources were kept
            return
        for label, h in sources.items():
            if theirs_src.get(label) != h:
                raise SnapshotMismatchError(
                    f"snapshot {snap.id} in {snap.path} was taken with other code: the function "
                    f"of {label} has changed since (its source text differs). Resuming would "
                    "continue with other code than computed the state so far: resume with the "
                    "code it was taken with, or start afresh without --resume")
        return
    theirs = list(snap.data.get("statements", []))
    for k, (a, b) in enumerate(zip(theirs, statements)):
        if a != b:
            why = (" (resume with the script and arguments it was taken with, or start afresh "
                   "without --resume)")
            if workers is not None and snap.workers != workers and a.startswith("dataset ") \
                    and a.split("/")[0] == b.split("/")[0]:
                why = (f": the snapshot was taken on {snap.workers} workers and this run has "
                       f"{workers}; a partition count computed from the number of ranks changes "
                       "with it. Compute it from canary.driver.planned_workers(comm), which is "
                       "the snapshot's number of workers when resuming")
            at = declared_at(sites, k)
            raise SnapshotMismatchError(
                f"snapshot {snap.id} in {snap.path} is of another program: statement "
                f"{k}{at}{',' if at else ''} was '{a}' and is now '{b}'{why}")
    # one program is the other's beginning: the declared one's first statement past the
    # snapshot's, where it has one (the snapshot's own have no line to name)
    at = declared_at(sites, len(theirs))
    new = f"; statement {len(theirs)}{at}, is new" if at else ""
    raise SnapshotMismatchError(
        f"snapshot {snap.id} in {snap.path} is of another program ({len(theirs)} statements, "
        f"now {len(statements)}{new}); resume with the script and arguments it was taken with")


def check_same_job(snap: Manifest, script: str, args: Sequence[str]) -> None:
    """Raise SnapshotMismatchError naming the difference if ``script`` and ``args`` are not the
    ones the snapshot records (the script compared by its resolved path)."""
    was_script, was_args = snap.data["script"], list(snap.data["args"])
    if os.path.realpath(script) != os.path.realpath(was_script):
        raise SnapshotMismatchError(
            f"snapshot {snap.id} was taken of {was_script}, not {script} (leave SCRIPT out "
            "to resume the job the snapshot was taken of)")
    if list(args) != was_args:
        k = next((k for k, (a, b) in enumerate(zip(was_args, args)) if a != b),
                 min(len(was_args), len(args)))
        was = repr(was_args[k]) if k < len(was_args) else "absent"
        now = repr(args[k]) if k < len(args) else "absent"
        raise SnapshotMismatchError(
            f"snapshot {snap.id} was taken with arguments {' '.join(was_args) or '(none)'}; "
            f"argument {k + 1} was {was} and is now {now} (leave SCRIPT and its arguments "
            "out to resume with the recorded ones)")


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder or ".", os.O_RDONLY)
    except OSError:  # a platform whose folders cannot be opened: the rename is all we have
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# -- what the runtimes call (the state machines decide; these do the I/O) -------------------


def save_part(root: str, snap: int, worker: int,
              arrays: Sequence[tuple[str, int, np.ndarray, int]]
              ) -> tuple[list[dict[str, Any]], str | None]:
    """Write worker ``worker``'s part of snapshot ``snap`` under ``root``: its manifest entries,
    or an error (the disk refused, a value HDF5 cannot hold) and no entries."""
    folder = snapshot_folder(root, snap)
    try:
        os.makedirs(folder, exist_ok=True)
        return write_arrays(os.path.join(folder, worker_file_name(worker)), arrays), None
    except (OSError, SnapshotError) as exc:
        return [], str(exc)


def commit(root: str, keep: int, snap: int, manifest: dict[str, Any],
           results: Sequence[tuple[str, int, np.ndarray]]) -> str | None:
    """Commit snapshot ``snap``: write the controller's reports, then the manifest, then delete
    snapshots beyond the newest ``keep``. Returns an error if the disk refused (the snapshot
    then does not exist), else None."""
    folder = snapshot_folder(root, snap)
    try:
        os.makedirs(folder, exist_ok=True)
        rows = [(name, k, a, -1) for name, k, a in results]
        data = dict(manifest, created=time.time(),
                    results=write_arrays(os.path.join(folder, CONTROLLER_FILE), rows))
        write_manifest(folder, data)
    except (OSError, SnapshotError) as exc:
        return str(exc)
    prune(root, keep, snap)
    return None


def load_part(snap: Manifest, keys: Sequence[tuple[str, int]]
              ) -> dict[tuple[str, int], tuple[np.ndarray, int] | None]:
    """The values of partitions ``keys`` (``(dataset, index)``) in ``snap`` with their
    ``last_seq``; None for a partition the snapshot holds no value of. Raises SnapshotError
    (see :func:`read_arrays`)."""
    table = snap.arrays()
    wanted = [table[k] for k in keys if k in table]
    values = read_arrays(snap.path, wanted)
    out: dict[tuple[str, int], tuple[np.ndarray, int] | None] = {k: None for k in keys}
    for e, a in zip(wanted, values):
        out[(e["dataset"], int(e["index"]))] = (a, int(e["last_seq"]))
    return out


def load_results(snap: Manifest) -> dict[str, list[np.ndarray]]:
    """The reports the controller had received when ``snap`` was taken, by dataset name."""
    entries = sorted(snap.data.get("results", []), key=lambda e: (e["dataset"], e["index"]))
    out: dict[str, list[np.ndarray]] = {}
    for e, a in zip(entries, read_arrays(snap.path, entries)):
        out.setdefault(e["dataset"], []).append(a)
    return out
