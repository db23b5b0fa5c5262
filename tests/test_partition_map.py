"""The versioned partition map and the hold/forward rule for data that reaches a non-owner."""

from __future__ import annotations

import pytest

from canary.partition_map import ACCEPT, FORWARD, HOLD, PartitionMap, route_incoming


def test_initial_placement_is_balanced_contiguous_and_versioned() -> None:
    m = PartitionMap.initial([8, 1, 1, 3], n_workers=3)
    assert m.owners[0] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert m.owners[1] == [0] and m.owners[2] == [1]  # one-partition groups spread round-robin
    assert m.owners[3] == [0, 1, 2]
    assert all(v == 1 for vs in m.versions for v in vs)
    m.validate_state()


def test_more_workers_than_partitions_leaves_some_idle() -> None:
    m = PartitionMap.initial([2], n_workers=5)
    assert m.owners[0] == [0, 2]
    assert m.local(0, 1) == [] and m.local(0, 2) == [1]


def test_move_bumps_only_that_entry_and_merge_keeps_newer() -> None:
    a = PartitionMap.initial([4], 2)
    b = PartitionMap.initial([4], 2)
    b.move(0, 1, 1)
    assert b.version(0, 1) == 2 and b.version(0, 0) == 1
    a.merge(b)
    assert a.owner(0, 1) == 1 and a.version(0, 1) == 2
    stale = PartitionMap.initial([4], 2)
    a.merge(stale)  # an older map never undoes a move
    assert a.owner(0, 1) == 1
    with pytest.raises(ValueError, match="no worker 7"):
        a.move(0, 0, 7)


def test_validate_state_catches_a_bad_owner() -> None:
    m = PartitionMap.initial([2], 2)
    m.owners[0][1] = 9
    with pytest.raises(AssertionError, match="bad owner"):
        m.validate_state()


@pytest.mark.parametrize(
    "me, owner, mine, sender, expected",
    [
        (0, 0, 1, 1, ACCEPT),  # same view, I own it
        (0, 0, 3, 2, ACCEPT),  # sender is stale but I own it in my newer map
        (0, 1, 2, 3, HOLD),  # sender knows a newer placement: wait for the map update
        (0, 0, 1, 2, HOLD),  # I think I own it, but it moved on in a newer version
        (0, 1, 2, 1, FORWARD),  # sender is stale and I know the new owner
        (0, 1, 2, 2, FORWARD),  # same version, not mine: forward to the owner
    ],
)
def test_route_incoming(me: int, owner: int, mine: int, sender: int, expected: str) -> None:
    assert route_incoming(me, owner, mine, sender) == expected


def test_adopt_takes_only_a_newer_entry_and_merge_can_leave_entries_to_the_caller() -> None:
    m = PartitionMap.initial([4], 2)
    assert m.adopt(0, 1, 1, 2) and (m.owner(0, 1), m.version(0, 1)) == (1, 2)
    assert not m.adopt(0, 1, 0, 2) and m.owner(0, 1) == 1  # not newer: kept
    newer = PartitionMap.initial([4], 2)
    newer.move(0, 0, 1)
    newer.move(0, 3, 0)
    m.merge(newer, skip=lambda g, i, owner: owner == 1)  # a worker's own incoming entry
    assert (m.owner(0, 0), m.version(0, 0)) == (0, 1)  # skipped
    assert (m.owner(0, 3), m.version(0, 3)) == (0, 2)  # taken
