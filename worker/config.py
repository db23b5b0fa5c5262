"""Everything a worker can be tuned by, in one place: :class:`WorkerConfig`.

The environment is read here and only here (:meth:`WorkerConfig.from_env`), once, when a worker
starts. The defaults are what the benchmarks in ``docs/performance.md`` were measured with,
but for ``window_s``: rows dated before 2026-11-27 ran with the window fixed at ``window``
(what ``CANARY_WINDOW_MS=0`` gives now).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from canary.env import SLOWDOWN_ENV, env_number
from canary.idle import Backoff

#: Quick polls of an idle worker before it sleeps or polls hot (the controller's: Backoff's 20).
IDLE_SPINS = 200

# Environment variable -> (field, multiplier from the variable's unit to the field's, integer?)
ENVIRONMENT: dict[str, tuple[str, float, bool]] = {
    "CANARY_MAX_FUSED": ("max_fused", 1.0, True),
    "CANARY_SPIN_US": ("spin_s", 1e-6, False),
    "CANARY_HOT_WAIT_PCT": ("hot_wait_limit", 1e-2, False),
    "CANARY_COMPILE_AFTER": ("compile_after", 1.0, True),
    "CANARY_STORY": ("story_size", 1.0, True),
    "CANARY_RECYCLE_MB": ("recycle_bytes", float(1 << 20), True),
    "CANARY_REPORT_MS": ("report_s", 1e-3, False),
    "CANARY_WINDOW_MS": ("window_s", 1e-3, False),
}


@dataclass(frozen=True)
class WorkerConfig:
    """A worker's tunables. The state machine reads the first group, the MPI runtime the second.

    Raises ValueError (naming the field) for a value out of range.
    """

    # ---- the state machine (canary.worker.state)
    #: Most stage instances a worker may have emitted and not finished (the run-ahead window).
    window: int = 64
    #: ... and about this many seconds of the program's pace, measured at each load report:
    #: running further ahead hides no latency, but a snapshot's barrier is the furthest
    #: worker's position, so a worker 64 slow instances ahead delays every snapshot by as long
    #: (0: the window stays at ``window``).
    window_s: float = 0.5
    #: ... but never fewer than this many (or ``window``, if smaller).
    window_min: int = 8
    #: Most tasks the first fused compute stretch may stand for; below 2, fusion is off. Nothing
    #: bounds a stretch in seconds before one has been timed (no message is read while one
    #: runs), so the first is small: with 0.5 s kernels, 1,024 tasks would hold every message
    #: for over 8 minutes. The next are sized from its time (``adapt_fused``).
    max_fused: int = 2
    #: Size later stretches from the measured time of the last one (see ``stretch_budget``).
    adapt_fused: bool = True
    #: A fused stretch should last about this long ...
    fuse_target_s: float = 5e-3
    #: ... but cover at least this many stage instances (a stretch costs a few µs per
    #: partition whatever its length, so a one-stage stretch saves nothing over lone tasks) ...
    fuse_min_instances: int = 8
    #: ... and never last longer than this: no message is read while it runs.
    fuse_max_s: float = 2e-2
    #: Upper bound of any stretch, in tasks.
    max_fused_cap: int = 1 << 16
    #: A one-instance stretch whose tasks take this long or more is emitted as ordinary tasks
    #: from then on: fusing saves a few µs a task, but holds every output back until the last
    #: partition's kernel, and the sends they feed then leave together at the end.
    lone_task_s: float = 5e-5
    #: Complete canary's own small moves (a broadcast's or a reduce's pieces, a replace, sum or
    #: concat gather, up to ``urgent_max_bytes``) inside ``handle`` rather than as tasks.
    inline: bool = True
    #: A scatter of at most this many bytes runs before queued compute tasks (its message is
    #: what another worker waits for); larger pieces keep their place.
    urgent_max_bytes: int = 1 << 16
    #: Records kept for ``WorkerState.story`` (0: none): a few per task, ~200 bytes each, so the
    #: default covers the last few iterations of a typical job (``CANARY_STORY``).
    story_size: int = 1024
    #: Tests only: pick the next ready task at random with this seed instead of urgent-first
    #: FIFO, so that every order a runtime could produce gets exercised.
    ready_order_seed: int | None = None

    # ---- the MPI runtime (canary.worker.runtime)
    #: With a core per worker, poll hot this long after a burst of work before sleeping: the
    #: piece or signal a worker waits for usually comes within it (``CANARY_SPIN_US``).
    spin_s: float = 5e-2
    #: Stop polling hot while the worker waits for a CPU more than this fraction of a report
    #: period: another process is on its core (``canary.idle.Backoff.note_cpu_wait``;
    #: ``CANARY_HOT_WAIT_PCT``, 100 or more: never stop).
    hot_wait_limit: float = 0.10
    #: Longest idle sleep between polls.
    max_sleep_s: float = 2.5e-4
    #: Seconds of tasks between two MPI polls while tasks are runnable.
    poll_interval_s: float = 5e-5
    #: Most tasks between two polls.
    max_batch: int = 64
    #: Tasks a stretch body runs through Python dispatch before it is compiled into one loop
    #: (``canary.worker.chain``; compiling costs about what that much dispatch does).
    compile_after: int = 200_000
    #: Bytes of pages of received arrays a worker keeps, a few seconds, for the next arrays of
    #: the same sizes (``canary.mpi_transport.Recycler``): receiving into new pages costs about
    #: twice what receiving into kept ones does (``CANARY_RECYCLE_MB``; 0 keeps none).
    recycle_bytes: int = 256 << 20
    #: Seconds between two load reports to the controller (CPU time per partition, idle time):
    #: the controller's messages grow with time and workers, not with tasks
    #: (``CANARY_REPORT_MS``).
    report_s: float = 0.5
    #: Make every task take this many times as long as it does (the runtime spins for the
    #: difference after each task): a stand-in for a slower machine, for experiments
    #: (``CANARY_SLOWDOWN=WORKER:FACTOR``).
    slowdown: float = 1.0

    def idle_backoff(self, own_core: bool) -> Backoff:
        """The worker's idle wait (``canary.worker.runtime``): ``IDLE_SPINS`` quick polls, then
        sleeps up to ``max_sleep_s``; with a core of its own (``own_core``) it polls hot for
        ``spin_s`` after each burst of work, until it waits for a CPU more than
        ``hot_wait_limit`` of a report period."""
        return Backoff(max_sleep=self.max_sleep_s, spins=IDLE_SPINS,
                       spin_s=self.spin_s if own_core else 0.0, stop_hot_at=self.hot_wait_limit)

    @property
    def window_floor(self) -> int:
        """The fewest stage instances the run-ahead window holds: ``window_min``, or
        ``window`` if smaller."""
        return min(self.window_min, self.window)

    def __post_init__(self) -> None:
        for name, low in (("window", 1), ("window_min", 1), ("max_fused", 0),
                          ("fuse_min_instances", 1), ("max_fused_cap", 2),
                          ("urgent_max_bytes", 0), ("story_size", 0), ("max_batch", 1),
                          ("compile_after", 0), ("recycle_bytes", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"WorkerConfig.{name} must be an integer >= {low}, "
                                 f"got {value!r}")
        for name in ("window_s", "fuse_target_s", "fuse_max_s", "lone_task_s", "spin_s",
                     "hot_wait_limit", "max_sleep_s", "poll_interval_s", "report_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"WorkerConfig.{name} must be a number >= 0, got {value!r}")
        if not isinstance(self.slowdown, (int, float)) or not self.slowdown >= 1:
            raise ValueError(f"WorkerConfig.slowdown must be a number >= 1, got {self.slowdown!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, worker: int | None = None,
                 n_workers: int | None = None, **overrides: Any) -> WorkerConfig:
        """The defaults, then the ``CANARY_*`` variables of ``environ`` (:data:`ENVIRONMENT`,
        and ``CANARY_SLOWDOWN=WORKER:FACTOR`` for ``worker`` of ``n_workers``), then
        ``overrides``. Raises ValueError naming the variable for a malformed value."""
        values: dict[str, Any] = {}
        slow = slowdown_from_env(environ, n_workers)
        if slow is not None and worker is not None and slow[0] == worker:
            values["slowdown"] = slow[1]
        defaults = cls()
        for var, (name, unit, integer) in ENVIRONMENT.items():
            if environ.get(var, "").strip():
                # a report period of 0 would flood the controller: above 0, said up front
                raw = env_number(var, getattr(defaults, name) / unit, integer=integer,
                                 environ=environ, above=name == "report_s")
                values[name] = int(raw * unit) if integer else raw * unit
        known = {f.name for f in fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"WorkerConfig has no field(s) {sorted(unknown)}")
        return replace(defaults, **values, **overrides)


def slowdown_from_env(environ: Mapping[str, str], n_workers: int | None) -> tuple[int, float] | None:
    """``CANARY_SLOWDOWN=WORKER:FACTOR`` as ``(worker, factor)``, or None when unset. Raises
    ValueError naming the variable unless WORKER is a 0-based worker index (below
    ``n_workers`` when given) and FACTOR a finite number >= 1 (an infinite one would
    stop the worker for good)."""
    raw = environ.get(SLOWDOWN_ENV, "").strip()
    if not raw:
        return None
    what = (f"environment variable {SLOWDOWN_ENV}={raw!r} is not WORKER:FACTOR (a 0-based "
            "worker index and a finite number >= 1, e.g. 1:3): set it so or unset it")
    worker_s, sep, factor_s = raw.partition(":")
    try:
        worker, factor = int(worker_s), float(factor_s)
    except ValueError:
        raise ValueError(what) from None
    if not sep or worker < 0 or not 1 <= factor < math.inf:
        raise ValueError(what)
    if n_workers is not None and worker >= n_workers:
        raise ValueError(f"environment variable {SLOWDOWN_ENV}={raw!r} names worker {worker}, "
                         f"but the job has {n_workers} workers: 0..{n_workers - 1}; set it to "
                         "one of them or unset it")
    return worker, factor
