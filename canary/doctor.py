"""``canary doctor``: check that the hosts of a job see each other before a long run.

It starts one MPI rank per slot of the hostfile (or of the Slurm allocation, or one per core
of this machine) and reports, as JSON lines on stdout and a readable summary on stderr:

* every rank's host, cores (how many and which the rank may run on), Python, canary, numpy, numba and
  mpi4py versions, the MPI library, and the numba cache (where compiled kernels are kept,
  whether the rank can write there, how many are cached);
* MPI latency (half the round trip of an 8-byte message, median) and bandwidth (a 4 MiB
  message, best of the repetitions) between rank 0 and every other rank, marked same-host or
  cross-host;
* problems: hosts whose environments differ (versions, which canary), a numba cache that
  cannot be written; and a note where ranks share cores (more ranks than the cores they may
  run on; ranks bound a core each share none).

Exit status: 0 when every rank came up and nothing differs, 1 when a problem was found, 2 when
the hosts could not be used at all (the message says which and why; mpiexec is not started).

The rank side (``python -m mpi4py canary/doctor.py --ranks``) is started by mpiexec; the
launcher side is :func:`main`, called by ``canary doctor``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # started as a script by mpiexec: import this checkout's canary
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from canary.hosts import REACH_TIMEOUT, HostError, check_reachable, job_hosts, plan_ranks  # noqa: E402
from canary.idle import core_placement, has_own_core  # noqa: E402

LATENCY_BYTES = 8
BANDWIDTH_BYTES = 4 << 20
LATENCY_REPS = 200
BANDWIDTH_REPS = 8


# -- rank side -----------------------------------------------------------------------------


def numba_cache_status(root: Path | None = None) -> dict[str, Any]:
    """Where numba keeps this checkout's compiled kernels (``NUMBA_CACHE_DIR``, else the
    ``__pycache__`` beside ``apps/``), whether this process can write there (else every rank
    compiles every kernel at every start), and how many kernels are cached (``*.nbi``)."""
    root = root or Path(__file__).resolve().parent.parent
    custom = os.environ.get("NUMBA_CACHE_DIR")
    folder = Path(custom) if custom else root / "apps" / "__pycache__"
    probe = folder
    while not probe.exists() and probe != probe.parent:  # numba makes the missing folders
        probe = probe.parent
    return {"dir": str(folder), "exists": folder.exists(),
            "writable": os.access(probe, os.W_OK | os.X_OK),
            "cached_kernels": len(list(folder.rglob("*.nbi"))) if folder.exists() else 0}


def rank_facts() -> dict[str, Any]:
    """What this rank knows about its host and environment."""
    import mpi4py
    import numba
    import numpy
    from mpi4py import MPI

    import canary

    host, cores = core_placement()
    return {"host": host, "cores": len(cores), "affinity": sorted(cores),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "executable": sys.executable,
            "canary": str(Path(canary.__file__).resolve().parent),
            "numpy": numpy.__version__, "numba": numba.__version__,
            "mpi4py": mpi4py.__version__,
            "mpi": " ".join(MPI.Get_library_version().splitlines()[0].split()),
            "numba_cache": numba_cache_status()}


def _wait(request: Any) -> None:
    """Wait for a non-blocking MPI request without spinning a core: on a host with more ranks
    than cores a spinning waiter takes the CPU of the ranks being measured."""
    while not request.Test():
        time.sleep(1e-3)


def ping_pong(comm: Any, peer: int, nbytes: int, reps: int, leader: bool) -> list[float]:
    """Round-trip times (s) of ``nbytes`` messages between this rank and ``peer``, after two
    untimed round trips; the ``leader`` sends first and keeps the times."""
    import numpy as np

    buf = np.zeros(max(nbytes, 1), np.uint8)
    times = []
    for i in range(reps + 2):
        if leader:
            t0 = time.perf_counter()
            comm.Send(buf, peer, 7)
            comm.Recv(buf, peer, 7)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        else:
            comm.Recv(buf, peer, 7)
            comm.Send(buf, peer, 7)
    return times


def rank_main(latency_reps: int = LATENCY_REPS, bandwidth_reps: int = BANDWIDTH_REPS) -> int:
    """Every rank: gather the facts on rank 0, then rank 0 measures a link to each other rank
    in turn while the rest wait without spinning. Rank 0 prints a JSON line per rank and
    per link."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    facts = comm.gather(rank_facts(), root=0) or []  # None on every rank but 0
    hosts = comm.bcast([f["host"] for f in facts] if rank == 0 else None, root=0)
    if rank == 0:
        for r, f in enumerate(facts):
            print(json.dumps({"kind": "rank", "rank": r, **f}), flush=True)
    for peer in range(1, size):
        _wait(comm.Ibarrier())
        if rank not in (0, peer):
            continue
        lat = ping_pong(comm, peer if rank == 0 else 0, LATENCY_BYTES, latency_reps, rank == 0)
        bw = ping_pong(comm, peer if rank == 0 else 0, BANDWIDTH_BYTES, bandwidth_reps, rank == 0)
        if rank == 0:
            print(json.dumps({
                "kind": "link", "ranks": [0, peer], "hosts": [hosts[0], hosts[peer]],
                "same_host": hosts[0] == hosts[peer],
                "latency_us": round(statistics.median(lat) / 2 * 1e6, 2),
                "bandwidth_gb_s": round(BANDWIDTH_BYTES / (min(bw) / 2) / 1e9, 3),
                "latency_reps": latency_reps, "bandwidth_bytes": BANDWIDTH_BYTES}), flush=True)
    _wait(comm.Ibarrier())
    return 0


