"""`canary doctor`: one rank per slot reports its host and environment, and MPI links are timed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from canary.doctor import numba_cache_status, problems, summary
from tests.conftest import ROOT, mpirun


def rank_row(rank: int, host: str = "h1", cores: int = 4, **changed: Any) -> dict[str, Any]:
    row = {"kind": "rank", "rank": rank, "host": host, "cores": cores, "python": "3.11.7",
           "canary": "/opt/canary", "numpy": "2.0", "numba": "0.60", "mpi4py": "4.0",
           "mpi": "MPICH Version: 4.2",
           "numba_cache": {"dir": "/opt/apps/__pycache__", "writable": True, "cached_kernels": 3}}
    row.update(changed)
    return row


def test_hosts_set_up_differently_and_unwritable_caches_are_problems() -> None:
    rows = [rank_row(0), rank_row(1, "h2", numba="0.59"),
            rank_row(2, "h2", numba="0.59",
                     numba_cache={"dir": "/ro", "writable": False, "cached_kernels": 0})]
    found, notes = problems(rows)
    assert found[0] == ("the ranks differ in numba: 0.60 on rank(s) 0; 0.59 on rank(s) 1, 2 "
                        "(install the same environment at the same path on every host)")
    assert "rank 2 on h2 cannot write numba's cache /ro" in found[1] and len(found) == 2
    assert notes == []
    links = [{"kind": "link", "ranks": [0, r], "hosts": ["h1", "h2"], "same_host": False,
              "latency_us": 30.0 + r, "bandwidth_gb_s": 1.1} for r in (1, 2)]
    text = summary(rows + links, found, notes)
    assert "3 rank(s) on 2 host(s)" in text and "h2: rank(s) 1, 2; 4 core(s)" in text
    assert "MPI between hosts: latency 31.5 us, bandwidth 1.10 GB/s" in text
    assert "slowest: rank 0 to rank 2 on h2, 32.0 us" in text and "problem: the ranks" in text


def test_more_ranks_than_cores_on_a_host_is_a_note_not_a_problem() -> None:
    found, notes = problems([rank_row(0, cores=1), rank_row(1, cores=1)])
    assert found == [] and notes == ["host h1 runs 2 ranks on 1 core(s): they share cores "
                                     "(fine for the controller, slower for workers)"]
    assert "no problem found" in summary([rank_row(0)], [], [])


def test_ranks_bound_a_core_each_share_no_core() -> None:
    # mpiexec -bind-to core: one core each, which the count alone took for 3 ranks on 1 core
    bound = [rank_row(r, cores=1, affinity=[r]) for r in range(3)]
    assert problems(bound) == ([], [])
    # bound, but two to a core (more ranks than cores): only those two are named
    wrapped = [rank_row(r, cores=1, affinity=[r % 2]) for r in range(3)] + [
        rank_row(3, "h2", cores=1, affinity=[0])]
    assert problems(wrapped)[1] == ["host h1 runs 2 ranks on 1 core(s): they share cores "
                                    "(fine for the controller, slower for workers)"]


def test_numba_cache_status_follows_numba_cache_dir(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "k.nbi").write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    got = numba_cache_status()
    assert got == {"dir": str(tmp_path), "exists": True, "writable": True, "cached_kernels": 1}
    # a folder two levels down that numba will make: it was "NOT writable"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "new" / "deeper"))
    assert numba_cache_status()["writable"] is True
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert numba_cache_status(tmp_path)["dir"] == str(tmp_path / "apps" / "__pycache__")


def test_the_rank_side_reports_every_rank_and_a_link_to_each_on_three_ranks() -> None:
    r = mpirun(3, "canary/doctor.py", "--ranks", "--quick")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["rank"] for x in rows if x["kind"] == "rank"] == [0, 1, 2]
    links = [x for x in rows if x["kind"] == "link"]
    assert [x["ranks"] for x in links] == [[0, 1], [0, 2]]
    assert all(x["same_host"] and x["latency_us"] > 0 and x["bandwidth_gb_s"] > 0 for x in links)
    assert {x["host"] for x in rows if x["kind"] == "rank"} == {socket.gethostname()}


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "canary.cli", "doctor", "--quick", *args],
                          cwd=ROOT, env=dict(os.environ), capture_output=True, text=True,
                          timeout=150)


def test_canary_doctor_starts_one_rank_per_slot_of_a_hostfile(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{socket.gethostname()}:1\nlocalhost:1\n")
    r = doctor("-f", str(hosts))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert sum(x["kind"] == "rank" for x in rows) == 2
    assert rows[-1] == {"kind": "summary", "ranks": 2, "problems": [], "notes": []}
    assert "canary doctor: 2 rank(s) on 1 host(s)" in r.stderr
    assert "MPI same host: latency" in r.stderr and "numba cache writable" in r.stderr


def test_canary_doctor_refuses_hosts_it_cannot_use_within_seconds(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\nno-such-host.invalid:1\n")
    r = doctor("-f", str(hosts), "--reach-timeout", "2")
    assert r.returncode == 2 and r.stdout == ""
    assert "canary doctor: host 'no-such-host.invalid' does not resolve" in r.stderr
    r = doctor("-f", str(tmp_path / "missing"))
    assert r.returncode == 2 and "hostfile not found" in r.stderr
    # -n 0 ran 2 ranks; --timeout 0 ended in an empty mpiexec error; -1 s was "within -1 s"
    for args, says in ((("-n", "0"), "-n must be at least 2, got 0"),
                       (("--timeout", "0"), "--timeout must be at least 1, got 0"),
                       (("--reach-timeout", "-1"), "--reach-timeout must be above 0 s")):
        r = doctor(*args)
        assert r.returncode == 2 and says in r.stderr, r.stderr
