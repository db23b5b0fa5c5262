"""Discrete-event simulators that drive :mod:`canary.sched` policies.

* :mod:`canary.sim.cluster` -- Sparrow-style cluster (workers, slots,
  network delay, Poisson job arrivals).
* :mod:`canary.sim.sizebased` -- slot pool behind one job-level queue (HFSP).
* :mod:`canary.sim.experiments` -- the papers' experiments as functions.
* :mod:`canary.sim.cli` -- ``canary simulate`` / ``python -m canary.sim``.
"""
