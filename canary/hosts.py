"""Which hosts a job runs on: hostfiles, ranks per host, Slurm allocations, reachability.

``canary run -f HOSTFILE --ppn K`` and ``canary doctor`` go through here before mpiexec starts,
so that a mistake in the host list is one clear line within seconds, not an ssh prompt or a
hang of minutes:

* :func:`parse_hostfile` reads MPICH's (``host`` or ``host:SLOTS``) and Open MPI's
  (``host slots=SLOTS``) hostfile formats, ``#`` comments and blank lines;
* :func:`slurm_hosts` reads the nodes and tasks per node of the Slurm allocation a command
  runs in (``SLURM_JOB_NODELIST`` and ``SLURM_TASKS_PER_NODE`` and their relatives);
* :func:`plan_ranks` checks that the job's ranks fit the hosts (``--ppn``), and says where
  ranks would share a host's slots;
* :func:`check_reachable` resolves every host and, for hosts that are not this machine, opens
  ssh with a short timeout, all hosts at once.

No MPI here: the launcher (``canary.cli``) writes the plan as a hostfile for mpiexec.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from canary.errors import CanaryError

REACH_TIMEOUT = 5.0  # seconds a host gets to resolve and to answer ssh


class HostError(CanaryError, ValueError):
    """A hostfile, a Slurm allocation or a host is unusable; the message names it and says
    what to do."""


@dataclass(frozen=True)
class Host:
    """A host and the ranks it offers (``slots``: None where the list does not say)."""

    name: str
    slots: int | None = None
    where: str = ""  # where it was named (``FILE:LINE`` or ``SLURM_JOB_NODELIST``)


_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]:%]+")


def parse_hostfile(path: str) -> list[Host]:
    """The hosts of hostfile ``path``, in order.

    One host a line: ``name``, ``name:SLOTS`` (MPICH) or ``name slots=SLOTS`` (Open MPI;
    ``max_slots=`` is accepted and ignored); ``#`` starts a comment. Raises :class:`HostError`
    naming the file (and line) if it does not exist, cannot be read, is empty, names a host
    twice, or has a line of another shape.
    """
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise HostError(f"hostfile not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HostError(f"hostfile {path}: cannot be read ({exc})") from None
    hosts: list[Host] = []
    seen: dict[str, str] = {}
    for no, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        where = f"{path}:{no}"
        host = _parse_line(text, where)
        if host.name in seen:
            raise HostError(f"{where}: host {host.name!r} is listed again (first at "
                            f"{seen[host.name]}); give each host one line with its slots")
        seen[host.name] = where
        hosts.append(host)
    if not hosts:
        raise HostError(f"hostfile {path} names no host (expected lines like 'node1:4')")
    return hosts


def _parse_line(text: str, where: str) -> Host:
    shape = "expected 'host', 'host:SLOTS' or 'host slots=SLOTS'"
    words = text.split()
    name, slots = words[0], None
    if ":" in name and not name.startswith("["):  # MPICH's host:slots (not an IPv6 literal)
        name, _, count = name.rpartition(":")
        slots = _slots(count, where, shape)
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if not eq or key not in ("slots", "max_slots", "max-slots"):
            raise HostError(f"{where}: cannot read {text!r}: {shape}")
        if key == "slots":
            slots = _slots(value, where, shape)
    if not name or not _NAME.fullmatch(name):
        raise HostError(f"{where}: {name!r} is not a host name: {shape}")
    return Host(name, slots, where)


def _slots(count: str, where: str, shape: str) -> int:
    if not count.isdecimal() or int(count) < 1:
        raise HostError(f"{where}: slots must be a whole number >= 1, got {count!r}: {shape}")
    return int(count)


# -- Slurm ---------------------------------------------------------------------------------


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed node list as names, in order: ``node[01-03,7],gpu-[1-2]x`` is
    node01, node02, node03, node7, gpu-1x, gpu-2x (zero padding kept; several bracket groups
    in one name multiply out). Raises :class:`HostError` for an unbalanced bracket or a range
    that is not ``A-B`` with A <= B."""
    names: list[str] = []
    for item in _split_top(nodelist, "SLURM_JOB_NODELIST"):
        parts = re.split(r"(\[[^\]]*\])", item)
        expanded = [""]
        for part in parts:
            if part.startswith("["):
                choices = _expand_range(part[1:-1], nodelist)
            elif "[" in part or "]" in part:
                raise HostError(f"SLURM_JOB_NODELIST={nodelist!r}: unbalanced bracket in {item!r}")
            else:
                choices = [part]
            expanded = [a + b for a in expanded for b in choices]
        names.extend(expanded)
    return names


