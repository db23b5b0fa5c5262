"""What a finished job returns on rank 0: :class:`JobResult` (both runners build one)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def stacked(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` stacked along axis 0, in order; parts of one number each (0-d) make a 1-d
    array of them. Raises numpy's ValueError when they cannot be (a mix of numbers and
    arrays, other axes that differ): callers say which pieces those were."""
    if all(p.ndim == 0 for p in parts):  # numpy cannot concatenate numbers: stack them
        return np.stack(parts)
    return np.concatenate(parts, axis=0)


NEVER_WRITTEN = ("no statement that writes the dataset has run (its writers are in a loop of "
                 "no passes, or in a branch not taken)")


@dataclass
class JobResult:
    """What a finished job returns on rank 0 (and from :func:`run_local`)."""

    results: dict[str, list[np.ndarray]]
    tasks_run: int
    workers: int
    seconds: float = 0.0
    controller_received: dict[str, int] = field(default_factory=dict)
    controller_sent: dict[str, int] = field(default_factory=dict)
    # nan where not measured: a pool's rank 0 serves every job at once, and cannot tell one
    # job's share of its CPU from another's
    controller_cpu_seconds: float = 0.0
    worker_sent: dict[str, int] = field(default_factory=dict)
    migrations: int = 0  # partitions moved between workers while the job ran
    bytes_migrated: int = 0  # bytes of partition values those moves carried
    snapshots: int = 0  # snapshots committed while the job ran
    resumed_from: int | None = None  # the snapshot the job resumed from, if it did
    events: int = 0  # events the in-process runner handled (0 over MPI)
    # the datasets the program has a report of: one of them missing from ``results`` had its
    # report in a loop of no passes or a branch not taken, not left out of the program
    reports: frozenset[str] = frozenset()

    @property
    def controller_cpu_percent(self) -> float | None:
        """The controller's CPU time as a percentage of the job's time, to 3 decimals; None
        where it was not measured (a pool job)."""
        if not math.isfinite(self.controller_cpu_seconds):
            return None
        return round(100 * self.controller_cpu_seconds / max(self.seconds, 1e-9), 3)

    def value(self, name: str) -> np.ndarray:
        """The single partition of reported one-partition dataset ``name``.

        Raises KeyError if ``name`` was not reported, ValueError if it has several partitions
        (:meth:`concat` stacks them)."""
        parts = self._reported(name)
        if len(parts) != 1:
            raise ValueError(f"dataset '{name}' has {len(parts)} partitions: value() is for a "
                             f"one-partition dataset; concat({name!r}) stacks them, "
                             f"results[{name!r}] lists them")
        return parts[0]

    def concat(self, name: str) -> np.ndarray:
        """All partitions of reported dataset ``name`` stacked along axis 0 (partitions that
        are one number each, 0-d arrays, make a 1-d array of them). Raises KeyError if
        ``name`` was not reported, ValueError if the partitions' other axes differ."""
        parts = self._reported(name)
        try:
            return stacked(parts)
        except ValueError:
            shapes = ", ".join(str(p.shape) for p in parts)
            raise ValueError(f"dataset '{name}': its partitions cannot be stacked along their "
                             f"first axis, their shapes are {shapes}; results[{name!r}] lists "
                             "them") from None

    def _reported(self, name: str) -> list[np.ndarray]:
        if not isinstance(name, str):  # a Dataset was said to be "not reported"
            raise TypeError(f"give the dataset's name, e.g. {getattr(name, 'name', 'x')!r}, not "
                            f"{name!r}")
        if name not in self.results and name in self.reports:
            raise KeyError(f"dataset '{name}' has no reported value: its report never ran (it is "
                           "in a loop of no passes, or in a branch not taken)")
        if name not in self.results:
            raise KeyError(f"dataset '{name}' was not reported: declare p.report(dataset) in the "
                           f"program (reported: {', '.join(sorted(self.results)) or 'none'})")
        parts = self.results[name]
        unset = next((k for k, v in enumerate(parts) if v is None), None)  # never written
        if unset is not None:
            raise ValueError(f"dataset '{name}': partition {unset} has no value: {NEVER_WRITTEN}")
        return parts

    @property
    def scheduling_messages(self) -> int:
        """Messages the controller sent or received other than the driver's reports and the
        workers' periodic load reports: these must not grow with iterations or partitions once
        the job is placed (load reports grow with time and workers; moves add their own)."""
        recv = sum(v for k, v in self.controller_received.items()
                   if k not in ("ReportPart", "LoadReport"))
        return recv + sum(self.controller_sent.values())