# -- launcher side -------------------------------------------------------------------------


def problems(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """What is wrong with the ranks' reports, and what is only worth knowing: problems are
    environments that differ between ranks (a host set up differently) and numba caches that
    cannot be written; notes are hosts with more ranks than cores."""
    ranks = [r for r in rows if r.get("kind") == "rank"]
    out, notes = [], []
    for key in ("python", "canary", "numpy", "numba", "mpi4py", "mpi"):
        seen: dict[str, list[int]] = {}
        for r in ranks:
            seen.setdefault(str(r[key]), []).append(r["rank"])
        if len(seen) > 1:
            shown = "; ".join(f"{v} on rank(s) {', '.join(map(str, rs))}" for v, rs in seen.items())
            out.append(f"the ranks differ in {key}: {shown} (install the same environment "
                       "at the same path on every host)")
    for r in ranks:
        cache = r["numba_cache"]
        if not cache["writable"]:
            out.append(f"rank {r['rank']} on {r['host']} cannot write numba's cache "
                       f"{cache['dir']}: every rank compiles every kernel at every start (set "
                       "NUMBA_CACHE_DIR to a writable node-local folder)")
    # the workers' rule (canary.idle.has_own_core), over every rank: ranks bound a core each
    # have one core each and share none
    placements = [(r["host"], frozenset(r.get("affinity", range(r["cores"])))) for r in ranks]
    per_host: dict[str, list[int]] = {}
    for k, r in enumerate(ranks):
        if not has_own_core(k, placements):
            per_host.setdefault(r["host"], []).append(k)
    for host, ks in per_host.items():
        cores = frozenset().union(*(placements[k][1] for k in ks))
        notes.append(f"host {host} runs {len(ks)} ranks on {len(cores)} core(s): they "
                     "share cores (fine for the controller, slower for workers)")
    return out, notes


def summary(rows: list[dict[str, Any]], found: list[str], notes: list[str]) -> str:
    """A readable report of the ranks' rows, the problems found and the notes."""
    ranks = [r for r in rows if r.get("kind") == "rank"]
    links = [r for r in rows if r.get("kind") == "link"]
    lines = [f"canary doctor: {len(ranks)} rank(s) on {len({r['host'] for r in ranks})} host(s)"]
    per_host: dict[str, list[int]] = {}
    for r in ranks:
        per_host.setdefault(r["host"], []).append(r["rank"])
    for host, rs in per_host.items():
        first = next(r for r in ranks if r["rank"] == rs[0])
        cache = first["numba_cache"]
        lines.append(f"  {host}: rank(s) {', '.join(map(str, rs))}; {first['cores']} core(s); "
                     f"Python {first['python']}, numba {first['numba']}, {first['mpi']}; "
                     f"numba cache {'writable' if cache['writable'] else 'NOT writable'} "
                     f"({cache['cached_kernels']} kernel(s) cached in {cache['dir']})")
    for kind, same in (("same host", True), ("between hosts", False)):
        ls = [lk for lk in links if lk["same_host"] == same]
        if ls:
            lat = statistics.median(lk["latency_us"] for lk in ls)
            bw = statistics.median(lk["bandwidth_gb_s"] for lk in ls)
            worst = max(ls, key=lambda lk: lk["latency_us"])
            lines.append(f"  MPI {kind}: latency {lat:.1f} us, bandwidth {bw:.2f} GB/s "
                         f"(median of {len(ls)} link(s); slowest: rank 0 to rank "
                         f"{worst['ranks'][1]} on {worst['hosts'][1]}, {worst['latency_us']:.1f} us)")
    lines += [f"  note: {n}" for n in notes]
    lines += [f"  problem: {p}" for p in found] or ["  no problem found"]
    return "\n".join(lines)


def main(argv: list[str], mpiexec: str, env: Mapping[str, str],
         ranks_command: Callable[[], list[str]] | None = None) -> int:
    """``canary doctor`` (see the module doc): ``mpiexec`` runs the ranks in environment
    ``env``. Returns the exit status."""
    ap = argparse.ArgumentParser(prog="canary doctor", description=__doc__.split("\n\n")[0])
    ap.add_argument("-f", "--hostfile", default=None,
                    help="hostfile (default: the Slurm allocation, else this machine)")
    ap.add_argument("-n", type=int, default=None,
                    help="ranks to start (default: one per slot; on this machine one per core)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds before the ranks are killed")
    ap.add_argument("--reach-timeout", type=float, default=REACH_TIMEOUT,
                    help="seconds each host gets to resolve and answer ssh")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (tests)")
    args = ap.parse_args(argv)
    # -n 0 ran 2 ranks without a word, --timeout 0 ended in mpiexec's empty error
    for flag, value, least in (("-n", args.n, 2), ("--timeout", args.timeout, 1)):
        if value is not None and value < least:
            ap.error(f"{flag} must be at least {least}, got {value}")
    if not args.reach_timeout > 0:
        ap.error(f"--reach-timeout must be above 0 s, got {args.reach_timeout}")
    try:
        found = job_hosts(args.hostfile)
        with tempfile.TemporaryDirectory(prefix="canary-doctor-") as tmp:
            cmd = [mpiexec]
            if found is not None:
                hosts, source = found
                if source != "the Slurm allocation":
                    check_reachable(hosts, args.reach_timeout)
                slots = sum(h.slots or 1 for h in hosts)
                plan = plan_ranks(hosts, args.n or slots)
                path = os.path.join(tmp, "hostfile")
                Path(path).write_text(plan.hostfile_text())
                cmd += ["-f", path]
                nranks = args.n or slots
            else:
                nranks = args.n or max(2, os.cpu_count() or 1)
            if nranks < 2:
                raise HostError("-n must be at least 2 ranks (a link needs two ends)")
            cmd += ["-n", str(nranks), *(ranks_command or _ranks_command)()]
            if args.quick:
                cmd.append("--quick")
            run_env = dict(env, MPIEXEC_TIMEOUT=str(args.timeout))
            proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True,
                                  timeout=args.timeout + 30, stdin=subprocess.DEVNULL)
    except HostError as exc:
        print(f"canary doctor: {exc}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired:
        print(f"canary doctor: the ranks did not finish within {args.timeout} s", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        print(f"canary doctor: the ranks failed (mpiexec exit status {proc.returncode}):\n"
              f"{proc.stderr.strip()[-3000:]}", file=sys.stderr)
        return 1
    found_problems, notes = problems(rows)
    for row in rows:
        print(json.dumps(row), flush=True)
    print(json.dumps({"kind": "summary", "ranks": sum(r["kind"] == "rank" for r in rows),
                      "problems": found_problems, "notes": notes}), flush=True)
    print(summary(rows, found_problems, notes), file=sys.stderr, flush=True)
    return 1 if found_problems else 0


def _ranks_command() -> list[str]:
    return [sys.executable, "-m", "mpi4py", str(Path(__file__).resolve()), "--ranks"]


if __name__ == "__main__":
    if "--ranks" in sys.argv:
        quick = "--quick" in sys.argv
        sys.exit(rank_main(20 if quick else LATENCY_REPS, 2 if quick else BANDWIDTH_REPS))
    print("canary doctor: run it as `canary doctor` (this file is its ranks' side)",
          file=sys.stderr)
    sys.exit(2)
