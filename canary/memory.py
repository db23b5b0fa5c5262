"""How much memory a worker's machine has left: what the balancing policy reads before it moves
a partition onto a worker (a move that overfills a machine gets a worker killed by the kernel,
and the job with it).

A thin edge over Linux's files, read by the worker's runtime with each load report (``root``
lets tests give a tree of their own). Elsewhere nothing is known, (-1, -1), and the policy
moves as if memory were plenty.

* :func:`memory_room` is the machine's available memory (``MemAvailable``: free memory and the
  page cache the kernel can drop), bounded by every memory limit of the process's control
  groups (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, as Slurm and containers set them),
  where the group's own usage counts without the file pages it could drop
  (``inactive_file``), as the kernel reclaims those before it kills anything.
* :func:`memory_pool` names what the figure is of: workers that report the same pool (the same
  machine's boot and the same control group) draw on one budget, and the policy counts a move
  onto any of them against it.
"""

from __future__ import annotations

import os

# cgroup v1's "no limit" is the largest page-aligned int64; anything above this is no limit
_NO_LIMIT = 1 << 60


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _meminfo(root: str) -> tuple[int, int]:
    text = _read(os.path.join(root, "proc/meminfo"))
    if text is None:
        return -1, -1
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    if "MemTotal" not in fields:
        return -1, -1
    # kernels before 3.14 lack MemAvailable: free memory is the floor
    return fields.get("MemAvailable", fields.get("MemFree", 0)), fields["MemTotal"]


def _cgroup_dirs(root: str) -> list[tuple[str, str, str, str]]:
    """The memory control groups of this process and every one above it, innermost first:
    ``(folder, limit file, usage file, its inactive file pages' name in memory.stat)``."""
    text = _read(os.path.join(root, "proc/self/cgroup"))
    if text is None:
        return []
    found = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: one unified hierarchy
            base = os.path.join(root, "sys/fs/cgroup")
            names = ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base = os.path.join(root, "sys/fs/cgroup/memory")
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        rel = path.strip("/")
        while True:
            folder = os.path.join(base, rel) if rel else base
            found.append((folder, *names))
            if not rel:
                break
            rel = os.path.dirname(rel)
    return found


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None  # "max" (v2): no limit


def memory_room(root: str = "/") -> tuple[int, int]:
    """``(bytes this process may still allocate, bytes it may use in all)`` on this machine:
    ``MemAvailable`` and ``MemTotal`` bounded by each memory control group's limit less its
    usage (its droppable file pages left out). ``(-1, -1)`` where ``/proc/meminfo`` cannot be
    read (not Linux). Never raises."""
    free, total = _meminfo(root)
    if total < 0:
        return -1, -1
    for folder, limit_file, usage_file, inactive in _cgroup_dirs(root):
        limit = _number(_read(os.path.join(folder, limit_file)))
        if limit is None or limit >= _NO_LIMIT:
            continue
        usage = _number(_read(os.path.join(folder, usage_file)))
        if usage is None:
            continue
        droppable = 0
        for line in (_read(os.path.join(folder, "memory.stat")) or "").splitlines():
            name, _, value = line.partition(" ")
            if name == inactive and value.strip().isdigit():
                droppable = int(value)
                break
        free = min(free, max(limit - max(usage - droppable, 0), 0))
        total = min(total, limit)
    return free, total


def memory_pool(root: str = "/") -> str:
    """A name shared by the workers that draw on one memory budget: this machine's boot id (the
    host name where there is none) and the innermost memory control group with a limit."""
    boot = (_read(os.path.join(root, "proc/sys/kernel/random/boot_id")) or "").strip()
    name = boot or os.uname().nodename
    for folder, limit_file, _, _ in _cgroup_dirs(root):
        limit = _number(_read(os.path.join(folder, limit_file)))
        if limit is not None and limit < _NO_LIMIT:
            return f"{name}:{os.path.relpath(folder, root)}"
    return name
