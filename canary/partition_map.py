"""The versioned partition map and the rule for data that arrives at a non-owner.

Entries are per (co-location group, partition index): partition ``i`` of every dataset of a
group lives on one worker. Each entry has its own version, bumped on every move, so a message
can say which placement its sender believed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ACCEPT = "accept"
HOLD = "hold"
FORWARD = "forward"


@dataclass
class PartitionMap:
    """``owners[g][i]`` is the 0-based worker holding partition ``i`` of group ``g``;
    ``versions[g][i]`` its entry version (starts at 1)."""

    n_workers: int
    owners: list[list[int]]
    versions: list[list[int]]

    @classmethod
    def initial(cls, group_sizes: list[int], n_workers: int) -> PartitionMap:
        """Balanced contiguous blocks per group; one-partition groups are spread round-robin.

        Contiguous blocks keep neighbouring partitions on one worker (fewer messages for
        block-structured exchanges); with more workers than partitions some workers hold none.
        Raises ValueError if ``n_workers < 1``.
        """
        if n_workers < 1:
            raise ValueError(f"a job needs at least one worker, got {n_workers}")
        owners: list[list[int]] = []
        singles = 0
        for p in group_sizes:
            if p == 1:
                owners.append([singles % n_workers])
                singles += 1
            else:
                owners.append([i * n_workers // p for i in range(p)])
        return cls(n_workers, owners, [[1] * len(o) for o in owners])

    def copy(self) -> PartitionMap:
        """A copy sharing nothing with this map (what a message carries)."""
        return PartitionMap(self.n_workers, [list(o) for o in self.owners],
                            [list(v) for v in self.versions])

    def owner(self, group: int, index: int) -> int:
        return self.owners[group][index]

    def version(self, group: int, index: int) -> int:
        return self.versions[group][index]

    def local(self, group: int, worker: int) -> list[int]:
        """Partition indices of ``group`` held by ``worker``, ascending."""
        return [i for i, w in enumerate(self.owners[group]) if w == worker]

    def move(self, group: int, index: int, worker: int) -> None:
        """Reassign an entry and bump its version (a migration)."""
        if not 0 <= worker < self.n_workers:
            raise ValueError(f"no worker {worker} (job has {self.n_workers})")
        self.owners[group][index] = worker
        self.versions[group][index] += 1

    def adopt(self, group: int, index: int, owner: int, version: int) -> bool:
        """Take the entry ``(owner, version)`` if its version is higher than ours; say if so."""
        if version <= self.versions[group][index]:
            return False
        self.versions[group][index] = version
        self.owners[group][index] = owner
        return True

    def merge(self, newer: PartitionMap,
              skip: Callable[[int, int, int], bool] | None = None) -> None:
        """Take every entry of ``newer`` whose version is higher than ours, except those for
        which ``skip(group, index, new_owner)`` is true."""
        for g, (own, ver) in enumerate(zip(newer.owners, newer.versions)):
            for i, v in enumerate(ver):
                if v > self.versions[g][i] and (skip is None or not skip(g, i, own[i])):
                    self.adopt(g, i, own[i], v)

    def validate_state(self) -> None:
        """Raise AssertionError unless every entry has exactly one valid owner and version >= 1."""
        assert len(self.owners) == len(self.versions)
        for g, (own, ver) in enumerate(zip(self.owners, self.versions)):
            assert len(own) == len(ver), f"group {g}: owners/versions length differ"
            for i, (w, v) in enumerate(zip(own, ver)):
                assert 0 <= w < self.n_workers, f"group {g} partition {i}: bad owner {w}"
                assert v >= 1, f"group {g} partition {i}: bad version {v}"


def route_incoming(me: int, owner: int, my_version: int, sender_version: int) -> str:
    """Decide what a worker does with data addressed to a partition.

    ``owner``/``my_version`` are the receiver's map entry, ``sender_version`` the entry version
    the sender routed by. A sender with a newer version knows of a move the receiver has not
    seen: HOLD until the map update arrives. Otherwise the receiver's map is at least as new:
    ACCEPT if it owns the partition, else FORWARD to the owner it knows. Nothing is dropped
    and nothing is delivered twice, since exactly one of the three happens.
    """
    if sender_version > my_version:
        return HOLD
    if owner == me:
        return ACCEPT
    return FORWARD
