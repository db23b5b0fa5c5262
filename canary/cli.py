"""The ``canary`` command: ``canary run -n N SCRIPT [ARGS]``, ``canary simulate ...`` and
``canary doctor [-f HOSTFILE]``."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from canary import hosts, launch
from canary.driver import RESUME_ENV, out_of_range
from canary.env import BALANCE_ENV, CHECKPOINT_ENV, CHECKPOINT_EVERY_ENV, KEEP_ENV
from canary.snapshot import (
    Manifest,
    SnapshotConfig,
    SnapshotError,
    check_same_job,
    choose,
    committed,
    describe,
    next_id,
    snapshot_folder,
)


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
    first on ``PYTHONPATH`` if given (a checkout's packages for scripts run from elsewhere).
    numba's errors come without terminal colour codes, unless the caller chose otherwise: the
    ranks write to pipes, and the codes were printed as ``[1m`` in a kernel's compile error."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
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
    script, script_args = args.script, list(args.args)
    for flag, value in (("--checkpoint", args.checkpoint), ("--resume", args.resume)):
        if value is not None and not value.strip():  # an unset shell variable: it was ignored
            print(f"canary run: {flag} got an empty path: give the folder", file=sys.stderr)
            return 2
    checkpoint = args.checkpoint or args.resume  # a resumed job goes on taking snapshots there
    if args.restarts and not checkpoint:
        print("canary run: --restarts needs --checkpoint DIR (a relaunch resumes from the last "
              "snapshot there)", file=sys.stderr)
        return 2
    snap = None
    if args.resume:
        snap, notes = choose(args.resume)  # SnapshotError: said by main()
        for note in notes:
            print(f"canary: {note}", file=sys.stderr)
        if script is None:
            script, script_args = snap.data["script"], list(snap.data["args"])
        else:
            check_same_job(snap, script, script_args)
    elif script is None:
        print("canary run: SCRIPT is required (or --resume DIR to continue a job)",
              file=sys.stderr)
        return 2
    if not os.path.exists(script):
        print(f"canary run: script not found: {script}", file=sys.stderr)
        return 2
    if os.path.isdir(script):  # runpy's ImportError, once per rank
        print(f"canary run: {script} is a folder: give the driver script's file",
              file=sys.stderr)
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
    env = mpiexec_env(args.timeout, launch.checkout_root())
    if args.balance is not None:  # else the ranks read CANARY_BALANCE, if set, themselves
        env[BALANCE_ENV] = args.balance
    if checkpoint:
        try:
            os.makedirs(checkpoint, exist_ok=True)
        except OSError as exc:
            print(f"canary run: --checkpoint {checkpoint}: cannot create the folder "
                  f"({exc.strerror or exc})", file=sys.stderr)
            return 2
        if not os.access(checkpoint, os.W_OK | os.X_OK):  # the job ran with no snapshot
            print(f"canary run: --checkpoint {checkpoint}: this user cannot write there",
                  file=sys.stderr)
            return 2
        env[CHECKPOINT_ENV] = os.path.abspath(checkpoint)
        # not given: the ranks' defaults, or CANARY_CHECKPOINT_EVERY / CANARY_KEEP if set
        if args.checkpoint_every is not None:
            env[CHECKPOINT_EVERY_ENV] = str(args.checkpoint_every)
        if args.keep is not None:
            env[KEEP_ENV] = str(args.keep)
        if snap is None and committed(checkpoint):
            print(f"canary: note: {checkpoint} already holds snapshots of an earlier run; this "
                  "run starts afresh (`--resume DIR` continues from them)", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        hostfile = args.hostfile
        if where.hostfile_text is not None:
            # a folder only for a hostfile of our own: a launcher killed with SIGKILL leaves it
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="canary-hosts-"))
            hostfile = os.path.join(tmp, "hostfile")
            Path(hostfile).write_text(where.hostfile_text)
        cmd = mpiexec_command(where.workers, script, script_args, hostfile, mpiexec, hydra)
        if args.verbose:
            print("canary run:", _shown(cmd), file=sys.stderr)
        return _supervise_with_restarts(cmd, env, where.workers, hydra, snap, checkpoint,
                                        args.restarts)


def _supervise_with_restarts(cmd: list[str], env: dict[str, str], workers: int, hydra: bool,
                             snap: Manifest | None, checkpoint: str | None,
                             restarts: int) -> int:
    """Run the job (from ``snap`` if given); while it ends because a rank died, relaunch it
    from the newest usable snapshot this run wrote in ``checkpoint``, else from ``snap``, else
    from the start, at most ``restarts`` times. Returns ``canary run``'s exit status.

    Snapshots an earlier run left in ``checkpoint`` are never taken: that run may have had
    other arguments or input (a restart gave the earlier run's answer).

    A stop signal between two launches (:class:`canary.launch.Stopped`) ends it with one line
    naming the restart that was not started, and 128 + the signal; one before the first launch
    is raised."""
    done = 0
    resumed = snap
    first = next_id(checkpoint) if checkpoint is not None else 1  # this run's snapshots
    kept = launch.JobSnapshots(
        checkpoint or "", first,
        None if snap is None else (os.path.dirname(snap.path), snap.id))
    while True:
        try:
            if snap is not None:
                env[RESUME_ENV] = os.path.abspath(snap.path)
                print(f"canary: resuming from snapshot {snap.id} ({snap.position['where']}, "
                      f"taken {snap.data['run_seconds']:.0f} s into the run) on {workers} "
                      "worker(s)", file=sys.stderr)
            status, lost = launch.supervise_job(cmd, env, workers + 1, hydra, kept)
            if lost and restarts and done >= restarts:
                print(f"canary: no restart left (--restarts {restarts} used up)",
                      file=sys.stderr)
            if status == 0 or not lost or done >= restarts or checkpoint is None:
                return status
            done += 1
            try:
                snap, notes = choose(checkpoint, since=first)
            except SnapshotError:
                snap, notes = resumed, []
            for note in notes:
                print(f"canary: {note}", file=sys.stderr)
            if snap is None:
                where = "the beginning (this run has committed no snapshot)"
            elif snap is resumed:
                where = (f"snapshot {snap.id} of {os.path.dirname(snap.path)}, which it "
                         "resumed from")
            else:
                where = f"snapshot {snap.id}"
            print(f"canary: restarting the job ({done} of {restarts}) from {where}",
                  file=sys.stderr)
            if snap is None:
                env.pop(RESUME_ENV, None)
        except launch.Stopped as stop:
            if done == 0:
                raise  # no job ran yet: said where canary run's start-up is
            # checkpoint is set: a restart was under way
            print(f"canary: {launch.stop_word(stop.signum)} before restart {done} of {restarts} "
                  f"was started: the job is not relaunched; "
                  f"{launch.results_left(kept)}", file=sys.stderr)
            return 128 + stop.signum


def _snapshots(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="canary snapshots",
        description="List the committed snapshots in DIR, one JSON line each (id, position in "
                    "the program, time, bytes, workers, checksum status), oldest first.")
    ap.add_argument("dir")
    args = ap.parse_args(argv)
    damaged: dict[int, str] = {}
    rows = {s.id: describe(s) for s in committed(args.dir, damaged)}
    rows.update({k: {"id": k, "path": snapshot_folder(args.dir, k),
                     "checksums": f"damaged: {why}"} for k, why in damaged.items()})
    for k in sorted(rows):
        print(json.dumps(rows[k]), flush=True)
    return 0


RUN_HELP = """\
Runs SCRIPT on N workers plus one controller rank: mpiexec -n N+1 python -m canary.ranks
SCRIPT ARGS, which runs SCRIPT as `python -m mpi4py` does and records how each rank ended.

exit status:
  0        the job finished: rank 0 (the controller) ran the driver to its end
  2        the driver rejected its arguments or input on every rank, or canary a
           setting (a CANARY_* variable, an unwritable trace path), said once
  other    the driver's own status when it stopped by itself on every rank (0 for
           --help), or the code of a rank that ended the job after saying why (1: a
           task failed)
  128+S    a rank was killed by signal S (137: SIGKILL, 139: SIGSEGV) before the job
           finished; canary names the rank (with --restarts K, canary relaunches the job
           from its last snapshot up to K times first)
  1        a rank exited with status 0 before the job finished (a rank that exits
           with status C != 0 before then gives C), or MPI's process manager on a
           host (hydra_pmi_proxy) died: its ranks are stopped, and a job whose
           controller had finished is not 0 either (its last output may be lost);
           mpiexec killed by signal S gives 128+S
  124      the time limit (--timeout, MPIEXEC_TIMEOUT) expired
  130      canary run was interrupted (Ctrl-C), 143: terminated (SIGTERM), 129: hung
           up (SIGHUP); the job was stopped, or not started when the signal came
           before it or a restart of it (the line says which). 143 too when mpiexec
           got SIGTERM from outside (`kill`, a batch system) and passed it on to the
           ranks

