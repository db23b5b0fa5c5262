"""Data moves: a scatter's pieces out, pieces in (and routed by the map's versions), gathers.

Pieces carry the sender's version of each destination's map entry. A worker that receives a
piece for a partition applies :func:`canary.partition_map.route_incoming`: it *holds* a piece
whose sender knows a newer placement than it does, *accepts* it if it owns the partition, and
*forwards* it otherwise, so nothing is lost or delivered twice while partitions move.
"""

from __future__ import annotations

import warnings
from itertools import groupby
from typing import Any

import numpy as np

from canary.errors import GatherError
from canary.messages import Piece, PieceBatch, TaskDone, TaskFailed, worker_rank
from canary.partition_map import ACCEPT, HOLD, route_incoming
from canary.program import Stage
from canary.result import stacked
from canary.worker.core import WorkerCore
from canary.worker.tasks import (
    K_COMPUTE,
    K_FUSED,
    K_GATHER,
    K_SCATTER,
    Task,
    failure_text,
    task_place,
)


class DataMoves(WorkerCore):
    """Scatter, route, deliver and gather (mixed into ``WorkerState``)."""

    def _init_moves(self) -> None:
        self.gathers: dict[tuple[int, int], Task] = {}  # (seq, dst partition) -> gather task
        # (seq, dataset, dst partition) -> pieces that came before their gather
        self.early: dict[tuple[int, int, int], dict[int, np.ndarray]] = {}
        self.held: list[Piece] = []  # pieces routed by a placement this worker has not seen
        # Batching small remote pieces (see _scatter): seq -> local scatter tasks not yet run,
        # and seq -> destination worker -> the pieces kept for it until the last of them ran.
        self._scatters_left: dict[int, int] = {}
        self._batches: dict[int, dict[int, list[Piece]]] = {}
        self._batchable: dict[int, frozenset[int]] = {}  # stage id -> dsts (_batchable_dsts)
        self._inline: list[Task] = []  # ready small moves, completed by _drain
        self.inline_run = 0

    # ------------------------------------------------------------------ pieces in
    def _on_piece(self, ev: Piece, out: list[Any]) -> None:
        if self.map is None:  # data can overtake the placement (different senders)
            self.held.append(ev)
            return
        if self.log is not None:
            self.log.append((self._cause, "recv", ev.seq, ev.seq, -1, ev.src, ev.eid))
        g = self._group[ev.dataset]
        moving = self._moving
        for j, ver in zip(ev.dsts, ev.versions):
            if moving:
                mv = moving.get((g, j))
                if mv is not None:  # under way: its stage instance decides (see migration)
                    self._route_moving(ev, j, mv, out)
                    continue
            action = route_incoming(self.worker, self.map.owner(g, j), self.map.version(g, j), ver)
            if action == ACCEPT and (ev.dataset, j) not in self.parts:
                # the map names this worker, but the move that brings the partition has not
                # begun here: keep the piece until it has
                action = HOLD
            if action == ACCEPT:
                self._deliver(ev.seq, ev.dataset, j, ev.src, ev.array, out)
            elif action == HOLD:
                self.held.append(Piece(ev.eid, ev.seq, ev.dataset, ev.src, (j,), (ver,), ev.array))
            else:
                self._send_out(worker_rank(self.map.owner(g, j)),
                               Piece(self._next_eid(), ev.seq, ev.dataset, ev.src, (j,),
                                     (self.map.version(g, j),), ev.array), out)

    def _on_piece_batch(self, ev: PieceBatch, out: list[Any]) -> None:
        for piece in ev.pieces:
            self._on_piece(piece, out)

    def _deliver(self, seq: int, dataset: int, j: int, src: int, array: np.ndarray,
                 out: list[Any]) -> None:
        t = self.gathers.get((seq, j))
        if t is None:
            self.early.setdefault((seq, dataset, j), {})[src] = array
            return
        assert t.pieces is not None
        if src in t.pieces:
            raise AssertionError(f"piece from partition {src} delivered twice to {t!r}")
        t.pieces[src] = array
        t.waiting -= 1
        if t.waiting == 0:
            self._ready(t, out)

    # ------------------------------------------------------------------ pieces out
    def _scatter(self, task: Task, res: Any, out: list[Any]) -> None:
        st = task.stage
        assert st.dst is not None and self.map is not None
        g = self._group[st.dst.id]
        owners = self.map.owners[g]
        if self._moving:  # a partition under way belongs to whoever runs this instance on it
            owners = [self._owner_for(g, j, task.seq) for j in range(len(owners))]
        versions = self.map.versions[g]
        targets = st.targets[task.part]
        # Remote pieces leave before local ones are delivered: another worker waits on them,
        # while delivering a local one only makes a gather runnable here.
        local: list[tuple[int, np.ndarray]] = []
        remote: list[tuple[int, tuple[int, ...], np.ndarray]] = []  # (worker, dsts, piece)
        if st.one_piece:
            by_worker: dict[int, list[int]] = {}
            for j in targets:
                by_worker.setdefault(owners[j], []).append(j)
            for w, js in by_worker.items():
                if w == self.worker:
                    local.extend((j, res) for j in js)
                else:
                    remote.append((w, tuple(js), res))
        else:
            for j, piece in zip(targets, res):
                w = owners[j]
                if w == self.worker:
                    local.append((j, piece))
                else:
                    remote.append((w, (j,), piece))
        left = self._scatters_left.get(task.seq)
        batch = None if left is None else self._batches.setdefault(task.seq, {})
        small = self._urgent_max_bytes
        for w, dsts, piece in remote:
            msg = Piece(self._next_eid(), task.seq, st.dst.id, task.part, dsts,
                        tuple(versions[j] for j in dsts), piece)
            if (batch is not None and piece.nbytes <= small
                    and self._batchable_dsts(st).issuperset(dsts)):
                batch.setdefault(w, []).append(msg)
            else:
                self._send_out(worker_rank(w), msg, out)
        if left is not None:  # this worker holds several of the instance's sources
            if left > 1:
                self._scatters_left[task.seq] = left - 1
            else:  # the instance's last local scatter ran: the pieces kept for it leave now
                del self._scatters_left[task.seq]
                for w, kept in self._batches.pop(task.seq).items():
                    self._send_out(worker_rank(w), kept[0] if len(kept) == 1
                                   else PieceBatch(self._next_eid(), tuple(kept)), out)
        for j, piece in local:
            self._deliver(task.seq, st.dst.id, j, task.part, piece, out)

    def _batchable_dsts(self, st: Stage) -> frozenset[int]:
        """The destination partitions of ``st`` whose gathers need a piece from every source
        partition this worker holds: their pieces may wait for this worker's last scatter task
        of the instance and leave with it in one :class:`PieceBatch`, since such a gather cannot
        run before that last piece arrives anyway (a reduce's gather needs every source): one
        send and one receive instead of one per source partition."""
        got = self._batchable.get(st.id)
        if got is None:
            mine = set(self.local[self._group[st.reads[0].id]])
            got = frozenset(j for j, srcs in enumerate(st.sources) if mine <= set(srcs))
            self._batchable[st.id] = got
        return got

    # ------------------------------------------------------------------ small moves inline
    def _is_inline_move(self, t: Task) -> bool:
        """Whether ``t`` only moves a few bytes with canary's own code: a replace, sum or concat
        gather, or a scatter of the partition itself (a broadcast's or a reduce's), of at most
        ``urgent_max_bytes`` in all. Run as a task, such a move costs tens of µs of dispatch and
        bookkeeping for a µs of copying, several of them on the path of every iteration. A
        report stays a task: it runs after urgent ones, so a loop's signal, emitted after it,
        leaves first."""
        kind = t.kind
        if kind is K_COMPUTE or kind is K_FUSED:
            return False
        st = t.stage
        if kind is K_GATHER:
            return (type(st.gather) is str and t.pieces is not None
                    and sum([a.nbytes for a in t.pieces.values()]) <= self._urgent_max_bytes)
        if kind is K_SCATTER and st.fn is None and st.one_piece:
            v = t.reads[0].value
            return type(v) is np.ndarray and v.nbytes <= self._urgent_max_bytes
        return False

    def _drain(self, out: list[Any]) -> None:
        """Complete the small moves :meth:`_ready` set aside, and those they make ready, in
        order, with the same copies a task would make."""
        q = self._inline
        k = 0
        while k < len(q):
            t = q[k]
            k += 1
            st = t.stage
            if t.kind is K_GATHER:
                assert t.pieces is not None
                try:
                    res: Any = builtin_gather([t.pieces[s] for s in st.sources[t.part]], st,
                                              self.rank, self.worker)
                except GatherError as exc:  # as the gather task would have failed
                    q.clear()
                    failed = failure_text(self.rank, self.worker, t.label(), exc)
                    self._on_task_failed(TaskFailed(0, t, failed), out)
                    return
            else:
                # a copy, as a scatter task's piece: a local gather may get it, and a later
                # in-place kernel must not change it there
                res = np.array(t.reads[0].value, copy=True)
            self.inline_run += 1
            if self.log is not None:
                self.log.append((self._cause, "inline", t.seq, t.seq, t.tid, t.part, 0))
            self._on_task_done(TaskDone(0, t, res), out)  # logged as inline, above
        q.clear()


