"""Hosts for `canary run`: hostfiles, --ppn, Slurm allocations, and hosts that cannot be used."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from canary.cli import main
from canary.hosts import (
    Host,
    HostError,
    check_reachable,
    expand_counts,
    expand_nodelist,
    launch_hosts,
    parse_hostfile,
    plan_ranks,
    slurm_hosts,
)
from tests.conftest import ROOT


def hostfile(tmp_path: Path, text: str) -> str:
    path = tmp_path / "hosts"
    path.write_text(text)
    return str(path)


def test_hostfile_reads_mpich_and_open_mpi_lines_comments_and_blanks(tmp_path: Path) -> None:
    path = hostfile(tmp_path, "# cluster\nnode1:4\n\nnode2 slots=2 max_slots=8  # big\nnode3\n")
    assert parse_hostfile(path) == [Host("node1", 4, f"{path}:2"), Host("node2", 2, f"{path}:4"),
                                    Host("node3", None, f"{path}:5")]


@pytest.mark.parametrize("text, message", [
    ("node1:x\n", r"hosts:1: slots must be a whole number >= 1, got 'x'"),
    ("node1:0\n", r"slots must be a whole number >= 1, got '0'"),
    ("node1:\u00b2\n", r"hosts:1: slots must be a whole number >= 1, got '\u00b2'"),  # int() failed
    ("node1 cores=4\n", r"hosts:1: cannot read 'node1 cores=4'"),
    ("node/1\n", r"'node/1' is not a host name"),
    ("# only a comment\n\n", r"names no host"),
    ("a:1\nb:1\na:2\n", r"hosts:3: host 'a' is listed again \(first at .*hosts:1\)"),
])
def test_a_malformed_hostfile_is_an_error_naming_file_and_line(tmp_path: Path, text: str,
                                                                message: str) -> None:
    with pytest.raises(HostError, match=message):
        parse_hostfile(hostfile(tmp_path, text))


def test_a_missing_hostfile_is_an_error() -> None:
    with pytest.raises(HostError, match="hostfile not found: /no/such/hosts"):
        parse_hostfile("/no/such/hosts")


def test_slurm_node_lists_and_counts_expand_as_slurm_writes_them() -> None:
    assert expand_nodelist("node[01-03,7],gpu-[1-2]x,login") == [
        "node01", "node02", "node03", "node7", "gpu-1x", "gpu-2x", "login"]
    assert expand_nodelist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_counts("2(x3),1", "SLURM_TASKS_PER_NODE") == [2, 2, 2, 1]
    for bad in ("node[1-3", "node]1", "node[3-1]", "node[a-b]"):
        with pytest.raises(HostError, match="SLURM_JOB_NODELIST"):
            expand_nodelist(bad)
    with pytest.raises(HostError, match=r"SLURM_TASKS_PER_NODE='2\(y3\)'"):
        expand_counts("2(y3)", "SLURM_TASKS_PER_NODE")


def test_a_slurm_allocation_is_read_from_its_environment() -> None:
    assert slurm_hosts({}) is None
    env = {"SLURM_JOB_NODELIST": "cn[1-3]", "SLURM_TASKS_PER_NODE": "4(x2),2"}
    assert [(h.name, h.slots) for h in slurm_hosts(env) or []] == [
        ("cn1", 4), ("cn2", 4), ("cn3", 2)]
    env = {"SLURM_NODELIST": "cn[1-2]", "SLURM_NTASKS_PER_NODE": "8"}
    assert [(h.name, h.slots) for h in slurm_hosts(env) or []] == [("cn1", 8), ("cn2", 8)]
    assert [h.slots for h in slurm_hosts({"SLURM_JOB_NODELIST": "a,b"}) or []] == [None, None]
    with pytest.raises(HostError, match="gives 2 nodes but SLURM_JOB_NODELIST names 3"):
        slurm_hosts({"SLURM_JOB_NODELIST": "cn[1-3]", "SLURM_TASKS_PER_NODE": "4,4"})


def test_inside_slurm_canary_run_places_ranks_on_the_allocation_without_a_hostfile() -> None:
    env = {"SLURM_JOB_NODELIST": "cn[1-2]", "SLURM_TASKS_PER_NODE": "3(x2)"}
    got = launch_hosts(None, None, None, hydra=True, environ=env)
    # the allocation's 6 tasks: 5 workers and the controller; srun reaches the nodes (no ssh)
    assert got.workers == 5 and got.source == "the Slurm allocation"
    assert got.hostfile_text == "cn1:3\ncn2:3\n"
    got = launch_hosts(None, 2, 2, hydra=True, environ=env)
    assert got.hostfile_text == "cn1:2\ncn2:1\n"
    plain = launch_hosts(None, None, None, hydra=True, environ={})
    assert plain.workers == 2 and plain.hostfile_text is None and plain.source is None
    # -n 100000000000 on this machine alone: mpiexec grew to GBs trying
    import os

    from canary.hosts import MAX_RANKS_PER_CORE

    cores = os.cpu_count() or 1
    assert launch_hosts(None, MAX_RANKS_PER_CORE * cores - 1, None, hydra=True,
                        environ={}).hostfile_text is None
    with pytest.raises(HostError, match=rf"-n {10**11}: .* is more than {MAX_RANKS_PER_CORE} a "
                                        r"core; for more machines give -f HOSTFILE"):
        launch_hosts(None, 10**11, None, hydra=True, environ={})


def test_ppn_fills_hosts_in_order_and_warns_above_a_hosts_slots() -> None:
    hosts = [Host("a", 2, "f:1"), Host("b", 4, "f:2")]
    plan = plan_ranks(hosts, 5, ppn=3)
    assert plan.hostfile_text() == "a:3\nb:2\n"
    assert plan.warnings == ["--ppn 3 is more than the 2 slots of host a (f:1): its ranks "
                             "will share cores"]
    assert plan_ranks(hosts, 3).hostfile_text() == "a:2\nb:1\n" and not plan_ranks(hosts, 3).warnings
    with pytest.raises(HostError, match=r"7 ranks .* do not fit --ppn 3 x 2 host\(s\) = 6: use "
                                        r"fewer workers \(-n 5\)"):
        plan_ranks(hosts, 7, ppn=3)
    with pytest.raises(HostError, match=r"do not fit the 6 slot\(s\) of 2 host\(s\)"):
        plan_ranks(hosts, 7)
    # one slot holds the controller alone: no worker count fits it, so none is suggested
    with pytest.raises(HostError, match=r"do not fit --ppn 1 x 1 host\(s\) = 1: use more hosts, "
                                        r"or a larger --ppn$"):
        plan_ranks(hosts[:1], 3, ppn=1)
    with pytest.raises(HostError, match="--ppn must be at least 1"):
        plan_ranks(hosts, 2, ppn=0)


def test_this_machine_under_two_names_is_reachable_without_ssh() -> None:
    check_reachable([Host("localhost"), Host(socket.gethostname())], timeout=2, ssh=None)


def test_an_unresolvable_or_unreachable_host_is_a_clear_error_within_seconds() -> None:
    t0 = time.monotonic()
    with pytest.raises(HostError) as err:
        check_reachable([Host("localhost"), Host("no-such-host.invalid", 2, "hosts:2")],
                        timeout=2)
    assert "host 'no-such-host.invalid' does not resolve" in str(err.value)
    assert "[hosts:2]" in str(err.value) and "localhost" not in str(err.value)
    # an address that resolves but is no machine (TEST-NET-1, RFC 5737): ssh gives up
    with pytest.raises(HostError, match=r"host '192\.0\.2\.1'"):
        check_reachable([Host("192.0.2.1")], timeout=1)
    with pytest.raises(HostError, match="ssh is not installed"):
        check_reachable([Host("192.0.2.1")], timeout=1, ssh=None)
    assert time.monotonic() - t0 < 60  # a bound on hanging, not a timing: ssh alone waits 3 s


def test_ppn_with_another_mpi_is_refused_and_its_hostfile_passes_as_it_is(tmp_path: Path) -> None:
    path = hostfile(tmp_path, "node1 slots=2\n")
    with pytest.raises(HostError, match="--ppn needs MPICH's mpiexec"):
        launch_hosts(path, 1, 2, hydra=False, environ={})
    got = launch_hosts(path, 1, None, hydra=False, environ={})
    assert got.hostfile_text is None and got.source == path


def run_cli(*args: str, env_extra: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "canary.cli", "run", "--timeout", "120", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def summary_of(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The app's JSON summary, its last line of output; a failure shows all of the output."""
    try:
        return dict(json.loads(r.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        pytest.fail(f"the last line is not the app's JSON summary\nstdout:\n{r.stdout[-3000:]}"
                    f"\nstderr:\n{r.stderr[-3000:]}")


def test_canary_run_with_a_hostfile_naming_this_machine_and_localhost(tmp_path: Path) -> None:
    path = hostfile(tmp_path, f"{socket.gethostname()}:1\nlocalhost:2\n")
    r = run_cli("-n", "2", "-f", path, "--ppn", "2", "-v", "apps/logistic_regression.py",
                "--generate", "2000,5", "--max-iter", "3", "--print-every", "0")
    assert r.returncode == 0, r.stderr
    assert f"--ppn 2 is more than the 1 slots of host {socket.gethostname()}" in r.stderr
    summary = summary_of(r)
    assert summary["workers"] == 2 and summary["iterations"] == 3
    # without -n: the hostfile's 3 slots are 2 workers and the controller
    r = run_cli("-f", path, "apps/logistic_regression.py", "--generate", "2000,5",
                "--max-iter", "2", "--print-every", "0")
    assert r.returncode == 0, r.stderr
    assert summary_of(r)["workers"] == 2


@pytest.mark.parametrize("workers", [2, 3])
def test_a_job_across_hosts_ends_with_no_message_left_unreceived(workers: int,
                                                                  tmp_path: Path) -> None:
    """Between hosts, MPICH's messages go through UCX, which warns at exit (on stdout) about
    each message that arrived and was never received. With the controller on one host, the
    workers on another, and a load report every millisecond, reports are on their way when
    the job ends: the controller must receive every one (each worker's Bye comes last)."""
    path = hostfile(tmp_path, f"{socket.gethostname()}:1\nlocalhost:{workers}\n")
    r = run_cli("-f", path, "apps/logistic_regression.py", "--generate", "2000,5",
                "--max-iter", "40", "--print-every", "0", env_extra={"CANARY_REPORT_MS": "1"})
    assert r.returncode == 0, r.stderr
    assert "not matched" not in r.stdout + r.stderr, r.stdout + r.stderr
    summary = summary_of(r)
    assert summary["workers"] == workers and summary["iterations"] == 40


def test_canary_run_refuses_a_bad_hostfile_before_starting_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = "apps/power_iteration.py"
    assert main(["run", "-f", str(tmp_path / "none"), script]) == 2
    assert "canary run: hostfile not found:" in capsys.readouterr().err
    bad = hostfile(tmp_path, "localhost:2\nno-such-host.invalid:2\n")
    assert main(["run", "-n", "1", "-f", bad, script]) == 2
    assert "host 'no-such-host.invalid' does not resolve" in capsys.readouterr().err
    good = hostfile(tmp_path, "localhost:2\n")
    assert main(["run", "-n", "4", "-f", good, "--ppn", "2", script]) == 2
    assert "5 ranks (the workers plus the controller) do not fit" in capsys.readouterr().err
