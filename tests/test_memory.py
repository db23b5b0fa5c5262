"""What a worker reads of its machine's memory (``canary.memory``), on trees of Linux's files
made for each case, and on this machine."""

from __future__ import annotations

import sys
from pathlib import Path

from canary.memory import memory_pool, memory_room

GiB = 1 << 30
MiB = 1 << 20


def machine(root: Path, total_kb: int, available_kb: int, cgroup: str = "0::/\n",
            boot: str = "b00t") -> Path:
    """A tree with ``/proc/meminfo``, ``/proc/self/cgroup`` and a boot id under ``root``."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal:       {total_kb} kB\nMemFree:        1 kB\n"
                                       f"MemAvailable:   {available_kb} kB\nBuffers: 0 kB\n")
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")
    return root


def group(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_without_limits_the_machine_s_available_memory_is_the_room(tmp_path: Path) -> None:
    root = machine(tmp_path, 16 * GiB // 1024, 10 * GiB // 1024)
    group(root / "sys/fs/cgroup", {"memory.current": "123\n"})  # v2 root: no memory.max
    assert memory_room(str(root)) == (10 * GiB, 16 * GiB)
    assert memory_pool(str(root)) == "b00t"


def test_a_v2_limit_bounds_the_room_less_the_pages_the_kernel_can_drop(tmp_path: Path) -> None:
    # a Slurm job or a container: 4 GiB, 3 GiB used of which 1 GiB of file pages it can drop
    root = machine(tmp_path, 64 * GiB // 1024, 50 * GiB // 1024, "0::/slurm/job_7/step_0\n")
    group(root / "sys/fs/cgroup/slurm/job_7", {
        "memory.max": f"{4 * GiB}\n", "memory.current": f"{3 * GiB}\n",
        "memory.stat": f"anon 1\nactive_file 5\ninactive_file {GiB}\nslab 3\n"})
    group(root / "sys/fs/cgroup/slurm/job_7/step_0", {
        "memory.max": "max\n", "memory.current": f"{3 * GiB}\n"})
    assert memory_room(str(root)) == (2 * GiB, 4 * GiB)
    assert memory_pool(str(root)) == "b00t:sys/fs/cgroup/slurm/job_7"


def test_the_tightest_of_nested_limits_counts(tmp_path: Path) -> None:
    root = machine(tmp_path, 64 * GiB // 1024, 50 * GiB // 1024, "0::/a/b\n")
    group(root / "sys/fs/cgroup/a", {"memory.max": f"{8 * GiB}", "memory.current": f"{7 * GiB}"})
    group(root / "sys/fs/cgroup/a/b", {"memory.max": f"{6 * GiB}",
                                       "memory.current": f"{5 * GiB}"})
    assert memory_room(str(root)) == (GiB, 6 * GiB)


def test_a_v1_memory_limit_is_read_too(tmp_path: Path) -> None:
    root = machine(tmp_path, 64 * GiB // 1024, 50 * GiB // 1024,
                   "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n")
    group(root / "sys/fs/cgroup/memory", {"memory.limit_in_bytes": "9223372036854771712\n",
                                          "memory.usage_in_bytes": f"{30 * GiB}\n"})
    group(root / "sys/fs/cgroup/memory/docker/abc", {
        "memory.limit_in_bytes": f"{2 * GiB}\n", "memory.usage_in_bytes": f"{GiB + 512 * MiB}\n",
        "memory.stat": f"cache 9\ntotal_inactive_file {256 * MiB}\n"})
    assert memory_room(str(root)) == (768 * MiB, 2 * GiB)
    assert memory_pool(str(root)) == "b00t:sys/fs/cgroup/memory/docker/abc"


def test_a_group_over_its_limit_has_no_room_rather_than_less_than_none(tmp_path: Path) -> None:
    root = machine(tmp_path, 64 * GiB // 1024, 50 * GiB // 1024, "0::/g\n")
    group(root / "sys/fs/cgroup/g", {"memory.max": f"{GiB}", "memory.current": f"{2 * GiB}"})
    assert memory_room(str(root)) == (0, GiB)


def test_where_nothing_can_be_read_nothing_is_known(tmp_path: Path) -> None:
    assert memory_room(str(tmp_path)) == (-1, -1)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemFree: 5 kB\n")  # no total: nothing known
    assert memory_room(str(tmp_path)) == (-1, -1)
    (tmp_path / "proc/meminfo").write_text("MemTotal: 8 kB\nMemFree: 5 kB\n")  # before 3.14
    assert memory_room(str(tmp_path)) == (5 * 1024, 8 * 1024)  # and no control groups to read
    root = machine(tmp_path / "m", 8 * GiB // 1024, GiB // 1024, "garbage\n")
    assert memory_room(str(root)) == (GiB, 8 * GiB)  # an unreadable group line is passed over


def test_this_machine_s_figures_are_plausible() -> None:
    free, total = memory_room()
    if sys.platform == "linux":
        assert 0 < free <= total
    else:  # no /proc: nothing known, and moves are not limited
        assert (free, total) == (-1, -1)
    assert memory_pool() == memory_pool() != ""