def gather_sum(pieces: list[np.ndarray]) -> np.ndarray:
    """Element-wise sum in the order given (source-partition order: deterministic), in the
    dtype numpy's ``+`` gives the pieces together (an int32 piece and int64 ones sum in int64,
    not wrapped around in the first piece's int32).

    Raises :class:`GatherError` if the pieces' shapes differ (numpy would broadcast a piece of
    one element over the others), if an integer sum overflows its dtype (numpy wraps around to
    a wrong number, silently), or if every piece is bool (numpy's ``True + True`` is ``True``:
    an or, where a sum's reader expects a count)."""
    first = pieces[0]
    dtypes = {p.dtype for p in pieces}  # a few at most: numpy 1 took 32 arguments at most
    acc = np.array(first, dtype=first.dtype if len(dtypes) == 1 else np.result_type(*dtypes),
                   copy=True)
    if acc.dtype.kind == "b":
        raise GatherError("a 'sum' gather of bool pieces would be a logical or in numpy "
                          "(True + True is True), not a count; make the pieces integers "
                          "(x.astype(np.int64)) to count them")
    integers = acc.dtype.kind in "iu"
    shape = first.shape
    for p in pieces[1:]:
        if p.shape != shape:
            raise GatherError(f"a 'sum' gather adds pieces of one shape, got {_describe(pieces)}; "
                              "make every piece the same shape")
        if integers and _overflows(acc, p):
            raise GatherError(f"a 'sum' gather in {acc.dtype} overflowed: the total of "
                              f"{_describe(pieces)} does not fit in {acc.dtype}, and numpy would "
                              "wrap it around to a wrong number; make the pieces a wider type "
                              "(np.int64) or float")
        acc += p
    return acc


