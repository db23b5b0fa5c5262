"""Idle waiting for the runtimes: poll, then sleep, without burning a core another rank needs.

No MPI here: the runtimes poll, this decides how long to wait before the next poll.
"""

from __future__ import annotations

import ctypes
import gc
import os
import socket
import sys
import time
from collections.abc import Sequence


class Backoff:
    """Idle wait that costs almost no CPU: a few quick polls, then sleeps doubling to a cap.

    MPI's blocking calls poll a core at 100%; on a laptop with more ranks than cores that would
    steal the workers' CPU, so every wait loop in canary goes through this instead. A rank that
    has a core to itself may first poll hot for ``spin_s`` seconds after each ``reset()``: a
    message that arrives then is seen at once instead of up to a sleep later (the sleeps are
    what a worker-to-worker hop costs otherwise: see :func:`tight_timer_slack`).
    """

    #: Poll hot again after this many periods in a row of half ``stop_hot_at``'s wait or less,
    #: twice as many after each stop (up to :attr:`MAX_QUIET`).
    QUIET = 2
    MAX_QUIET = 64

    def __init__(self, min_sleep: float = 2e-5, max_sleep: float = 1e-3, spins: int = 20,
                 spin_s: float = 0.0, stop_hot_at: float = 0.10) -> None:
        self.min_sleep = min_sleep
        self.max_sleep = max_sleep
        self.spins = spins
        self.spin_s = spin_s
        #: stop polling hot once the rank waited for a CPU more than this fraction of a period
        self.stop_hot_at = stop_hot_at
        self._hot_s = spin_s
        self._quiet_needed = self.QUIET // 2  # doubled at the first stop
        self._quiet = 0
        self._idle = 0
        self._sleep = min_sleep
        self._spin_until = 0.0

    def note_cpu_wait(self, waited: float, interval: float) -> bool:
        """Tell the back-off that the rank was ready to run but waited ``waited`` seconds for a
        CPU in the last ``interval`` seconds (:func:`cpu_times`); returns whether it polls hot
        from now on.

        A rank given a core of its own (``spin_s`` > 0) can still find another process on it: a
        job the rank's placement did not count. Polling hot then keeps the rank runnable while
        it has nothing to do, the kernel shares the core between the two by turns of
        milliseconds, and the message the rank waits for is seen only at its next turn. Asleep,
        it leaves the core to the other process between messages. So the rank stops polling
        hot once it waited for a CPU more than ``stop_hot_at`` of a period (10%; 1 or more:
        never). It polls hot again after :attr:`QUIET` periods in a row under half that, and
        after each later stop it waits twice as many (up to :attr:`MAX_QUIET`): a rank with
        little to do sleeps through most of a period and waits little even beside a busy
        process, and would otherwise find it again every other period. A rank that was never
        to poll hot never does.
        """
        if not self._hot_s or interval <= 0:
            return self.spin_s > 0
        if waited > self.stop_hot_at * interval:
            if self.spin_s:
                self.spin_s = 0.0
                self._quiet_needed = min(self._quiet_needed * 2, self.MAX_QUIET)
            self._quiet = 0
        elif not self.spin_s:
            self._quiet = self._quiet + 1 if waited < self.stop_hot_at / 2 * interval else 0
            if self._quiet >= self._quiet_needed:
                self.spin_s = self._hot_s
        return self.spin_s > 0

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


#: Where a rank runs: its host's name and the cores it may run on (its affinity mask).
CorePlacement = tuple[str, frozenset[int]]


def core_placement() -> CorePlacement:
    """This process's :data:`CorePlacement`: ``socket.gethostname()`` and
    ``os.sched_getaffinity(0)`` (every core ``os.cpu_count()`` names where there is no affinity,
    as off Linux)."""
    try:
        cores = frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = frozenset(range(os.cpu_count() or 1))
    return socket.gethostname(), cores


def has_own_core(worker: int, placements: Sequence[CorePlacement]) -> bool:
    """Whether worker ``worker`` can poll hot without taking a core another worker needs.

    ``placements`` are the workers' (the controller, which mostly sleeps, is not counted), in
    worker order. The worker is counted with every worker on its host whose cores overlap its
    own, and it has a core of its own if they are no more than the cores they may run on
    together. That is the rule for ranks left free on a node (4 workers on 16 cores: yes; 3 on
    2: no), for a job confined to a few cores (``taskset -c 0,1 mpiexec -n 5``: 4 workers on
    2 cores, no) and for ranks bound a core each (``mpiexec -bind-to core``, Open MPI's and
    Slurm's usual binding): each has its core, unless the launcher had to put two on one.
    Raises IndexError if ``worker`` has no placement.
    """
    host, cores = placements[worker]
    sharing = [c for h, c in placements if h == host and c & cores]
    return len(sharing) <= len(frozenset().union(*sharing))


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