def _split_top(text: str, what: str) -> list[str]:
    """``text`` split at commas outside brackets (empty items dropped)."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if depth < 0 or depth > 1:
            raise HostError(f"{what}={text!r}: unbalanced bracket")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise HostError(f"{what}={text!r}: unbalanced bracket")
    items.append(cur)
    return [i.strip() for i in items if i.strip()]


def _expand_range(spec: str, nodelist: str) -> list[str]:
    out: list[str] = []
    for piece in spec.split(","):
        lo, dash, hi = piece.partition("-")
        if not lo.isdecimal() or (dash and not hi.isdecimal()) or (dash and int(hi) < int(lo)):
            raise HostError(f"SLURM_JOB_NODELIST={nodelist!r}: cannot read range {piece!r}")
        width = len(lo)
        out += [str(v).zfill(width) for v in range(int(lo), int(hi if dash else lo) + 1)]
    return out


def expand_counts(spec: str, what: str) -> list[int]:
    """Slurm's per-node counts (``2(x3),1`` is 2, 2, 2, 1) as a list. Raises :class:`HostError`
    naming the variable ``what`` if an item has another shape."""
    out: list[int] = []
    for item in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", item)
        if not m or int(m.group(1)) < 1:
            raise HostError(f"{what}={spec!r}: cannot read {item!r} (expected N or N(xM))")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def slurm_hosts(environ: Mapping[str, str] = os.environ) -> list[Host] | None:
    """The hosts of the Slurm allocation this process runs in, or None outside one.

    Nodes from ``SLURM_JOB_NODELIST`` (or ``SLURM_NODELIST``); slots per node from
    ``SLURM_TASKS_PER_NODE`` (``2(x3),1``), else ``SLURM_NTASKS_PER_NODE`` (one number for
    all), else ``SLURM_JOB_CPUS_PER_NODE``, else unknown. Raises :class:`HostError` if the
    variables are malformed or disagree on the number of nodes.
    """
    var = "SLURM_JOB_NODELIST" if environ.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    nodelist = environ.get(var, "").strip()
    if not nodelist:
        return None
    names = expand_nodelist(nodelist)
    counts: list[int] | None = None
    for count_var in ("SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        spec = environ.get(count_var, "").strip()
        if spec:
            counts = expand_counts(spec, count_var)
            if count_var == "SLURM_NTASKS_PER_NODE" or len(counts) == 1:
                counts = counts[:1] * len(names)
            if len(counts) != len(names):
                raise HostError(f"{count_var}={spec!r} gives {len(counts)} nodes but {var} "
                                f"names {len(names)}")
            break
    return [Host(n, None if counts is None else counts[i], var) for i, n in enumerate(names)]


# -- ranks per host ------------------------------------------------------------------------


@dataclass(frozen=True)
class RankPlan:
    """How many ranks each host gets (in hostfile order; rank 0, the controller, is on the
    first), and what the user should hear about it."""

    ranks: list[tuple[Host, int]]
    warnings: list[str]

    def hostfile_text(self) -> str:
        """The plan as an MPICH hostfile (``host:RANKS`` lines; hosts with none left out)."""
        return "".join(f"{h.name}:{k}\n" for h, k in self.ranks if k)


def plan_ranks(hosts: list[Host], ranks: int, ppn: int | None = None) -> RankPlan:
    """Place ``ranks`` MPI ranks (workers plus the controller) on ``hosts``, filling each host
    in order: ``ppn`` ranks per host if given, else each host's slots (1 where unknown, as
    MPICH assumes).

    Raises :class:`HostError` if ``ppn`` < 1 or the ranks do not fit (``ppn`` times the hosts,
    or the slots, fewer than ``ranks``): the job would otherwise put several ranks on a core
    without saying so. A ``ppn`` above a host's stated slots is allowed with a warning (its
    ranks share cores: canary's idle workers then never poll hot, see ``canary.idle``).
    """
    if ppn is not None and ppn < 1:
        raise HostError(f"--ppn must be at least 1 rank per host, got {ppn}")
    warnings = []
    caps = []
    for h in hosts:
        cap = ppn if ppn is not None else (h.slots or 1)
        if ppn is not None and h.slots is not None and ppn > h.slots:
            warnings.append(f"--ppn {ppn} is more than the {h.slots} slots of host {h.name} "
                            f"({h.where}): its ranks will share cores")
        caps.append(cap)
    if sum(caps) < ranks:
        how = (f"--ppn {ppn} x {len(hosts)} host(s)" if ppn is not None else
               f"the {sum(caps)} slot(s) of {len(hosts)} host(s)")
        # one rank is the controller: a single slot holds no worker, so -n 0 is no advice
        fewer = f"fewer workers (-n {sum(caps) - 1}), " if sum(caps) >= 2 else ""
        raise HostError(f"{ranks} ranks (the workers plus the controller) do not fit {how} = "
                        f"{sum(caps)}: use {fewer}more hosts, or a larger --ppn")
    placed, left = [], ranks
    for h, cap in zip(hosts, caps):
        k = min(cap, left)
        placed.append((h, k))
        left -= k
    return RankPlan(placed, warnings)


def available_ranks(hosts: list[Host], ppn: int | None = None) -> int:
    """Ranks the hosts hold: ``ppn`` each if given, else their slots (1 where unknown)."""
    return sum(ppn if ppn is not None else (h.slots or 1) for h in hosts)


# -- reachability --------------------------------------------------------------------------


def _with_timeout(fn: Callable[[], object], timeout: float) -> object:
    """``fn()``'s result, or TimeoutError if it has not returned within ``timeout`` seconds
    (it goes on in a daemon thread: a resolver call cannot be interrupted)."""
    box: list[object] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            err.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"no answer within {timeout:g} s")
    if err:
        raise err[0]
    return box[0]


def resolve(name: str, timeout: float = REACH_TIMEOUT) -> list[str]:
    """The addresses of host ``name``. Raises :class:`HostError` if it does not resolve
    within ``timeout`` seconds."""
    try:
        infos = _with_timeout(lambda: socket.getaddrinfo(name, None, type=socket.SOCK_STREAM),
                              timeout)
    except (OSError, TimeoutError) as exc:
        raise HostError(f"host {name!r} does not resolve ({exc}): check its spelling in the "
                        "hostfile, or /etc/hosts and DNS on this machine") from None
    assert isinstance(infos, list)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_local(name: str, addresses: list[str]) -> bool:
    """Whether host ``name`` (at ``addresses``) is this machine: its name, or an address this
    machine can bind to (loopback included)."""
    if name in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    for addr in addresses:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr, 0))
            return True
        except OSError:
            continue
    return False


def _check_one(host: Host, timeout: float, ssh: str | None) -> str | None:
    """Why ``host`` cannot be used, or None if it can."""
    try:
        addresses = resolve(host.name, timeout)
    except HostError as exc:
        return str(exc)
    if is_local(host.name, addresses):
        return None
    if ssh is None:
        return (f"host {host.name!r} is another machine and ssh is not installed here "
                "(MPICH starts remote ranks with ssh): install openssh-client")
    cmd = [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}",
           "-o", "StrictHostKeyChecking=accept-new", host.name, "true"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 2,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return (f"host {host.name!r} ({addresses[0]}) did not answer ssh within {timeout:g} s: "
                "is it up, and is port 22 open from here?")
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return (f"host {host.name!r}: `ssh {host.name} true` failed ({why}): set up "
                "password-less ssh to it (docs/cluster.md)")
    return None


def check_reachable(hosts: list[Host], timeout: float = REACH_TIMEOUT,
                    ssh: str | None = "") -> None:
    """Check every host at once: it resolves, and it is this machine or answers
    ``ssh -o BatchMode=yes HOST true`` (no password prompt) within ``timeout`` seconds.

    ``ssh``: the ssh program ("" finds it on PATH; None: none available). Returns within about
    ``timeout`` + 2 seconds whatever the hosts do. Raises :class:`HostError` naming every host
    that failed and why.
    """
    if ssh == "":
        ssh = shutil.which("ssh")
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        problems = list(pool.map(lambda h: _check_one(h, timeout, ssh), hosts))
    bad = [f"{p} [{h.where}]" if h.where else p for h, p in zip(hosts, problems) if p]
    if bad:
        raise HostError("; ".join(bad))


def job_hosts(hostfile: str | None, environ: Mapping[str, str] = os.environ
              ) -> tuple[list[Host], str] | None:
    """The hosts a job runs on and where they came from (``hostfile`` or the Slurm
    allocation), or None for this machine alone. A hostfile wins over an allocation."""
    if hostfile:
        return parse_hostfile(hostfile), hostfile
    found = slurm_hosts(environ)
    if found is not None:
        return found, "the Slurm allocation"
    return None


@dataclass(frozen=True)
class LaunchHosts:
    """What ``canary run`` hands mpiexec about hosts."""

    workers: int
    hostfile_text: str | None  # an MPICH hostfile to pass with -f (None: pass none of ours)
    warnings: list[str]
    source: str | None  # the hostfile's path or "the Slurm allocation"; None: this machine


#: the most ranks per core ``canary run`` starts on one machine without a hostfile
MAX_RANKS_PER_CORE = 16


def launch_hosts(hostfile: str | None, workers: int | None, ppn: int | None, hydra: bool,
                 environ: Mapping[str, str] = os.environ, check: bool = True,
                 timeout: float = REACH_TIMEOUT) -> LaunchHosts:
    """Decide where ``canary run``'s ranks go: the hostfile, else the Slurm allocation this
    runs in, else this machine.

    ``workers`` None: as many as the hosts hold minus the controller (2 on this machine
    alone). With MPICH's hydra the hosts are checked (``check``: every host resolves and
    answers ssh within ``timeout`` s; skipped inside Slurm, whose ``srun`` starts the ranks)
    and placed by :func:`plan_ranks`, written as a hostfile of ``host:RANKS`` lines. With
    another MPI the user's hostfile goes to mpiexec as it is and ``--ppn`` is refused.
    Raises :class:`HostError` saying what is wrong.
    """
    found = job_hosts(hostfile, environ)
    hosts, source = found if found is not None else ([], None)
    if not hosts and ppn is not None:  # this machine alone: --ppn only bounds the ranks
        hosts = [Host("localhost", os.cpu_count(), "this machine")]
    if workers is None:
        workers = max(1, available_ranks(hosts, ppn) - 1) if hosts else 2
    if workers < 1:
        raise HostError(f"-n must be at least 1 worker, got {workers}")
    if not hosts:  # this machine alone
        cores = os.cpu_count() or 1
        if workers + 1 > MAX_RANKS_PER_CORE * cores:  # mpiexec grew to GBs starting 1e11
            raise HostError(f"-n {workers}: {workers + 1} ranks on this machine's {cores} "
                            f"core(s) is more than {MAX_RANKS_PER_CORE} a core; for more "
                            "machines give -f HOSTFILE (or run inside a Slurm allocation)")
        return LaunchHosts(workers, None, [], None)
    if not hydra:
        if ppn is not None:
            raise HostError("--ppn needs MPICH's mpiexec (hydra); with another MPI give each "
                            "host's ranks in the hostfile (Open MPI: 'host slots=K')")
        return LaunchHosts(workers, None, [], source)
    if check and source != "the Slurm allocation":
        check_reachable(hosts, timeout)
    plan = plan_ranks(hosts, workers + 1, ppn)
    return LaunchHosts(workers, plan.hostfile_text(), plan.warnings, source)