snapshots: with --checkpoint DIR the job writes a snapshot every --checkpoint-every
seconds (default 60) into DIR, keeping the last --keep (default 2); `canary run -n M
--resume DIR` continues the job from the newest usable one on M workers (SCRIPT and ARGS
may be left out; if given they must be the recorded ones); `canary snapshots DIR` lists
them.

stopping: Ctrl-C, or SIGTERM/SIGHUP to canary run, stops the whole job (mpiexec and every
rank) within seconds and prints one line; a second Ctrl-C kills at once. SIGTERM to
mpiexec (MPICH) stops it too, in one line that names mpiexec. If canary run is killed with
SIGKILL, mpiexec gets SIGTERM and stops the job, and the ranks on this host stop by
themselves (Linux); the next canary run removes the run folder it may have left in TMPDIR.
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "simulate":
        from canary.sim.cli import main as simulate

        return simulate(argv[1:])
    if argv and argv[0] == "snapshots":
        try:
            return _snapshots(argv[1:])
        except SnapshotError as exc:
            print(f"canary snapshots: {exc}", file=sys.stderr)
            return 2
    if argv and argv[0] in ("cluster", "submit", "jobs", "logs", "cancel"):  # a shared pool
        from canary.pool.cli import main as pool

        return pool(argv, find_mpiexec, lambda: mpiexec_env(None, launch.checkout_root()))
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
    r.add_argument("--balance", choices=("on", "off"), default=None,
                   help="move partitions off workers that are markedly slower (default: "
                        "CANARY_BALANCE if set, else on; sets CANARY_BALANCE for the ranks)")
    r.add_argument("--checkpoint", metavar="DIR", default=None,
                   help="write snapshots into DIR (see 'snapshots' below)")
    r.add_argument("--checkpoint-every", metavar="SECONDS", type=float, default=None,
                   help="seconds of run time between snapshots (default "
                        f"{SnapshotConfig.every_s:g})")
    r.add_argument("--keep", type=int, default=None,
                   help=f"committed snapshots kept (default {SnapshotConfig.keep})")
    r.add_argument("--restarts", type=int, default=0, metavar="K",
                   help="when a rank dies, relaunch from the last snapshot, at most K times")
    r.add_argument("--resume", metavar="DIR", default=None,
                   help="continue the job from the newest usable snapshot in DIR")
    r.add_argument("script", nargs="?")
    r.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("simulate", help="scheduling simulator (see `canary simulate --help`)")
    sub.add_parser("snapshots", help="list the snapshots in a checkpoint directory")
    for name in ("cluster", "submit", "jobs", "logs", "cancel"):  # see canary.pool.cli
        sub.add_parser(name, help=f"a pool shared by jobs (see `canary {name} --help`)")
    sub.add_parser("doctor", help="check the hosts before a long run (see `canary doctor --help`)")
    args, unknown = ap.parse_known_args(argv)
    # `canary run`'s own usage for its mistakes, not the list of canary's commands
    if unknown:
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "run":
        every, keep = args.checkpoint_every, args.keep
        bad = out_of_range(
            ("--restarts", args.restarts, args.restarts >= 0, ">= 0"),
            ("--keep", keep, keep is None or keep >= 1, ">= 1"),
            ("--checkpoint-every", every, every is None or every >= 0 and math.isfinite(every),
             "a number of seconds >= 0"))
        if bad:
            r.error(bad)
        if (every is not None or keep is not None) and not (args.checkpoint or args.resume):
            r.error("--checkpoint-every and --keep need --checkpoint DIR (where the snapshots "
                    "go)")
        if args.timeout is not None and args.timeout < 1:
            r.error(f"--timeout must be at least 1 second, got {args.timeout} (leave it out "
                    "for no time limit)")
    try:
        with launch.stopped_by_signals():  # by default SIGTERM and SIGHUP end it without a word
            return _run(args)
    except launch.Stopped as stop:  # before the job started (the launcher handles it after)
        print(f"canary: {launch.stop_word(stop.signum)} before the job started: no job ran",
              file=sys.stderr)
        return 128 + stop.signum
    except SnapshotError as exc:
        print(f"canary run: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:  # no mpiexec, or it cannot be started
        print(f"canary: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before canary run's own handling was in place
        print("canary: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
