"""Idle waiting for the runtimes: poll, then sleep, without burning a core another rank needs.

No MPI here: the runtimes poll, this decides how long to wait before the next poll.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import time
from collections.abc import Mapping


class Backoff:
    """Idle wait that costs almost no CPU: a few quick polls, then sleeps doubling to a cap.

    MPI's blocking calls poll a core at 100%; on a laptop with more ranks than cores that would
    steal the workers' CPU, so every wait loop in canary goes through this instead. A rank that
    has a core to itself may first poll hot for ``spin_s`` seconds after each ``reset()``: a
    message that arrives then is seen at once instead of up to a sleep later (the sleeps are
    what a worker-to-worker hop costs otherwise: see :func:`tight_timer_slack`).
    """

    def __init__(self, min_sleep: float = 2e-5, max_sleep: float = 1e-3, spins: int = 20,
                 spin_s: float = 0.0) -> None:
        self.min_sleep = min_sleep
        self.max_sleep = max_sleep
        self.spins = spins
        self.spin_s = spin_s
        self._idle = 0
        self._sleep = min_sleep
        self._spin_until = 0.0

    def reset(self) -> None:
        self._idle = 0
        self._sleep = self.min_sleep

    def sleep(self) -> None:
        self._idle += 1
        if self._idle <= self.spins:
            if self._idle == 1 and self.spin_s:
                self._spin_until = time.perf_counter() + self.spin_s
            return
        if self.spin_s and time.perf_counter() < self._spin_until:
            return
        time.sleep(self._sleep)
        self._sleep = min(self._sleep * 2, self.max_sleep)


def tight_timer_slack(ns: int = 1000) -> bool:
    """Ask Linux to wake this process's sleeps within ``ns`` nanoseconds of their deadline.

    The default slack is 50 µs, so ``time.sleep(20e-6)`` sleeps ~70-120 µs; the idle back-off's
    short sleeps are then what delays a message. Returns False (and changes nothing) where
    ``prctl`` is not available.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(29, ns, 0, 0, 0) == 0)  # 29: PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        return False


_frozen = False


def freeze_startup_objects() -> bool:
    """Move every object this process holds now (modules, classes, functions: what the imports
    made) out of the garbage collector's reach, once per process; later calls do nothing.
    Returns whether this call froze them.

    A full (generation-2) collection walks every tracked object. A rank holds about 50,000
    after importing numpy, numba and mpi4py and as many again once numba has compiled the
    kernels, and the collection, when the allocation counts happen to call for one, stops the
    rank for 25-95 ms inside an iteration of a few ms. Frozen, they are never walked again;
    what the job allocates afterwards is collected as usual. Once only: a process that runs
    several jobs would otherwise keep each job's objects for good.
    """
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.freeze()
    return True


def workers_fit_cores(size: int, environ: Mapping[str, str] = os.environ,
                      cores: int | None = None) -> bool:
    """Whether this node has a core for every worker rank on it, in a job of ``size`` ranks
    (the controller, rank 0, mostly sleeps and is not counted). The node's rank count comes
    from the launcher's environment (MPICH's ``MPI_LOCALNRANKS``, Open MPI's
    ``OMPI_COMM_WORLD_LOCAL_SIZE``); where neither is set, every rank is taken to be here.
    ``cores`` defaults to the cores this process may run on."""
    local = environ.get("MPI_LOCALNRANKS") or environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    here = int(local) if local and local.isdigit() else size
    if here == size:  # one node: the controller is here too
        here -= 1
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
    return here <= cores


def cpu_times() -> tuple[float, float]:
    """(seconds this process has run on a CPU, seconds it was ready to run but waited for one),
    since it started, from Linux's ``/proc/self/schedstat``; (0, 0) where that is not there.

    The wait is what another process on the same core takes: a worker sharing its core with a
    busy job runs its short tasks at their usual speed and loses the time between them, partly
    while it looks idle (a message has arrived but the worker does not get the CPU to see it).
    """
    try:
        with open("/proc/self/schedstat") as f:
            on_cpu, waited = f.read().split()[:2]
        return int(on_cpu) / 1e9, int(waited) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0
