"""The ``canary`` command: ``canary run -n N SCRIPT [ARGS]``, ``canary simulate ...`` and
``canary doctor [-f HOSTFILE]``."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from canary import hosts, launch
from canary.mpi_runner import BALANCE_ENV


def find_mpiexec() -> str:
    """The mpiexec that matches this Python's mpi4py: the environment's own first.

    Raises FileNotFoundError with what to install if none is found.
    """
    here = os.path.join(sysconfig.get_path("scripts"), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec")
    if found:
        return found
    raise FileNotFoundError(
        "mpiexec not found: `pip install mpich` (the default MPI) or put your MPI's mpiexec on PATH"
    )


def mpiexec_env(timeout: int | None, path: str | None = None) -> dict[str, str]:
    """The environment for an mpiexec run: this process's, with unbuffered Python output (each
    rank's lines arrive as printed), ``MPIEXEC_TIMEOUT`` set to ``timeout`` seconds if given
    (MPICH then kills the whole job, so a hung rank cannot hang the caller), and ``path`` put
    first on ``PYTHONPATH`` if given (a checkout's packages for scripts run from elsewhere)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if timeout:
        env["MPIEXEC_TIMEOUT"] = str(timeout)
    if path is not None:  # no empty entry: it would put the ranks' working folder on sys.path
        env["PYTHONPATH"] = os.pathsep.join(p for p in [path, os.environ.get("PYTHONPATH")] if p)
    return env


def mpiexec_command(workers: int, script: str, script_args: list[str], hostfile: str | None = None,
                    mpiexec: str | None = None, hydra: bool = False) -> list[str]:
    """The command ``canary run`` executes: one controller plus ``workers`` workers, each
    started by ``python -u -m canary.ranks`` (``python -m mpi4py`` plus the records that let
    the launcher tell how the job ended; see :mod:`canary.ranks`) under its sentinel
    (:mod:`canary.sentinel`, which notes how a rank that did not finish ended). ``hydra``:
    add the options that let the launcher read MPICH hydra's output
    (:func:`canary.launch.hydra_options`).

    Raises ValueError if ``workers < 1``.
    """
    if workers < 1:
        raise ValueError(f"canary run: -n must be at least 1 worker, got {workers}")
    cmd = [mpiexec or find_mpiexec()]
    if hostfile:
        cmd += ["-f", hostfile]
    if hydra:
        cmd += launch.hydra_options()
    cmd += ["-n", str(workers + 1), *launch.sentinel_command(), sys.executable, "-u", "-m",
            "canary.ranks", script, *script_args]
    return cmd


def _shown(cmd: list[str]) -> str:
    """``cmd`` as one line a shell would accept, control characters written as escapes."""
    import shlex

    return " ".join(shlex.quote(a) if a.isprintable() else repr(a) for a in cmd)


def _run(args: argparse.Namespace) -> int:
    if not os.path.exists(args.script):
        print(f"canary run: script not found: {args.script}", file=sys.stderr)
        return 2
    mpiexec = find_mpiexec()
    hydra = launch.is_hydra(mpiexec)
    try:  # hostfile, Slurm allocation, --ppn: checked and placed in canary.hosts
        where = hosts.launch_hosts(args.hostfile, args.n, args.ppn, hydra)
    except hosts.HostError as exc:
        print(f"canary run: {exc}", file=sys.stderr)
        return 2
    for line in where.warnings:
        print(f"canary run: warning: {line}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="canary-hosts-") as tmp:
        hostfile = args.hostfile
        if where.hostfile_text is not None:
            hostfile = os.path.join(tmp, "hostfile")
            Path(hostfile).write_text(where.hostfile_text)
        cmd = mpiexec_command(where.workers, args.script, args.args, hostfile, mpiexec, hydra)
        env = mpiexec_env(args.timeout, launch.checkout_root())
        env[BALANCE_ENV] = args.balance
        if args.verbose:
            print("canary run:", _shown(cmd), file=sys.stderr)
        return launch.supervise(cmd, env, where.workers + 1, hydra)


RUN_HELP = """\
Runs SCRIPT on N workers plus one controller rank: mpiexec -n N+1 python -m canary.ranks
SCRIPT ARGS, which runs SCRIPT as `python -m mpi4py` does and records how each rank ended.

exit status:
  0        the job finished: rank 0 (the controller) ran the driver to its end
  2        the driver rejected its arguments or input on every rank (said once)
  other    the driver's own status when it stopped by itself on every rank (0 for
           --help), or the code of a rank that ended the job after saying why (1: a
           task failed)
  128+S    a rank was killed by signal S (137: SIGKILL, 139: SIGSEGV) before the job
           finished; canary names the rank; the job's results are lost
  1        a rank exited with status 0 before the job finished (a rank that exits
           with status C != 0 before then gives C)
  124      the time limit (--timeout, MPIEXEC_TIMEOUT) expired
  130/143  canary run was interrupted (Ctrl-C) / terminated (SIGTERM): job stopped

stopping: Ctrl-C, or SIGTERM/SIGHUP to canary run, stops the whole job (mpiexec and every
rank) within seconds and prints one line; a second Ctrl-C kills at once. If canary run is
killed with SIGKILL, mpiexec gets SIGTERM and stops the job, and the ranks on this host stop
by themselves (Linux).
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "simulate":
        from canary.sim.cli import main as simulate

        return simulate(argv[1:])
    if argv and argv[0] == "doctor":  # the hosts' check: canary/doctor.py
        from canary import doctor

        return doctor.main(argv[1:], find_mpiexec(), mpiexec_env(None, launch.checkout_root()))
    ap = argparse.ArgumentParser(prog="canary", description="Canary dataflow engine.")
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a driver on N workers + 1 controller under mpiexec",
                       description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("-n", type=int, default=None, help="number of workers (plus one controller "
                   "rank; default 2, or what the hostfile or Slurm allocation holds minus 1)")
    r.add_argument("-f", "--hostfile", default=None, help="MPI hostfile for multi-host runs "
                   "(lines 'host' or 'host:SLOTS'; see docs/cluster.md)")
    r.add_argument("--ppn", type=int, default=None, help="ranks per host (the controller "
                   "counts on the first host)")
    r.add_argument("--timeout", type=int, default=None,
                   help="kill the job after this many seconds (sets MPIEXEC_TIMEOUT)")
    r.add_argument("-v", "--verbose", action="store_true", help="print the mpiexec command")
    r.add_argument("--balance", choices=("on", "off"), default="on",
                   help="move partitions off workers that are markedly slower (default on; "
                        "sets CANARY_BALANCE for the ranks)")
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("simulate", help="scheduling simulator (see `canary simulate --help`)")
    sub.add_parser("doctor", help="check the hosts before a long run (see `canary doctor --help`)")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except (ValueError, OSError) as exc:  # no mpiexec, or it cannot be started
        print(f"canary: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the job started (the launcher handles it after)
        print("canary: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
