"""The ``canary`` command: ``canary run -n N SCRIPT [ARGS]`` and ``canary simulate ...``."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig


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
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([path, os.environ.get("PYTHONPATH", "")])
    return env


def mpiexec_command(workers: int, script: str, script_args: list[str], hostfile: str | None = None,
                    mpiexec: str | None = None) -> list[str]:
    """The command ``canary run`` executes: one controller plus ``workers`` workers.

    Raises ValueError if ``workers < 1``.
    """
    if workers < 1:
        raise ValueError(f"canary run: -n must be at least 1 worker, got {workers}")
    cmd = [mpiexec or find_mpiexec()]
    if hostfile:
        cmd += ["-f", hostfile]
    cmd += ["-n", str(workers + 1), sys.executable, "-u", "-m", "mpi4py", script, *script_args]
    return cmd


def _run(args: argparse.Namespace) -> int:
    if not os.path.exists(args.script):
        print(f"canary run: script not found: {args.script}", file=sys.stderr)
        return 2
    if args.hostfile and not os.path.exists(args.hostfile):
        print(f"canary run: hostfile not found: {args.hostfile}", file=sys.stderr)
        return 2
    cmd = mpiexec_command(args.n, args.script, args.args, args.hostfile)
    env = mpiexec_env(args.timeout)
    if args.verbose:
        print("canary run:", " ".join(cmd), file=sys.stderr)
    return subprocess.call(cmd, env=env)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "simulate":
        from canary.sim.cli import main as simulate

        return simulate(argv[1:])
    ap = argparse.ArgumentParser(prog="canary", description="Canary dataflow engine.")
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a driver: mpiexec -n N+1 python -m mpi4py SCRIPT ARGS")
    r.add_argument("-n", type=int, default=2, help="number of workers (plus one controller rank)")
    r.add_argument("-f", "--hostfile", default=None, help="MPI hostfile for multi-host runs")
    r.add_argument("--timeout", type=int, default=None,
                   help="kill the job after this many seconds (sets MPIEXEC_TIMEOUT)")
    r.add_argument("-v", "--verbose", action="store_true", help="print the mpiexec command")
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("simulate", help="scheduling simulator (see `canary simulate --help`)")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"canary: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
