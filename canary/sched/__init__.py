"""Scheduling policies for sharing a cluster among jobs.

Pure, seeded decision objects: no I/O, no global state, randomness only from the
``numpy.random.Generator`` a caller passes in. Today they run only in the simulator
(:mod:`canary.sim`); the worker and controller runtimes run one job at a time and use none
of them yet. See docs/scheduling.md.

* :mod:`canary.sched.placement` -- where a job's tasks go (Sparrow: random,
  per-task sampling, batch sampling, batch sampling with late binding,
  constrained per-task sampling).
* :mod:`canary.sched.queues` -- which queued item a worker's free slot serves
  (FIFO, strict priority, weighted fair sharing).
* :mod:`canary.sched.hfsp` -- job-level size-based policies (PS, SRPT, HFSP
  with aging) and :class:`~canary.sched.hfsp.HfspQueue` to use them as a
  worker queue.
"""

from canary.sched.hfsp import HfspJobs, HfspQueue, PsJobs, SrptJobs, make_job_scheduler
from canary.sched.placement import (
    BatchLateBinding,
    BatchSampling,
    ConstrainedSampling,
    PerTaskSampling,
    RandomPlacement,
    make_placement,
)
from canary.sched.queues import FifoQueue, Item, PriorityQueue, WeightedFairQueue, make_queue

__all__ = [
    "BatchLateBinding",
    "BatchSampling",
    "ConstrainedSampling",
    "FifoQueue",
    "HfspJobs",
    "HfspQueue",
    "Item",
    "PerTaskSampling",
    "PriorityQueue",
    "PsJobs",
    "RandomPlacement",
    "SrptJobs",
    "WeightedFairQueue",
    "make_job_scheduler",
    "make_placement",
    "make_queue",
]