def _overflows(acc: np.ndarray, piece: np.ndarray) -> bool:
    """Whether ``acc += piece`` would leave ``acc``'s integer dtype's range somewhere (every
    bound below is computed without overflowing itself)."""
    p = piece.astype(acc.dtype, copy=False)
    info = np.iinfo(acc.dtype)
    if acc.dtype.kind == "u":
        return bool(np.any(acc > info.max - p))
    return bool(np.any((p > 0) & (acc > info.max - np.maximum(p, 0)))
                or np.any((p < 0) & (acc < info.min - np.minimum(p, 0))))


class _FloatTrouble:
    """numpy's floating-point error handler while a 'sum' gather adds: a warning that names
    the stage and the rank, where numpy's own would point at canary's ``+=``."""

    __slots__ = ("stage", "rank", "worker")

    def __init__(self, stage: Stage, rank: int, worker: int) -> None:
        self.stage, self.rank, self.worker = stage, rank, worker

    def __call__(self, kind: str, flag: int) -> None:
        dst = self.stage.dst.name if self.stage.dst is not None else "?"
        # explicit: the line numpy's warning would show is canary's, not the user's
        warnings.warn_explicit(f"{task_place(self.rank, self.worker, self.stage.label())}: "
                               f"{kind} encountered in the 'sum' gather into '{dst}': a float "
                               "overflowed or made a nan, so the result holds an inf or a nan",
                               RuntimeWarning, "canary", 0, module="canary")


def builtin_gather(pieces: list[np.ndarray], stage: Stage, rank: int,
                   worker: int) -> np.ndarray:
    """``stage``'s built-in gather (a name in :data:`GATHERS`) of ``pieces``, on ``rank``
    (worker ``worker``). A float overflow or nan that a 'sum' makes is a ``RuntimeWarning``
    naming the stage and rank (numpy's default filter says it once per stage and rank); as in
    a kernel, the job goes on with the inf or nan. Raises :class:`GatherError` as the gather
    does."""
    if stage.gather != "sum" or all(p.dtype.kind not in "fc" for p in pieces):
        return GATHERS[stage.gather](pieces)  # type: ignore[no-any-return]
    with np.errstate(all="call", call=_FloatTrouble(stage, rank, worker)):
        return gather_sum(pieces)


def gather_replace(pieces: list[np.ndarray]) -> np.ndarray:
    """The single piece, copied (it may be shared with the sender's partition)."""
    return np.array(pieces[0], copy=True)


def gather_concat(pieces: list[np.ndarray]) -> np.ndarray:
    """Pieces stacked along axis 0 in source order; pieces of one number each (0-d) make a
    1-d array of them.

    Raises :class:`GatherError` if some pieces but not all have no axis 0, or the pieces'
    other axes differ."""
    if any(p.ndim == 0 for p in pieces) and not all(p.ndim == 0 for p in pieces):
        raise GatherError(f"a 'concat' gather stacks pieces along their first axis, and some "
                          f"have none (one number each), got {_describe(pieces)}; make them "
                          "all numbers or all arrays")
    try:
        return stacked(pieces)
    except ValueError:
        raise GatherError(f"a 'concat' gather stacks pieces along their first axis, so their "
                          f"other axes must match, got {_describe(pieces)}") from None


def _describe(pieces: list[np.ndarray]) -> str:
    """The pieces' shapes and dtypes in source-partition order, a run of alike ones said once
    with its length."""
    runs = [(len(list(run)), shape, dtype)
            for (shape, dtype), run in groupby((p.shape, p.dtype) for p in pieces)]
    return ", ".join(f"{n} x {shape} {dtype}" if n > 1 else f"{shape} {dtype}"
                     for n, shape, dtype in runs) + " (in source-partition order)"


GATHERS: dict[Any, Any] = {"sum": gather_sum, "replace": gather_replace, "concat": gather_concat}
