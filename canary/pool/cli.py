"""``canary cluster start|status|stop``, ``canary submit``, ``canary jobs``, ``canary logs``,
``canary cancel``: the pool's commands (see docs/sharing.md)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

from canary import launch
from canary.pool import client
from canary.pool.spool import DIR_ENV, default_dir
from canary.sched.placement import PLACEMENT_POLICIES
from canary.sched.queues import QUEUE_POLICIES

COMMANDS = ("cluster", "submit", "jobs", "logs", "cancel")
SNAPSHOT_OPTIONS = ("--checkpoint", "--resume", "--restarts")


def _dir_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cluster", "--dir", dest="dir", default=None, metavar="DIR",
                    help=f"the pool's directory (default: ${DIR_ENV}, else {default_dir()})")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="canary", description="A pool of workers shared by jobs.")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cluster", help="start, show or stop a pool")
    csub = c.add_subparsers(dest="action", required=True)
    s = csub.add_parser("start", help="launch a pool under mpiexec in the background")
    s.add_argument("-n", type=int, required=True, help="number of workers (plus rank 0)")
    s.add_argument("--policy", default="fair", metavar="|".join(QUEUE_POLICIES),
                   help="how a worker shares its core among jobs (default fair)")
    s.add_argument("--placement", default="batch-late", metavar="|".join(PLACEMENT_POLICIES),
                   help="how a job's workers are chosen (default batch-late)")
    s.add_argument("--probe-ratio", type=float, default=2.0,
                   help="workers probed or reserved per job worker (Sparrow's d, default 2)")
    s.add_argument("-f", "--hostfile", default=None, help="MPI hostfile for multi-host pools")
    s.add_argument("--seed", type=int, default=0, help="seed of the placement's choices")
    s.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for the pool to come up")
    _dir_arg(s)
    _dir_arg(csub.add_parser("status", help="the pool and its jobs"))
    st = csub.add_parser("stop", help="stop the pool once its jobs end")
    st.add_argument("--now", action="store_true", help="cancel the running jobs")
    _dir_arg(st)
    sb = sub.add_parser("submit", help="run a driver on the pool")
    _dir_arg(sb)
    sb.add_argument("--user", default=None, help="whose share the job uses (default $USER)")
    sb.add_argument("--priority", type=int, default=0, help="0 is the most urgent (default 0)")
    sb.add_argument("--weight", type=float, default=1.0,
                    help="the user's fair share weight (default 1)")
    sb.add_argument("--workers", type=int, default=0,
                    help="spread the job over at most M workers (default: all)")
    sb.add_argument("--wait", action="store_true",
                    help="stream the job's output and exit with its status")
    for option in (*SNAPSHOT_OPTIONS, "--balance"):  # accepted only to say what to do instead
        sb.add_argument(option, default=None, help=argparse.SUPPRESS)
    sb.add_argument("script")
    sb.add_argument("args", nargs=argparse.REMAINDER)
    _dir_arg(sub.add_parser("jobs", help="list the pool's jobs"))
    lg = sub.add_parser("logs", help="a job's output")
    lg.add_argument("job", type=int)
    _dir_arg(lg)
    cn = sub.add_parser("cancel", help="end a job")
    cn.add_argument("job", type=int)
    _dir_arg(cn)
    return ap


def _unless_shown(error: str | None, shown: list[str]) -> str:
    """What follows ``failed`` in the last line of ``submit --wait`` on stderr: ``: `` and
    ``error`` (``"TaskError: rank 2 ..."``), or, when the job's log printed above on stdout
    already said it and stdout is where stderr goes (one terminal, one file), only the kind of
    error and that it is above: a kernel's traceback once is enough. Where stdout goes
    elsewhere (``> out.txt``), stderr says it whole."""
    text = str(error)
    kind, sep, body = text.partition(": ")
    if not (sep and kind.isidentifier()):
        kind, body = "", text
    if body.strip() and body.strip() in "".join(shown) and _same_file(sys.stdout, sys.stderr):
        return f" ({kind}, said above)" if kind else " (said above)"
    return f": {text}"


def _same_file(a: TextIO, b: TextIO) -> bool:
    """Whether streams ``a`` and ``b`` write to one file (a terminal, a pipe, a file)."""
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def main(argv: list[str], find_mpiexec: Callable[[], str],
         pool_env: Callable[[], Mapping[str, str]]) -> int:
    """Run one pool command; ``find_mpiexec`` and ``pool_env`` give the launcher and the
    ranks' environment as ``canary run`` has them. Returns the exit status: 2 for a request
    that cannot be carried out (said on stderr), the job's status for ``submit --wait``."""
    args = parser().parse_args(argv)
    name = args.command if args.command != "cluster" else f"cluster {args.action}"
    try:
        return _dispatch(args, find_mpiexec, pool_env)
    except BrokenPipeError:  # `canary jobs | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (client.PoolError, OSError) as exc:
        print(f"canary {name}: error: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace, find_mpiexec: Callable[[], str],
              pool_env: Callable[[], Mapping[str, str]]) -> int:
    root = args.dir
    if args.command == "cluster" and args.action == "start":
        where = root or default_dir()
        info = client.start(args.n, find_mpiexec(), pool_env(), where, args.policy,
                            args.placement, args.hostfile, args.seed, args.probe_ratio,
                            args.timeout)
        print(f"canary pool ready: {info['workers']} worker(s), policy {info['policy']}, "
              f"placement {info['placement']}, directory {where}"
              + ("" if root else " (the default; give --dir to choose)"))
        return 0
    if args.command == "cluster" and args.action == "status":
        info = client.pool_info(root)
        listed = client.jobs(root)
        counts: dict[str, int] = {}
        for st in listed:
            counts[st["state"]] = counts.get(st["state"], 0) + 1
        print(f"pool {info['state']}: {info['workers']} worker(s), policy {info['policy']}, "
              f"placement {info['placement']}, rank 0 pid {info['pid']} on {info['host']}")
        print("jobs: " + (", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none"))
        return 0
    if args.command == "cluster":
        client.stop(root, now=args.now)
        print("canary pool stopped")
        return 0
    if args.command == "submit":
        if args.balance is not None:  # it was "canary: error: unrecognized arguments"
            raise client.PoolError("--balance is not available for a pool job: a pool does not "
                                   "move partitions between its jobs' workers. Run a job that "
                                   "needs balancing with `canary run` on ranks of its own")
        asked = [o for o in SNAPSHOT_OPTIONS if getattr(args, o[2:]) is not None]
        if asked:
            raise client.PoolError(
                f"{asked[0]} is not available for a pool job: a pool takes no snapshots, so a "
                "job cannot resume after a failure there. Run a job that needs it with "
                f"`canary run {asked[0]} ...` on ranks of its own")
        job = client.submit(args.script, args.args, root, args.user, args.priority,
                            args.weight, args.workers, os.getpid() if args.wait else None)
        if not args.wait:
            print(job)
            return 0
        print(f"canary: job {job} submitted", file=sys.stderr, flush=True)
        shown: list[str] = []  # the job's log as printed, to say its error once

        def follow(text: str) -> None:
            print(text, end="", flush=True)
            shown.append(text)

        # Ctrl-C, SIGTERM and SIGHUP end the wait alike: the job is cancelled, and said to be
        try:
            with launch.stopped_by_signals():
                st = client.wait(job, root, follow=follow)
        except launch.Stopped as stop:
            client.cancel(job, root)
            print(f"canary: job {job} cancelled", file=sys.stderr)
            return 128 + stop.signum
        if st["state"] != "done":
            print(f"canary: job {job} {st['state']}{_unless_shown(st.get('error'), shown)}",
                  file=sys.stderr)
        if st["state"] == "lost":
            return 1
        return int(st.get("exit_code", 1))
    if args.command == "jobs":
        rows = client.jobs(root)
        print(f"{'ID':>5} {'USER':10} {'PRI':>3} {'STATE':9} {'WORKERS':10} {'ITER':>6} "
              f"{'ELAPSED':>9}  SCRIPT")
        now = time.time()
        for st in rows:
            start = st.get("started") or st.get("submitted") or now
            # a lost job's end is not known: its time would grow for ever
            elapsed = "-" if st["state"] == "lost" and not st.get("ended") else \
                f"{(st.get('ended') or now) - start:.1f}s"
            it = st.get("iteration", -1)
            ws = ",".join(map(str, st.get("workers", []))) or "-"
            print(f"{st['job']:>5} {str(st.get('user'))[:10]:10} {st.get('priority', 0):>3} "
                  f"{st['state']:9} {ws[:10]:10} {it if it is not None and it >= 0 else '-':>6} "
                  f"{elapsed:>9}  {st.get('script')}")
        return 0
    if args.command == "logs":
        print(client.logs(args.job, root), end="")
        return 0
    client.cancel(args.job, root)
    print(f"canary: job {args.job}: cancel requested")
    return 0
