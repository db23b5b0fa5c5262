"""Partitions that move: the worker's side of the migration protocol.

A move hands partition ``i`` of every dataset of co-location group ``g`` from a source worker
to a destination. Every task touches the partitions of exactly one (group, index), so the tasks
of the moving partition split cleanly by stage instance at a **cut**:

1. The controller bumps the entry's version, sends the map update to every worker and
   :class:`~canary.messages.MigrateOut` to the source.
2. The source stops emitting stage instances and offers the partition to the destination with
   its position ``s`` (:class:`~canary.messages.MigrateOffer`).
3. The destination answers with the cut, ``max(s, d)``, ``d`` its own position
   (:class:`~canary.messages.MigrateAccept`). Neither worker has emitted an instance at or past
   the cut with a task the other must run: the source runs every instance before the cut on
   the partition, the destination every instance from the cut on. The source goes on emitting
   with the partition up to the cut, then without it; the destination emits with it from the
   cut on, its tasks waiting on a frozen placeholder until the values arrive.
4. The source lets every task before the cut finish (gathers included: it keeps receiving
   their pieces), then sends the values (:class:`~canary.messages.MigrateData`, and one
   :class:`~canary.messages.MigrateArray` each, a raw buffer) with the last stage instance that
   touched each, forwards the pieces it holds for instances from the cut on, and tells the
   controller the partition has left (:class:`~canary.messages.MigrateShipped`), behind its
   report parts of it.
5. The destination installs the values and unfreezes the partition, so its waiting tasks go on
   exactly where the source stopped, and tells the controller
   (:class:`~canary.messages.MigrateDone`), which may then move the partition again.

While a move is under way, a piece for the moving partition goes by its stage instance: before
the cut it belongs to the source, from the cut on to the destination; either forwards what is
the other's. Once the move is done the map's version rule alone applies
(:func:`canary.partition_map.route_incoming`): a stale sender's piece reaching the source is
forwarded. No piece is lost or delivered twice, and no task runs twice or not at all.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from canary.messages import (
    CONTROLLER,
    MigrateAccept,
    MigrateArray,
    MigrateData,
    MigrateDone,
    MigrateOffer,
    MigrateOut,
    MigrateShipped,
    Piece,
    worker_rank,
)
from canary.worker.core import WorkerCore
from canary.worker.tasks import Partition


@dataclass
class MoveOut:
    """A partition this worker hands over (the source's side)."""

    move: int
    group: int
    index: int
    dest: int
    offered_at: int  # this worker's position when it offered
    cut: int | None = None  # known once the destination accepts
    past_cut: bool = False  # the interpreter reached the cut: no new task for the partition
    waiting: list[Piece] = field(default_factory=list)  # pieces the cut will decide


@dataclass
class MoveIn:
    """A partition this worker takes over (the destination's side)."""

    move: int
    group: int
    index: int
    source: int
    cut: int
    header: MigrateData | None = None
    arrays: dict[int, np.ndarray] = field(default_factory=dict)


class Migration(WorkerCore):
    """The source's and the destination's steps of a move (mixed into ``WorkerState``)."""

    def _init_migration(self) -> None:
        self.moves_out: dict[int, MoveOut] = {}
        self.moves_in: dict[int, MoveIn] = {}  # until installed
        self._moving: dict[tuple[int, int], MoveOut | MoveIn] = {}  # (group, index) -> move
        self._hold_emission = 0  # offers waiting for their cut: emit nothing meanwhile
        # (cut, move, group, index, starts): at instance `cut`, emission starts (destination)
        # or stops (source) including partition `index` of `group`
        self._cuts: list[tuple[int, int, int, int, bool]] = []
        self._offers_before_placement: list[MigrateOffer] = []

    # ---------------------------------------------------------------- the source
    def _on_migrate_out(self, ev: MigrateOut, out: list[Any]) -> None:
        g, i = ev.group, ev.index
        group = self.program.groups[g]
        if (g, i) in self._moving or not all(
                (d.id, i) in self.parts and not self.parts[(d.id, i)].frozen for d in group):
            raise AssertionError(f"worker {self.worker} cannot move partition {i} of group {g}: "
                                 "it does not hold it, or it is moving already")
        # A partition that came here with a cut still ahead is this worker's from that cut on:
        # the next cut cannot come before it (its source ran every instance before it).
        starts = [c[0] for c in self._cuts if c[2] == g and c[3] == i and c[4]]
        mv = MoveOut(ev.move, g, i, ev.dest, max([self.seq, *starts]))
        self.moves_out[ev.move] = mv
        self._moving[(g, i)] = mv
        assert self.map is not None
        self.map.adopt(g, i, ev.dest, ev.version)  # the move's entry, applied here and now
        self._hold_emission += 1
        self._send_out(worker_rank(ev.dest), MigrateOffer(self._next_eid(), ev.move, g, i,
                                                          self.worker, mv.offered_at, ev.version),
                       out)

    def _on_migrate_accept(self, ev: MigrateAccept, out: list[Any]) -> None:
        mv = self.moves_out[ev.move]
        mv.cut = ev.cut
        self._hold_emission -= 1
        bisect.insort(self._cuts, (ev.cut, ev.move, mv.group, mv.index, False))
        waiting, mv.waiting = mv.waiting, []
        for piece in waiting:
            self._on_piece(piece, out)
        self._switch_at_cuts(out)

    def _ship_when_quiet(self, out: list[Any]) -> None:
        """Send each partition whose cut has passed once no task of it is left, and once a
        resumed job's values are in (before that, the partition has none to send)."""
        if self._restoring:  # the snapshot's values arrive later: they are what must move
            return
        for mv in list(self.moves_out.values()):
            if not mv.past_cut:
                continue
            parts = [self.parts[(d.id, mv.index)] for d in self.program.groups[mv.group]]
            if not any(p.queue or p.writer or p.readers for p in parts):
                self._ship(mv, parts, out)

    def _ship(self, mv: MoveOut, parts: list[Partition], out: list[Any]) -> None:
        assert mv.cut is not None
        i = mv.index
        dest = worker_rank(mv.dest)
        self._send_out(dest, MigrateData(
            self._next_eid(), mv.move, mv.group, i, mv.cut, tuple(p.dataset for p in parts),
            tuple(p.last_seq for p in parts),
            tuple(p.dataset for p in parts if p.value is not None)), out)
        for p in parts:
            if p.value is not None:
                self._send_out(dest, MigrateArray(self._next_eid(), mv.move, p.dataset, p.value),
                               out)
            del self.parts[(p.dataset, i)]
            # finished tasks and stretches may still name the partition: without its value they
            # no longer hold the moved memory (a 100 MB partition stayed until the next move)
            p.value = None
        # pieces that came for instances the destination runs (their gathers are there)
        ids = {p.dataset for p in parts}
        for key in [k for k in self.early if k[1] in ids and k[2] == i]:
            seq, d, j = key
            for src, array in sorted(self.early.pop(key).items()):
                self._forward(Piece(0, seq, d, src, (j,), (0,), array), mv.dest, out)
        del self.moves_out[mv.move]
        del self._moving[(mv.group, i)]
        # behind this worker's report parts of the partition, which MPI keeps in order
        self._send_out(CONTROLLER, MigrateShipped(self._next_eid(), mv.move, self.worker), out)

    # ---------------------------------------------------------------- the destination
    def _on_migrate_offer(self, ev: MigrateOffer, out: list[Any]) -> None:
        if self.map is None:  # the offer overtook this worker's first placement
            self._offers_before_placement.append(ev)
            return
        cut = max(ev.seq, self.seq)
        mv = MoveIn(ev.move, ev.group, ev.index, ev.source, cut)
        self.moves_in[ev.move] = mv
        self._moving[(ev.group, ev.index)] = mv
        self.map.adopt(ev.group, ev.index, self.worker, ev.version)
        bisect.insort(self._cuts, (cut, ev.move, ev.group, ev.index, True))
        self._send_out(worker_rank(ev.source), MigrateAccept(self._next_eid(), ev.move, cut), out)
        self._switch_at_cuts(out)
        self._reroute_held(out)

    def _on_migrate_data(self, ev: MigrateData, out: list[Any]) -> None:
        mv = self.moves_in[ev.move]
        mv.header = ev
        self._install_when_complete(mv, out)

    def _on_migrate_array(self, ev: MigrateArray, out: list[Any]) -> None:
        mv = self.moves_in[ev.move]
        mv.arrays[ev.dataset] = ev.array
        self._install_when_complete(mv, out)

    def _install_when_complete(self, mv: MoveIn, out: list[Any]) -> None:
        head = mv.header
        if head is None or len(mv.arrays) < len(head.valued):
            return
        i = mv.index
        nbytes = 0
        for d, last in zip(head.datasets, head.last_seqs):
            p = self._placeholder(d, i)
            p.value = mv.arrays.get(d)
            if p.value is not None:
                nbytes += p.value.nbytes
            p.last_seq = last
            p.frozen = False
        del self.moves_in[mv.move]
        del self._moving[(mv.group, i)]
        for d in head.datasets:
            p = self.parts[(d, i)]
            if p.queue:
                self._pump(p, out)
        self._send_out(CONTROLLER, MigrateDone(self._next_eid(), mv.move, self.worker, nbytes),
                       out)
        self._reroute_held(out)

    def _placeholder(self, dataset: int, index: int) -> Partition:
        p = self.parts.get((dataset, index))
        if p is None:
            p = self.parts[(dataset, index)] = Partition(dataset, index)
            p.frozen = True  # nothing is granted until the value is installed
        return p

    # ---------------------------------------------------------------- both sides
    def _switch_at_cuts(self, out: list[Any]) -> None:
        """Apply every cut the interpreter has reached: from its cut on, a source emits no task
        for the moving partition (and ships it once its tasks are done), a destination emits
        them (on a frozen placeholder until the values are installed)."""
        cuts = self._cuts
        while cuts and cuts[0][0] <= self.seq:
            _, move, g, i, starts = cuts.pop(0)
            if starts:
                for d in self.program.groups[g]:
                    self._placeholder(d.id, i)
                # new lists: a stretch already emitted keeps the partitions it was emitted for
                self.local[g] = sorted([*self.local[g], i])
            else:
                self.local[g] = [j for j in self.local[g] if j != i]
                self.moves_out[move].past_cut = True
            self._plans.clear()
            self._batchable.clear()
        self._ship_when_quiet(out)

    def _next_cut(self, g: int) -> int | None:
        """The first cut still ahead for group ``g`` (a fused stretch must end before it)."""
        return min((c[0] for c in self._cuts if c[2] == g), default=None)

    def _owner_for(self, g: int, j: int, seq: int) -> int:
        """Which worker runs stage instance ``seq`` on partition ``j`` of group ``g``."""
        mv = self._moving.get((g, j))
        if mv is None:
            assert self.map is not None
            return self.map.owners[g][j]
        if isinstance(mv, MoveOut):
            return self.worker if mv.cut is None or seq < mv.cut else mv.dest
        return mv.source if seq < mv.cut else self.worker

    def _route_moving(self, ev: Piece, j: int, mv: MoveOut | MoveIn, out: list[Any]) -> None:
        """Deliver or forward a piece for a partition under way, by its stage instance."""
        seq = ev.seq
        if isinstance(mv, MoveOut) and mv.cut is None and seq >= mv.offered_at:
            mv.waiting.append(Piece(ev.eid, seq, ev.dataset, ev.src, (j,), (0,), ev.array))
            return
        owner = self._owner_for(mv.group, j, seq)
        if owner == self.worker:
            self._deliver(seq, ev.dataset, j, ev.src, ev.array, out)
        else:
            self._forward(Piece(ev.eid, seq, ev.dataset, ev.src, (j,), (0,), ev.array), owner,
                          out)

    def _forward(self, piece: Piece, worker: int, out: list[Any]) -> None:
        assert self.map is not None
        g = self._group[piece.dataset]
        j = piece.dsts[0]
        self._send_out(worker_rank(worker), Piece(self._next_eid(), piece.seq, piece.dataset,
                                                  piece.src, (j,), (self.map.version(g, j),),
                                                  piece.array), out)

    def merge_map(self, newer: Any) -> None:
        """Take every newer entry of a map update, except those of a partition this worker holds
        or is to receive: the move's own messages apply those, at the moment the move reaches
        this worker (so its map never names it owner of a partition it neither holds nor
        awaits, nor names another owner for one it still runs alone)."""
        assert self.map is not None
        mine = self.map.owners
        self.map.merge(newer, skip=lambda g, i, owner: (
            (mine[g][i] == self.worker or owner == self.worker) and (g, i) not in self._moving))

    def _reroute_held(self, out: list[Any]) -> None:
        held, self.held = self.held, []
        for piece in held:
            self._on_piece(piece, out)
