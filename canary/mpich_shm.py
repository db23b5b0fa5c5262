"""MPICH's shared-memory files, removed when a job does not end well.

MPICH puts the memory that the ranks of one host share in a file, ``/dev/shm/mpich_shm_*``
(3 to 4 MB for a few ranks), and removes it in ``MPI_Finalize``. A job that ends with
``MPI_Abort``, or whose rank is killed, never finalizes, and ``/dev/shm`` is memory: each
failed job would keep its file's memory until the machine restarts. So:

* a rank about to abort the job removes the names of the files it has mapped
  (:func:`release_own_segments`); every rank of its host has them mapped already, so the
  memory stays theirs until they end, and is then freed;
* ``canary run``, after a job that did not end well, removes the files on its host that were
  made or written since the job started and that no process maps any more
  (:func:`remove_orphans`): those of ranks that were killed. (tmpfs dates a file by its last
  write, so its age cannot tell an orphan from a file being made.)
* ``canary run``, after a job that did not end well, also removes the topology files of
  MPICH's hydra (``/tmp/hydra_hwloc_xmlfile_*``) made since the job started that no process
  holds open (:func:`remove_orphan_topologies`): each host's proxy makes one, holds it open,
  and removes it when it ends well; a killed proxy or mpiexec leaves it.
* ``canary run``, before each job, removes this user's files that no process maps (or holds
  open, for topology files) and that have not changed for a minute (:func:`remove_stale`):
  those a job left when nothing was there to clean up after it (its ``canary run`` killed
  with SIGKILL, a plain ``mpiexec``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

PREFIX = "mpich_shm_"
SHM_FOLDER = "/dev/shm"
TOPOLOGY_PREFIX = "hydra_hwloc_xmlfile_"  # hydra's proxy makes it in /tmp, whatever TMPDIR says
TOPOLOGY_FOLDER = "/tmp"


def mapped_segments(maps: Iterable[str]) -> list[str]:
    """The MPICH shared-memory files named in the lines of a ``/proc/PID/maps``, each once, in
    order; files already removed (``(deleted)``) are left out."""
    found: list[str] = []
    for line in maps:
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = fields[5].strip()
        if path.endswith(" (deleted)"):
            continue
        if os.path.basename(path).startswith(PREFIX) and path not in found:
            found.append(path)
    return found


def release_own_segments() -> list[str]:
    """Remove the names of the MPICH files this process maps; return those removed.

    For a rank that is about to abort the job: the mapped memory stays valid for every process
    that maps it. Never raises: where ``/proc`` cannot be read (not Linux), nothing is done.
    """
    try:
        with open("/proc/self/maps") as f:
            paths = mapped_segments(f)
    except OSError:
        return []
    removed = []
    for path in paths:
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # another rank of this host was first
            pass
    return removed


def remove_orphans(since: float, settle: float = 0.05, folder: str = SHM_FOLDER,
                   wait: float = 0.0) -> list[str]:
    """Remove the MPICH files in ``folder`` of this user that were made or written at ``since``
    (a ``time.time()``) or later and that no process maps; return their paths.

    A file is removed only if no process maps it in two looks ``settle`` seconds apart, and it
    was not written in between: MPICH maps a file right after making it, and the process that
    made it may not have got there at the first look. Only processes whose memory maps this
    user can read are seen; others cannot open this user's files. A file still mapped is looked
    at again for up to ``wait`` seconds: a plain ``mpiexec`` may return while the ranks it
    killed are still exiting. Never raises.
    """
    deadline = time.monotonic() + wait
    removed = _remove_unmapped(since, settle, folder)
    while time.monotonic() < deadline and any(
            path not in removed for path in _changed_since(folder, since)):
        time.sleep(settle)
        removed += _remove_unmapped(since, settle, folder)
    return removed


def _remove_unmapped(since: float, settle: float, folder: str) -> list[str]:
    """One pass of :func:`remove_orphans` (its two looks)."""
    candidates = _changed_since(folder, since)
    for look in range(2):
        if not candidates:
            return []
        if look:
            time.sleep(settle)
        in_use = _mapped_anywhere()
        now = _changed_since(folder, since)
        candidates = {path: ctime for path, ctime in candidates.items()
                      if path not in in_use and now.get(path) == ctime}
    return _unlink(candidates)


def remove_stale(older_than: float = 60.0, folder: str = SHM_FOLDER,
                 now: float | None = None, topologies: str = TOPOLOGY_FOLDER) -> list[str]:
    """Remove this user's MPICH files in ``folder`` that no process maps and that have not
    changed for ``older_than`` seconds before ``now`` (default: the time now), and hydra's
    topology files in ``topologies`` as old that no process holds open; return their paths.

    Every rank of a running job maps its file, and a file being made is mapped within moments,
    so such a file belongs to no job. Removing the name of a file that a process this user
    cannot see still maps (in another PID namespace) costs it nothing: the mapping stays.
    Looks at the processes' maps only when there is a candidate. Never raises.
    """
    cutoff = (time.time() if now is None else now) - older_than
    candidates = {path for path, changed in _own_files(folder).items() if changed < cutoff}
    removed = _unlink(candidates - _mapped_anywhere()) if candidates else []
    return removed + remove_orphan_topologies(0.0, topologies, before=cutoff)


def _unlink(paths: Iterable[str]) -> list[str]:
    """Remove ``paths``, in order; return those removed (another process may be first)."""
    removed = []
    for path in sorted(paths):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _changed_since(folder: str, since: float) -> dict[str, float]:
    """This user's MPICH files in ``folder`` changed at ``since`` or later, with when."""
    return {path: changed for path, changed in _own_files(folder).items() if changed >= since}


def _own_files(folder: str, prefix: str = PREFIX) -> dict[str, float]:
    """This user's MPICH files (named ``prefix``...) in ``folder``, with when each last changed
    (its ctime)."""
    found = {}
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if not entry.name.startswith(prefix):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_uid == os.getuid():
                    found[entry.path] = st.st_ctime
    except OSError:
        pass
    return found


def _pids() -> list[str]:
    """The processes in ``/proc`` (none where there is no ``/proc``)."""
    try:
        return [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _mapped_anywhere() -> set[str]:
    """The MPICH files mapped by the processes whose memory maps this user can read."""
    in_use: set[str] = set()
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/maps") as f:
                in_use.update(mapped_segments(f))
        except OSError:  # gone, or another user's
            continue
    return in_use


def remove_orphan_topologies(since: float, folder: str = TOPOLOGY_FOLDER,
                             before: float | None = None) -> list[str]:
    """Remove this user's hydra topology files in ``folder`` made or changed at ``since`` (a
    ``time.time()``) or later, and before ``before`` if given, that no process holds open;
    return their paths. A running proxy holds its file open from making it (``mkstemp``) to
    removing it. Never raises."""
    new = {path for path, changed in _own_files(folder, TOPOLOGY_PREFIX).items()
           if changed >= since and (before is None or changed < before)}
    return _unlink(new - _open_anywhere()) if new else []


def _open_anywhere() -> set[str]:
    """The paths held open by the processes whose descriptors this user can read."""
    held: set[str] = set()
    for pid in _pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
    return held
