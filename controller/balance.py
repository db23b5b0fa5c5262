"""Move policies: pure, seeded objects that decide which partitions move (reports in, moves out).

The controller gives its policy every :class:`canary.messages.LoadReport` (``report``) and
asks it on every :class:`canary.messages.Tick` (``decide``); a policy returns moves
``(group, index, dest, reason)`` and never sends anything itself. One migration protocol carries
out the moves of every policy (``canary.worker.migration``).

* :class:`BalancePolicy` (the default of ``canary run``) moves partitions off workers that
  complete their work markedly slower than the others.
* :class:`ChaosPolicy` (``CANARY_CHAOS_MIGRATE=SEED``) moves random partitions to random
  workers, for tests and experiments: answers must not change.
* :class:`ScriptedPolicy` makes given moves at given times (benchmarks, experiments).

How :class:`BalancePolicy` decides (the thresholds are its constructor's arguments):

1. Each report gives, per partition (a co-location group's index: everything that moves
   together), the seconds its tasks took in the report's interval, the worker's idle time, and
   (on Linux) the seconds it ran on a CPU and waited for one. Its tasks' time and the time it
   waited for a CPU between them is shared out among its partitions in proportion to their
   tasks' seconds (a worker sharing its core with another job spends much of its time waiting
   for the CPU between tasks); a partition's **cost** is its share as a fraction of the
   interval, smoothed over reports (``smoothing``). The rest of its busy time is left out: it
   is mostly messages, the most on the worker that gathers the others' results, and no move
   takes it off that worker. Where CPU times are not measured, every second the worker was not
   idle is shared out (the only sign of waits for a CPU there). A report in which a worker
   ran none of a group's tasks (the job starting, or in another step) measures nothing of
   them, and their costs stay as they were. A worker's **load** is the sum of
   its partitions' costs, over the groups with at least one partition per worker
   (:meth:`BalancePolicy.spread_groups`): the fraction of its time it works on what can be
   shared out. A group with fewer (a model's weights) is a serial step the others wait for
   wherever it runs; moving shared work off its holder only lengthens another worker's share,
   so it neither counts nor moves. Once a worker reports that it has finished its part of the
   program, nothing moves: the job is ending, and a move would only cost.
2. Workers step through the program together (signals, scatter-gathers), so each worker's load
   is its share of the work at the pace of the slowest. Partitions of one group do alike work,
   so the ratio of the time a group's tasks take on two workers is the ratio of their
   **speeds**; a worker's speed is the median of that over the groups it shares (1 where it
   shares none), times the fraction of its active time it did not spend waiting for a CPU
   between tasks (smoothed). A partition's **work** is its cost times its holder's speed; on worker ``w``
   it would cost ``work / speed[w]``.
3. The **ideal** load is the total work divided by the total speed: every worker busy alike.
   The policy acts only when a worker's load has exceeded the ideal by more than
   ``threshold`` (10%) in ``patience`` (3) consecutive decisions, each on fresh reports from
   every worker that ran some of its shared work since its last (a round in which one holding
   some ran none measured nothing, and is skipped), and only once every worker has reported
   ``patience`` times; and only once
   those decisions' excesses over the threshold add up to the evidence it needs: ``evidence``
   (2.0) on two workers. The evidence is the time the imbalance has cost so far, in rounds,
   beyond what the threshold tolerates; each worker gathers its own, so that spells on
   different workers do not add up. The more uneven the load, the sooner: of two workers, one
   3x slower (the busiest at twice the ideal) is answered after ``patience`` rounds, one 2x
   slower after 5, 1.4x slower after 21, while the spells of 1.2-1.6x slower tasks that come
   and go on a shared machine (3 to 10 rounds at a time, measured on balanced runs) add up to
   less and move nothing. On more workers the others wait for a slower one, so the same spell
   holds back more of the job (one worker ``f`` times slower: ``(f (W - 1) + 1) / W`` of the
   ideal on ``W``); the evidence needed grows as a spell's cost does, from what a spell of
   ``spell_factor`` (1.6) costs on two workers: 3.5 on 4 workers, 4.25 on 8, 4.6 on 16. So such a
   spell moves nothing on any number of workers, and a slower machine is answered about as
   soon as on two (3x after 3 rounds, 2x after 6, 1.4x after 17-18 on 4 to 16 workers).
   A worker slower **with its CPU in hand** (its reports measure its waits for a CPU, and they
   stay under ``quiet_wait``, 10% of its time) needs ``quiet_evidence`` (2.5) times that. On
   a 16-core cloud host, balanced runs' workers ran 1.2-1.6x slower for up to 20 s at a
   time, waiting for no CPU (hardware threads that share a core behave so), and moved; a
   worker beside a busy process waits for its CPU half its time, and is answered as soon as
   before. A slower machine with its CPU is answered later: of two workers 3x after 6
   rounds, 2x after 13, 1.4x after 51 (7, 14 and 43-44 on 4 to 16 workers). Where the waits
   are not measured (off Linux), the evidence is as above.
4. It then moves greedily: from the busiest worker, the partition and destination that lower
   the highest predicted load most (among equal ones, the destination left least loaded: while
   the source stays the busiest, every destination gives the same highest load), as long as a
   move lowers it by at least ``min_gain`` (2% of the ideal) and the time it saves over
   ``horizon_s`` (10 s) exceeds its transfer time (bytes over ``bandwidth``, 1 GB/s, plus
   ``latency_s``); at most ``max_moves`` (8) at once.
   A partition never moves to a worker that loses more of its active time waiting for a CPU
   than the worker it leaves, by more than ``wait_margin`` (10 points): such a worker answers
   every message late whatever it holds, a lag its load does not show, so even a light
   partition there (a model's weights, which every iteration waits on) can slow the whole job.
   Nor to a worker whose machine lacks the memory for it: each report says how much its
   machine has left for it (``canary.memory``: available memory, bounded by its control
   groups' limits), and a move, this one's and every move of any kind (a halving, an
   emptying, a trial, an undo), must leave ``mem_reserve`` (10%) of that machine's memory
   free, at least ``mem_floor`` (256 MiB): a worker out of memory is killed, and the job with
   it. Workers reporting the same pool (one machine, one control group) share one budget,
   and both copies of a moving partition count until the next reports. Where the reports
   carry no figures (not Linux), moves are not limited.
5. After moving it waits: until every move is done and ``settle`` (2) more rounds of reports
   have measured the new placement; a partition it moved does not go back to where it came
   from, and a worker it moved partitions off for being slower takes no partition for
   ``hold_rounds`` (40) rounds of reports. Beside another process on its core a worker runs a
   small share at full speed and a larger one slower (its bursts outlast the kernel's turn:
   ``benchmarks/core_share.py``), so once relieved it measures as fast as the others, and its
   speed then overstates what it would do with more. If partitions given back to it after
   the hold make the job slower (step 6 undoes them), its next hold is twice as long. Equal
   workers, or workers whose imbalance no move can reduce by ``min_gain``, see no move at
   all; the first time an imbalance has passed the rules of step 3 and no move fits, the
   policy says so once (:attr:`BalancePolicy.notes`, a line of the job's progress output) and
   why: too few partitions to split it finer, only workers that wait for a CPU to take them,
   only workers on hold, or no memory for them. A move back (step 6) that no longer fits in
   its old worker's memory stays where it is, with a line saying so.
6. It then checks that the moves paid: the job's pace (the program positions the workers
   report, per second) over the ``patience`` rounds after, against the ``patience`` rounds
   that led to the moves. If the job got more than ``undo_margin`` (5%) slower, the model was
   wrong (a worker that loses its CPU to another process in short bursts loses about as much
   time whatever it holds), so the partitions go back where they were and the policy makes no
   move for ``quiet_rounds`` (20) rounds of reports, twice that after a second undo, and so on.
   Moves it keeps are said, with the figure (:attr:`BalancePolicy.notes`), unless the next
   move's reason gives it. A snapshot started in between (``ctrl.snapshots_started`` changed:
   the workers stood still to write it) voids the check.
7. A worker that loses more than ``drain_wait`` (25%) of its time waiting for a CPU, after a
   round of moves already cut its share (or tried to), holds every iteration back: between
   its tasks it answers messages late, and inside them the other process takes its turns
   (:meth:`BalancePolicy.lost` counts both). First half of its share moves (the heaviest
   partitions), and it is held back as in step 5: a smaller share runs more of its work
   within the kernel's turn (``benchmarks/competed_share.py``: beside a busy loop, keeping 3
   of 8 partitions beat emptying in each of six rounds, and the 5 a round of moves had left
   in five), while emptying it caps the job at ``(W - 1 + s) / (W - 1)`` of the
   ideal (``s`` its speed: 1.17x on 4 workers at half speed). If it still loses that much
   after the halving (kept or undone), it is emptied (its serial steps' groups too) when the
   others can take the rest at a predicted load of at most ``1 - min_gain``, their busy time
   outside tasks (messages, which stay where they are) included (see
   :meth:`BalancePolicy._drain`). Once per worker each; an emptied worker takes no partition
   after, unless the pace check undoes the emptying. When the round that cut such a worker's
   share is undone, or its halving where the others could take it all, the quiet rounds are
   skipped (once each): the emptying is the remedy left.
8. Halving rounds the share down, and the share that serves best beside another process
   depends on how long that process's turns are, which no report shows (2 workers beside a
   busy loop: keeping 4 of 8 beat keeping 3 in quiet hours, and lost to it by 9-10% in busier
   ones); nor is the share before the halving the best, since the round of moves by speed
   rounds a worker sharing its core on its estimated speed (k-means beside a busy loop ran
   7% faster with 5 of 8 than with the 6 that round left, and 7% slower with the halving's
   3). So where no emptying may follow (judged on the placement that stays: after a halving
   kept, the others hold its partitions, and may no longer have room for the rest), the pace
   decides, one partition at a time, once per worker: after a halving kept, one of the
   partitions it moved goes back (from the busiest worker that took one); after a halving
   undone, one of them stays off (the one on the least loaded worker that took one). Each
   step stays only if the job got faster than before it (the first one after an undo: than
   before the halving), and the next step in the same direction follows, as long as the
   worker keeps some of the halving's partitions and lacks some (both ends were measured
   already). A step that did not pay moves back and ends the trial: back on the worker, it is
   held twice as long and the policy goes on without quiet rounds; off it, the undo's quiet
   rounds follow (as they do after a step kept last).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from canary.messages import LoadReport, size_text


class MovePolicy(Protocol):
    #: lines for the job's progress output (why it did not act, say); the controller prints
    #: and clears them after each ``decide``
    notes: list[str]

    def report(self, rep: LoadReport, now: float) -> None:
        """Take a worker's load report."""
        ...

    def decide(self, now: float, ctrl: Any) -> list[tuple[int, int, int, str]]:
        """Moves to start now: ``(group, index, dest, reason)``."""
        ...


class MachineMemory:
    """What each worker's machine has left for it, from the load reports' ``mem_*`` figures
    (:mod:`canary.memory`), and a round of moves' share of it: the rule every policy's moves
    keep, that none leaves a machine with less than ``reserve`` (10%) of its memory free, at
    least ``floor`` (256 MiB), since a worker out of memory is killed, and the job with it.

    Workers that report the same pool (one machine, one control group) share one budget, the
    least any of them last reported. Both copies of a moving partition exist while it travels,
    so a move between two workers of one pool needs the room too, and a source's copy counts
    as freed only once the next reports show it. A worker that reports no figures (not Linux,
    or a runner without machines) takes any move."""

    def __init__(self, reserve: float = 0.1, floor: int = 256 << 20) -> None:
        self.reserve = reserve
        self.floor = floor
        self.free: dict[int, int] = {}  # worker -> bytes its machine may still allocate to it
        self.total: dict[int, int] = {}  # worker -> bytes it may use there in all
        self.pool: dict[int, str] = {}  # worker -> the pool it draws on

    def report(self, rep: LoadReport) -> None:
        """Take the figures of ``rep``."""
        if rep.mem_free >= 0 and rep.mem_total > 0:
            self.free[rep.worker], self.total[rep.worker] = rep.mem_free, rep.mem_total
            self.pool[rep.worker] = rep.mem_pool
        else:
            self.free.pop(rep.worker, None)

    def kept(self, worker: int) -> int:
        """Bytes of ``worker``'s machine no move may take."""
        return max(int(self.reserve * self.total[worker]), self.floor)

    def room(self) -> dict[str, int]:
        """Bytes each pool may still take in moves (below 0 where less than the reserve is
        free): the start of a round's budget, for :meth:`fits` and :meth:`take`."""
        room: dict[str, int] = {}
        for w, free in self.free.items():
            left = free - self.kept(w)
            room[self.pool[w]] = min(room.get(self.pool[w], left), left)
        return room

    def fits(self, room: dict[str, int], dst: int, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit in the pool of worker ``dst`` (``room``: what
        :meth:`room` gave, less what :meth:`take` counted since)."""
        return dst not in self.free or nbytes <= room[self.pool[dst]]

    def take(self, room: dict[str, int], dst: int, nbytes: int) -> None:
        """Count a move of ``nbytes`` onto ``dst`` against its pool's ``room``."""
        if dst in self.free:
            room[self.pool[dst]] -= nbytes

    def why_not(self, what: str, nbytes: int, dst: int) -> str:
        """Why ``what``, a partition of ``nbytes``, did not move to worker ``dst``."""
        return (f"{what} ({size_text(nbytes)}) does not fit in the memory of worker {dst}'s "
                f"machine ({size_text(max(self.free.get(dst, 0), 0))} free for it, of which "
                f"{size_text(self.kept(dst))} is kept free: a worker out of memory is killed, "
                "and the job with it)")


class ChaosPolicy:
    """Moves up to ``moves`` random partitions (whole co-location group entries, one-partition
    groups included) to random other workers every ``every`` seconds of ticks, seeded.
    Partitions already moving are left alone, and so is a draw that would overfill its
    destination's machine (:class:`MachineMemory`); with one worker nothing moves."""

    def __init__(self, seed: int, every: float = 0.0, moves: int = 1) -> None:
        self.rng = random.Random(seed)
        self.every = every
        self.moves = moves
        self._last: float | None = None
        self.notes: list[str] = []  # chaos explains nothing
        self.memory = MachineMemory()
        self.nbytes: dict[tuple[int, int], int] = {}  # (group, index) -> bytes, as last reported

    def report(self, rep: LoadReport, now: float) -> None:
        """Loads do not matter to chaos; the memory left on the workers' machines, and the
        partitions' bytes, do."""
        self.memory.report(rep)
        for g, i, _, nbytes in rep.busy:
            self.nbytes[(g, i)] = nbytes

    def decide(self, now: float, ctrl: Any) -> list[tuple[int, int, int, str]]:
        if ctrl.n_workers < 2 or (self._last is not None and now - self._last < self.every):
            return []
        self._last = now
        out: list[tuple[int, int, int, str]] = []
        owners = ctrl.map.owners
        room = self.memory.room()
        for _ in range(self.rng.randint(0, self.moves)):
            g = self.rng.randrange(len(owners))
            i = self.rng.randrange(len(owners[g]))
            if ctrl.moving(g, i) or any(m[0] == g and m[1] == i for m in out):
                continue
            dest = self.rng.choice([w for w in range(ctrl.n_workers) if w != owners[g][i]])
            nbytes = self.nbytes.get((g, i), 0)
            # checked once drawn, so that a seed makes the same moves where memory is plenty
            if not self.memory.fits(room, dest, nbytes):
                continue
            self.memory.take(room, dest, nbytes)
            out.append((g, i, dest, "chaos (CANARY_CHAOS_MIGRATE)"))
        return out


class ScriptedPolicy:
    """Moves ``(at, group, index, dest)``: partition ``index`` of ``group`` to ``dest`` at the
    first tick ``at`` seconds or more into the job, in order: a move of a partition that is
    still moving waits for that move to end (the controller would drop it)."""

    def __init__(self, moves: list[tuple[float, int, int, int]]) -> None:
        self.pending = sorted(moves)
        self.notes: list[str] = []  # the script is the reason

    def report(self, rep: LoadReport, now: float) -> None:
        """Scripted moves do not depend on loads."""

    def decide(self, now: float, ctrl: Any) -> list[tuple[int, int, int, str]]:
        out: list[tuple[int, int, int, str]] = []
        waiting: list[tuple[float, int, int, int]] = []
        taken: set[tuple[int, int]] = set()  # partitions with an earlier move, sent or waiting
        for at, g, i, dest in self.pending:
            if at > now or (g, i) in taken or ctrl.moving(g, i):
                waiting.append((at, g, i, dest))
            else:
                out.append((g, i, dest, f"scripted for {at:g} s"))
            taken.add((g, i))
        self.pending = waiting
        return out


def pace_kept(gain: float, margin: float) -> str:
    """What the pace check found of moves it kept, for a progress line: ``gain`` is how much
    faster the job got (below 0: slower, by at most ``margin``, the undo margin). The figure is
    said so that a user can tell a gain from noise the margin let pass."""
    if gain >= 0.005:
        return f"got {gain:.0%} faster"
    if gain > -0.005:
        return "kept its pace"
    return f"kept its pace within {margin:.0%} ({-gain:.0%} slower)"


@dataclass
class _Partition:
    cost: float = 0.0  # smoothed fraction of its holder's time (its share of the active time)
    task_cost: float = 0.0  # smoothed fraction of its holder's time its own tasks took
    nbytes: int = 0
    holder: int = -1
    came_from: int | None = None  # the worker it last moved away from


@dataclass
class _Worker:
    pace: float = 1.0  # smoothed fraction of its active time not spent waiting for a CPU
    waiting: float = 0.0  # smoothed fraction of its time on or waiting for a CPU spent waiting
    cpu_measured: bool = False  # its last report measured its CPU time and waits (Linux)
    progress: float = 0.0  # program positions a second over its last report interval
    measured: set[int] = field(default_factory=set)  # groups with tasks in its last report
    # smoothed fraction of its time busy outside its tasks and its waits for a CPU between
    # them (messages): no move takes it off, but it fills the worker's time all the same
    rest: float = 0.0
    seq: int | None = None  # its program position at its last report
    reports: int = 0
    fresh: bool = False  # reported since the last decision
    done: bool = False
    partitions: set[tuple[int, int]] = field(default_factory=set)


@dataclass(frozen=True)
class _Emptying:
    """How a worker would be emptied (:meth:`BalancePolicy._emptying`)."""

    spread: int  # how many of its partitions are of spread groups: the first of moves
    moves: list[tuple[int, int, int]]  # (group, index, destination), the heaviest first
    half_top: float  # the others' highest predicted load after the heavier half of the spread
    top: float  # ... after all, their busy time outside tasks included


@dataclass(frozen=True)
class _ShareTrial:
    """A halved worker's share, tried one partition at a time (step 8)."""

    worker: int
    halving: list[tuple[int, int, int, int]]  # its moves, (group, index, worker, to)
    step: int  # +1: partitions back on the worker (the halving kept); -1: off it (undone)
    steps: int = 0  # the steps made so far


class BalancePolicy:
    """Moves partitions off workers that are markedly slower; see the module docstring.

    Deterministic: the same reports in the same order give the same moves (``seed`` breaks
    exact ties only).
    """

    def __init__(self, n_workers: int, seed: int = 0, threshold: float = 0.10,
                 patience: int = 3, min_gain: float = 0.02, smoothing: float = 0.5,
                 horizon_s: float = 10.0, bandwidth: float = 1e9, latency_s: float = 1e-3,
                 max_moves: int = 8, settle: int = 2, undo_margin: float = 0.05,
                 quiet_rounds: int = 20, wait_margin: float = 0.10,
                 drain_wait: float = 0.25, evidence: float = 2.0,
                 spell_factor: float = 1.6, hold_rounds: int = 40,
                 quiet_evidence: float = 2.5, quiet_wait: float = 0.1,
                 mem_reserve: float = 0.1, mem_floor: int = 256 << 20) -> None:
        if n_workers < 1:
            raise ValueError(f"a job needs at least one worker, got {n_workers}")
        counts = {"patience": patience, "max_moves": max_moves, "settle": settle,
                  "quiet_rounds": quiet_rounds, "hold_rounds": hold_rounds}
        for name, count in counts.items():  # counts of rounds and moves: slices and ranges
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {count!r}")
        amounts = {"threshold": threshold, "min_gain": min_gain, "horizon_s": horizon_s,
                   "bandwidth": bandwidth, "latency_s": latency_s, "undo_margin": undo_margin,
                   "wait_margin": wait_margin, "drain_wait": drain_wait, "evidence": evidence,
                   "quiet_evidence": quiet_evidence, "quiet_wait": quiet_wait,
                   "mem_reserve": mem_reserve, "mem_floor": mem_floor}
        for name, amount in amounts.items():
            if not 0 <= amount < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0, got {amount!r}")
        if not bandwidth > 0:
            raise ValueError(f"bandwidth must be above 0 (bytes a second), got {bandwidth!r}")
        if not 1 <= spell_factor < math.inf:
            raise ValueError(f"spell_factor must be a finite number >= 1, got {spell_factor!r}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing!r}")
        self.n_workers = n_workers
        self.rng = random.Random(seed)
        self.threshold = threshold
        self.patience = patience
        self.min_gain = min_gain
        self.smoothing = smoothing
        self.horizon_s = horizon_s
        self.bandwidth = bandwidth
        self.latency_s = latency_s
        self.max_moves = max_moves
        self.settle = settle
        self.undo_margin = undo_margin
        self.quiet_rounds = quiet_rounds
        self.wait_margin = wait_margin
        self.drain_wait = drain_wait
        self.evidence = evidence
        self.spell_factor = spell_factor
        self.hold_rounds = hold_rounds
        self.evidence_needed = evidence * self._spell_scale(n_workers)
        self.quiet_evidence = quiet_evidence
        self.quiet_wait = quiet_wait
        self.memory = MachineMemory(mem_reserve, mem_floor)
        self.notes: list[str] = []  # see MovePolicy
        self._said_no_move = False  # once a job: the imbalance no move could help
        self._wait_blocked = False  # the last plan left out a move for the wait_margin rule
        # ... for want of memory: (the lightest such partition's bytes, its destination), for
        # the line that says why nothing moved
        self._mem_blocked: tuple[int, int] | None = None
        self.drained: set[int] = set()  # workers emptied for their waits for a CPU
        self._drain_tried: set[int] = set()  # ... once each: an undone drain is not retried
        self._halved: set[int] = set()  # workers a drain has taken half the share of
        self._drain_half = False  # the last drain moved half the worker's share, not all
        self._empty_fits = False  # ... and the others could have taken all of it then
        self._relieved: set[int] = set()  # workers a round of moves has taken partitions off
        self._hurried: set[int] = set()  # ... whose undone round skipped the quiet rounds
        self._held: dict[int, int] = {}  # worker -> rounds of reports it still takes nothing
        self._hold_for: dict[int, int] = {}  # worker relieved for being slower -> next hold
        self._slower: set[int] = set()  # the sources the last plan found slower
        self._hold_blocked = False  # the last plan left out a move for a held worker
        self.parts: dict[tuple[int, int], _Partition] = {}
        self.workers = [_Worker() for _ in range(n_workers)]
        # per worker: consecutive decisions that found its load over the threshold, and
        # their summed excess over it
        self._over = [0] * n_workers
        self._excess = [0.0] * n_workers
        self._uneven = 0  # consecutive decisions with a worker over it, or one to empty
        self._wait_rounds = 0  # report rounds to wait before judging again
        self._paces: list[float] = []  # the job's pace at the decisions since the last moves
        # the last round of moves ((group, index, from, to)), the pace before it and how many
        # snapshots had started then, until judged
        self._trial: tuple[list[tuple[int, int, int, int]], float, int] | None = None
        self._trial_drain: int | None = None  # the worker the last round emptied or halved
        self._share_trial: _ShareTrial | None = None  # the last round tried a halved share
        self._probed: set[int] = set()  # halved workers whose share was tried (once each)
        self._undos = 0
        self.decisions: list[str] = []  # why each move was made, for the progress line

    # ------------------------------------------------------------------ reports
    def report(self, rep: LoadReport, now: float) -> None:
        w = self.workers[rep.worker]
        w.reports += 1
        w.fresh = True
        w.done = rep.done
        held = set()
        interval = max(rep.interval, 1e-9)
        if w.seq is not None:
            w.progress = max(rep.seq - w.seq, 0) / interval
        w.seq = rep.seq
        self.memory.report(rep)
        # A worker's active time is its partitions' time, shared out as their tasks' seconds:
        # a worker that shares its core with another job spends much of it waiting for the CPU
        # between tasks, which its tasks' own durations do not show.
        tasks = sum(row[2] for row in rep.busy)
        # Time spent waiting for a CPU (another process on the worker's core) between tasks is
        # time it would have been working, even where it looked idle (a message had come, and
        # the worker did not get the CPU to see it). Waits inside its tasks already show in the
        # tasks' durations, so only the rest counts: the waits are taken to fall evenly over the
        # time it was ready to run.
        runnable = rep.cpu + rep.cpu_wait
        w.cpu_measured = runnable > 0
        in_tasks = tasks * rep.cpu_wait / runnable if runnable > 0 else 0.0
        between = max(rep.cpu_wait - in_tasks, 0.0)
        if runnable > 0:
            # Measured waits: its tasks and those waits, and not the rest of its busy time.
            # That rest is mostly the serial steps' messages (the worker that gathers the
            # others' results and sends the model out: on 4 and 8 workers of a 16-core machine
            # it was busy 22-31% of its time outside tasks, the others 11-19%), work no move
            # takes off it; shared out over its partitions it made them look a third costlier,
            # and balanced runs moved partitions off it that made the job slower.
            active = min(tasks + between, interval)
            pace = 1.0 - min(between / max(active, 1e-9), 0.9)
            w.pace += self.smoothing * (pace - w.pace)
            w.waiting += self.smoothing * (rep.cpu_wait / runnable - w.waiting)
        else:
            # Unmeasured (no per-process CPU accounting): every second it was not idle, the
            # only sign of waits for a CPU there is.
            active = min(max(interval - rep.idle, tasks), interval)
        rest = max(interval - rep.idle - active, 0.0) / interval
        w.rest += self.smoothing * (rest - w.rest)
        scale = active / tasks if tasks > 0 else 0.0
        w.measured = {row[0] for row in rep.busy if row[2] > 0}
        for g, i, seconds, nbytes in rep.busy:
            key = (g, i)
            held.add(key)
            p = self.parts.setdefault(key, _Partition())
            frac = min(seconds * scale / interval, 1.0)
            own = min(seconds / interval, 1.0)
            if p.holder != rep.worker:  # new here: its cost there is only now measured
                p.holder, p.cost, p.task_cost = rep.worker, frac, own
            elif g in w.measured:
                # (else none of the group's tasks ended here in the interval: the job was
                # starting, or in a step of other groups' tasks. The report measured nothing of
                # it, and the pause is no cost: smoothing it in as one would make these
                # partitions look cheaper than the same partitions on a worker that was busy
                # with another step then.)
                p.cost += self.smoothing * (frac - p.cost)
                p.task_cost += self.smoothing * (own - p.task_cost)
            p.nbytes = nbytes
        w.partitions = held

    # ------------------------------------------------------------------ estimates
    def spread_groups(self) -> set[int]:
        """The groups with at least one partition per worker: the work that can be shared out.
        A group with fewer (a model's weights: one partition) is work the others wait for
        wherever it runs, so it neither counts in the loads nor moves."""
        counts: dict[int, int] = {}
        for g, _ in self.parts:
            counts[g] = counts.get(g, 0) + 1
        return {g for g, n in counts.items() if n >= self.n_workers}

    def measured_speeds(self, spread: set[int]) -> bool:
        """Whether the last round of reports measured the workers' speeds: False where a worker
        holds partitions of ``spread`` (:meth:`spread_groups`) but ran none of them since its
        last report (the job starting, compiling a step only one worker runs, or in a serial
        step)."""
        return not any(not (w.measured & spread) and any(k[0] in spread for k in w.partitions)
                       for w in self.workers)

    def loads(self, groups: set[int]) -> list[float]:
        """Each worker's load: the summed cost of the partitions of ``groups`` it reported."""
        return [sum(self.parts[k].cost for k in w.partitions if k[0] in groups)
                for w in self.workers]

    def speeds(self) -> list[float]:
        """Relative speeds (1 = the median worker) from the groups workers share, by how long
        the same tasks take on each (a CPU that is slower, or spins, shows there), times the
        fraction of its active time a worker did not spend waiting for a CPU between tasks (a
        process sharing its core shows there: short tasks run at their usual speed and the time
        is lost between them)."""
        by_group: dict[int, dict[int, list[float]]] = {}
        for (g, _), p in self.parts.items():
            if p.holder >= 0 and p.task_cost > 0:
                by_group.setdefault(g, {}).setdefault(p.holder, []).append(p.task_cost)
        logs: list[list[float]] = [[] for _ in range(self.n_workers)]
        for per_worker in by_group.values():
            if len(per_worker) < 2:
                continue
            means = {w: statistics.fmean(c) for w, c in per_worker.items()}
            center = statistics.fmean(math.log(m) for m in means.values())
            for w, m in means.items():
                logs[w].append(center - math.log(m))  # costlier here: slower
        raw = [(math.exp(statistics.median(x)) if x else 1.0) * w.pace
               for x, w in zip(logs, self.workers)]
        mid = statistics.median(raw)
        return [s / mid for s in raw]

    def _estimates(self, spread: set[int]) -> tuple[list[float], list[float],
                                                     dict[tuple[int, int], float]]:
        """The workers' speeds and loads, and the work of each partition of ``spread`` (its
        cost times its holder's speed): what every decision starts from."""
        speeds = self.speeds()
        work = {k: p.cost * speeds[p.holder] for k, p in self.parts.items()
                if p.holder >= 0 and k[0] in spread}
        return speeds, self.loads(spread), work

    def _fits(self, room: dict[str, int], dst: int, nbytes: int) -> bool:
        """:meth:`MachineMemory.fits`, noting the lightest partition it turned away (for the
        line that says why nothing moved)."""
        if self.memory.fits(room, dst, nbytes):
            return True
        if self._mem_blocked is None or nbytes < self._mem_blocked[0]:
            self._mem_blocked = (nbytes, dst)
        return False

    # ------------------------------------------------------------------ decisions
    def decide(self, now: float, ctrl: Any) -> list[tuple[int, int, int, str]]:
        workers = self.workers
        if self.n_workers < 2 or any(w.reports < self.patience for w in workers):
            return []
        if any(w.done for w in workers):  # the job is ending: moving would only cost
            return []
        if not all(w.fresh for w in workers):
            return []
        for w in workers:
            w.fresh = False
        for k in list(self._held):  # every round of reports counts, moving or not
            self._held[k] -= 1
            if self._held[k] <= 0:
                del self._held[k]
        if ctrl.in_flight:
            self._wait_rounds = self.settle
            return []
        if self._wait_rounds:
            self._wait_rounds -= 1
            return []
        # workers step through the program together: the job's pace is theirs
        self._paces.append(statistics.fmean(w.progress for w in workers))
        if self._trial is not None:
            if len(self._paces) < self.patience:
                return []
            return self._judge(ctrl)
        del self._paces[:-self.patience]
        spread = self.spread_groups()
        if not self.measured_speeds(spread):
            # the loads are the last ones measured: the round neither counts as evidence nor
            # moves anything
            return []
        speeds, loads, work = self._estimates(spread)
        capacity = sum(s for w, s in enumerate(speeds) if w not in self.drained)
        ideal = sum(work.values()) / capacity
        drain = self._drain(loads, speeds, work, ctrl)
        if ideal <= 0:
            self._forget_evidence()
            return []
        for k, load in enumerate(loads):  # each worker's own evidence: spells elsewhere do not add
            excess = load / ideal - 1 - self.threshold
            if excess > 0:
                self._over[k] += 1
                self._excess[k] += excess
            else:
                self._over[k], self._excess[k] = 0, 0.0
        self._uneven = self._uneven + 1 if drain or any(self._over) else 0
        if drain:
            if self._uneven < self.patience:
                return []
        elif not any(over >= self.patience and excess >= self._needed(k)
                     for k, (over, excess) in enumerate(zip(self._over, self._excess))):
            return []
        moves = drain or self._plan(loads, speeds, work, ideal, ctrl)
        if not moves and not self._said_no_move:
            # a user who slowed a worker (CANARY_SLOWDOWN) and sees nothing move is told why
            self._said_no_move = True
            src = max(range(self.n_workers), key=lambda w: (loads[w], -w))
            held = ", ".join(map(str, sorted(self._held)))
            mem = self._mem_blocked
            why = (self.memory.why_not("the lightest partition that would help", *mem)
                   if mem is not None else
                   "every worker it could go to loses more of its time waiting for a CPU "
                   "(more processes than cores on this machine?), and a partition there would "
                   "answer late" if self._wait_blocked else
                   f"worker(s) {held} had partitions moved off for being slower and take none "
                   "back for a while (with another process on its core a worker runs a small "
                   "share at full speed and a larger one slower)" if self._hold_blocked else
                   f"no single partition's move lowers the busiest load by {self.min_gain:.0%} "
                   "of the even share (more partitions per worker would split it finer)")
            self.notes.append(f"worker {src} is the busiest ({loads[src]:.0%} of its time "
                              f"against an even {ideal:.0%}), but no partition moves: {why}")
        if moves:
            self._forget_evidence()
            self._wait_rounds = self.settle
            before = statistics.fmean(self._paces[-self.patience:])
            self._trial = ([(g, i, self.parts[(g, i)].holder, dst) for g, i, dst, _ in moves],
                           before, getattr(ctrl, "snapshots_started", 0))
            self._trial_drain = self.parts[moves[0][:2]].holder if drain else None
            if self._trial_drain is not None:
                if self._drain_half:  # held back like a worker relieved for being slower
                    self._hold(self._trial_drain)
                    self._halved.add(self._trial_drain)
                else:  # emptied: it takes no partition after
                    self.drained.add(self._trial_drain)
                    self._drain_tried.add(self._trial_drain)
            else:
                self._relieved |= {self.parts[(g, i)].holder for g, i, _, _ in moves}
                for slow in self._slower:
                    self._hold(slow)
            self._paces = []
        return moves

    def lost(self, worker: int) -> float:
        """The fraction of its time another process takes from ``worker``: its waits for a CPU
        between its tasks over its active time (where the waits stall the others: see
        :meth:`_drain`), or all its waits for a CPU over its time on or waiting for one (waits
        inside its tasks: bursts that outlast the kernel's turn), whichever is more."""
        w = self.workers[worker]
        return max(1.0 - w.pace, w.waiting)

    def _hold(self, worker: int) -> None:
        """``worker`` takes no partition for its hold (``hold_rounds`` at first; see step 5)."""
        self._held[worker] = self._hold_for.setdefault(worker, self.hold_rounds)

    def _needed(self, worker: int) -> float:
        """The evidence ``worker`` must gather before it counts as slower (step 3): times
        ``quiet_evidence`` where its reports measured its waits for a CPU and they stay under
        ``quiet_wait`` of its time."""
        w = self.workers[worker]
        quiet = w.cpu_measured and w.waiting < self.quiet_wait
        return self.evidence_needed * (self.quiet_evidence if quiet else 1.0)

    def _forget_evidence(self) -> None:
        self._uneven = 0
        self._over = [0] * self.n_workers
        self._excess = [0.0] * self.n_workers

    def _spell_scale(self, workers: int) -> float:
        """How much more evidence ``workers`` workers need than two: the ratio of what one
        round of a spell costs the job (one worker ``spell_factor`` times slower: its load
        over the ideal, less the threshold) on ``workers`` workers to what it costs on two.
        The others wait for the one that is slower: the more of them, the more of the job a
        spell holds back (``(f (W - 1) + 1) / W`` of the ideal, against ``(f + 1) / 2``), so
        with the sum of two workers a spell that passes would move partitions on many. 1 with
        one worker, or where a spell is within the threshold on two."""
        def cost(w: int) -> float:
            return (self.spell_factor * (w - 1) + 1) / w - 1 - self.threshold
        if workers < 2 or cost(2) <= 0:
            return 1.0
        return cost(workers) / cost(2)

    def _drain(self, loads: list[float], speeds: list[float], work: dict[tuple[int, int], float],
               ctrl: Any) -> list[tuple[int, int, int, str]]:
        """Moves for the worker that loses the most of its time waiting for a CPU (:meth:`lost`),
        above ``drain_wait``, once an earlier round of moves has taken part of its share: first
        half of its spread partitions, the heaviest (``_drain_half``); if it still waits that
        much after, all the rest (its serial steps too), when the other workers can take it
        (their predicted load, with their busy time outside tasks, at most ``1 - min_gain``:
        the job would run faster on them alone than it runs now), which must each lose
        ``wait_margin`` less. Such a worker (another
        process on its core) answers messages late, and waits inside its tasks while its
        bursts of work outlast the kernel's turn, so the others still sit idle after its share
        was cut: every iteration waits for it. Half first, since a small enough share runs at
        full speed, and emptying gives up a worker that could have done it. A worker that is
        merely slow waits for no CPU and is no candidate. A worker is halved once and emptied
        once; the pace check judges either like any other round of moves. An undone halving
        still leads to the emptying: the worker's waits did not shrink with its share, so no
        share of it is worth keeping."""
        cands = [w for w in self._relieved
                 if w not in self._drain_tried and loads[w] > 0 and self.lost(w) > self.drain_wait]
        if not cands:
            return []
        src = max(cands, key=lambda w: (self.lost(w), -w))
        lost = self.lost(src)
        plan = self._emptying(src, loads, speeds, work)
        if plan is None or any(ctrl.moving(g, i) for g, i, _ in plan.moves):
            return []
        spread, moves, half_top, top = plan.spread, plan.moves, plan.half_top, plan.top
        fits = top <= 1 - self.min_gain
        self._drain_half = src not in self._halved and spread >= 2
        self._empty_fits = fits
        if self._drain_half:
            # Half of its share, the heaviest, which the pace check (step 6) keeps only if the
            # job got no slower. A smaller share runs more of its work within the kernel's turn
            # (benchmarks/competed_share.py: beside a busy loop, keeping 3 of 8 partitions beat
            # emptying in each of six rounds, and the 5 a round of moves had left in five);
            # emptying caps the job at (W - 1 + s) / (W - 1) of the ideal (s its speed: 1.17x
            # on 4 workers). The greedy placement of the heavier half is the first half of the
            # whole one's.
            why = ("the others could take all of its share, but a smaller one may run at full "
                   "speed: moving half of it first" if fits else
                   "and the others cannot take all of its share: moving half of it")
            return [(g, i, dst, f"worker {src} loses {lost:.0%} of its time waiting for a CPU "
                                f"(another process on its core?), which every iteration waits "
                                f"for, {why} (predicted {half_top:.0%} of their time)")
                    for g, i, dst in moves[:spread // 2]]
        if not fits:
            return []
        return [(g, i, dst, f"worker {src} loses {lost:.0%} of its time waiting for a CPU "
                            f"(another process on its core?), which every iteration waits for "
                            f"whatever it holds: moving its partitions to the others "
                            f"(predicted {top:.0%} of their time)") for g, i, dst in moves]

    def _emptying(self, src: int, loads: list[float], speeds: list[float],
                  work: dict[tuple[int, int], float]) -> _Emptying | None:
        """How ``src`` would be emptied (see :meth:`_drain`), or None where no worker may take
        its partitions (the drained take none, nor those that do not lose ``wait_margin`` less
        of their time waiting for a CPU): its spread partitions, the heaviest first, each to
        the worker it leaves least loaded, then its serial steps' to the least loaded."""
        lost = self.lost(src)
        others = [w for w in range(self.n_workers) if w != src and w not in self.drained
                  and self.lost(w) <= lost - self.wait_margin]
        if not others:
            return None
        keys = sorted((k for k in work if self.parts[k].holder == src), key=lambda k: (-work[k], k))
        after = list(loads)
        moves = []
        half_top = 0.0
        room = self.memory.room()

        def place(key: tuple[int, int], cost: Callable[[int], float]) -> bool:
            """Move ``key`` to the worker it leaves least loaded (``cost(w)``: the load it
            adds there) among those with the memory for it; False where none has."""
            nbytes = self.parts[key].nbytes
            fit = [w for w in others if self._fits(room, w, nbytes)]
            if not fit:
                return False
            dst = min(fit, key=lambda w: (after[w] + cost(w), w))
            self.memory.take(room, dst, nbytes)
            after[dst] += cost(dst)
            moves.append((key[0], key[1], dst))
            return True

        short = False  # a partition fits in no other worker's memory: no emptying
        for n, key in enumerate(keys):
            short |= not place(key, lambda w: work[key] / speeds[w])  # noqa: B023 - called now
            if n + 1 == len(keys) // 2:
                half_top = max(after[w] + self.workers[w].rest for w in others)
        spread = len(moves)
        # its serial steps too (a model's weights): every iteration waits for those as well;
        # they count in no load
        for key in sorted(k for k, p in self.parts.items() if p.holder == src and k not in work):
            short |= not place(key, lambda w: 0.0)
        # their whole busy time must fit: the loads leave out the rest of it (messages), which
        # stays where it is (2 workers: taking all, worker 0's tasks alone came to 80% of its
        # time, and with its messages the job ran 1.7x slower than leaving the competed one be)
        top = math.inf if short else max(after[w] + self.workers[w].rest for w in others)
        return _Emptying(spread, moves, half_top, top)

    def _judge(self, ctrl: Any) -> list[tuple[int, int, int, str]]:
        """The last round of moves, ``patience`` fresh rounds after it settled: the moves back
        if the job got slower by more than ``undo_margin``, else none. A snapshot taken since
        the moves (the workers stood still while writing it) voids the comparison. An undone
        halving may leave one of its moves on trial (:meth:`_try_share`)."""
        assert self._trial is not None
        moved, before, snapshots = self._trial
        after = statistics.fmean(self._paces)
        drained, self._trial_drain = self._trial_drain, None
        share, self._share_trial = self._share_trial, None
        self._trial = None
        self._paces = []
        if getattr(ctrl, "snapshots_started", 0) != snapshots:
            if share is not None:
                self._end_share_trial(share, kept=True)
            return []
        if share is not None:
            return self._judge_share(share, moved, before, after, ctrl)
        if before <= 0 or after >= (1 - self.undo_margin) * before:
            gain = after / before - 1 if before > 0 else 0.0
            if drained is not None and drained not in self.drained:
                step = self._try_share(_ShareTrial(drained, moved, +1), after, ctrl, gain)
                if step:  # its line gives the figure
                    return step
            if before > 0:  # a user who saw the moves hears whether they paid
                self.notes.append(f"the job {pace_kept(gain, self.undo_margin)} after the last "
                                  + (f"{len(moved)} moves: they stay" if len(moved) > 1 else
                                     "move: it stays"))
            return []
        halved = drained if drained is not None and drained not in self.drained else None
        if drained is not None:
            self.drained.discard(drained)
        # A relief undone gives the worker its partitions back: nothing to hold. Partitions
        # given back to a worker relieved for being slower made the job slower: its speed with
        # the smaller share overstated it (another process on its core); twice as long a hold.
        for src in {src for _, _, src, _ in moved}:
            self._held.pop(src, None)
        self._hold_longer({dst for _, _, _, dst in moved})
        if halved is not None:  # one of its moves may stay, on trial
            self._try_share(_ShareTrial(halved, moved, -1), before, ctrl)
        stays: list[tuple[int, int, int, int]] = self._trial[0] if self._trial is not None else []
        back = self._move_back([m for m in moved if m not in stays], ctrl, lambda i, src, dst: (
            f"the last moves made the job {1 - after / before:.0%} slower, not faster: moving "
            f"partition {i} back to worker {src}"))
        if self._trial is None:
            self._after_undo(moved, drained)
        return back

    def _after_undo(self, moved: list[tuple[int, int, int, int]], drained: int | None) -> None:
        """What follows a round of ``moved`` undone (``drained``: the worker it emptied or
        halved): no move for the quiet rounds, unless emptying a worker may be the remedy left."""
        # Cutting the share of a worker that waits for its CPU did not pay: the remedy left is
        # emptying it (see _drain), which need not wait out the quiet rounds, once per worker,
        # and once more after its halving if the others could take it all.
        halving = drained is not None and drained not in self._drain_tried and self._empty_fits
        lagging = {src for _, _, src, _ in moved
                   if self.lost(src) > self.drain_wait
                   and src not in self._drain_tried
                   and (src not in self._hurried or halving)}
        if lagging:
            self._hurried |= lagging
            self._wait_rounds = self.settle
        else:
            self._undos += 1
            self._wait_rounds = self.settle + self.quiet_rounds * 2 ** (self._undos - 1)
        self._forget_evidence()

    def _hold_longer(self, workers: set[int]) -> None:
        """Each of ``workers`` that was held for being slower (or halved) is held again, twice
        as long as last time: partitions given back to it made the job slower."""
        for w in workers & set(self._hold_for):
            self._hold_for[w] *= 2
            self._hold(w)

    def _move_back(self, moved: list[tuple[int, int, int, int]], ctrl: Any,
                   why: Callable[[int, int, int], str]) -> list[tuple[int, int, int, str]]:
        """The moves that take each of ``moved`` ``(group, index, from, to)`` still on ``to``
        and not moving back to ``from`` (``why(index, from, to)`` their reason), marked not to
        return to ``to``."""
        back = []
        room = self.memory.room()
        for g, i, src, dst in moved:
            p = self.parts[(g, i)]
            if p.holder != dst or ctrl.moving(g, i):
                continue
            if not self._fits(room, src, p.nbytes):  # its old place has filled up since
                self.notes.append(f"partition {i} stays on worker {dst}: "
                                  + self.memory.why_not("it", p.nbytes, src))
                continue
            self.memory.take(room, src, p.nbytes)
            p.came_from = dst
            back.append((g, i, src, why(i, src, dst)))
        return back

    def _try_share(self, trial: _ShareTrial, pace: float, ctrl: Any, gain: float = 0.0
                   ) -> list[tuple[int, int, int, str]]:
        """The next step of ``trial``, the job's pace before it ``pace`` (``gain``: how much
        faster the step or halving before made it, below 0 if slower, for the progress line):
        one partition of the halving moves back onto the halved worker (step +1; from the
        busiest worker holding one, whose load the job waits for; among equals the last moved,
        the lightest), or off it again (step -1; to the least loaded of the workers the halving
        gave them to, among equals the last moved). The move, or none where the step would
        leave the worker all of the halving's partitions or none (both measured already), and
        none for a worker tried before (:attr:`_probed`) or one that emptying may follow
        (:meth:`_may_empty`).
        After an undone halving (``trial.step`` -1, ``trial.steps`` 0) the first step is no
        move: one of the halving's moves stays where it is (:meth:`_judge` leaves it out of the
        undo), and a line of the progress output says so.

        Halving rounds a share down, and the share that serves best beside another process
        depends on how long that process's turns are, which no report shows: on 2 workers
        beside a busy loop keeping 4 of 8 beat keeping 3 in the quiet hours and lost to it by
        9-10% in busier ones (``benchmarks/competed_share.py``). Nor is the share before the
        halving the best: it came from the round of moves by speed, and a worker sharing its
        core runs slower than its reports show (its waits inside tasks and between them are
        told apart by an estimate): k-means ran 7% faster with 5 of 8 than with the 6 that
        round left, and 7% slower with the halving's 3. So the pace decides, one partition at
        a time (:meth:`_judge_share`)."""
        worker = trial.worker
        if (not trial.steps and worker in self._probed) or self._may_empty(trial):
            return []
        loads = self.loads(self.spread_groups())
        off = [(n, (g, i, src, dst)) for n, (g, i, src, dst) in enumerate(trial.halving)
               if self.parts[(g, i)].holder == dst and not ctrl.moving(g, i)]
        on = [(n, (g, i, src, dst)) for n, (g, i, src, dst) in enumerate(trial.halving)
              if self.parts[(g, i)].holder == worker and not ctrl.moving(g, i)]
        first_undo = trial.step < 0 and not trial.steps
        if trial.step > 0 and len(off) >= 2:
            _, _, (g, i, _, dst) = max((loads[m[3]], n, m) for n, m in off)
            move = (g, i, dst, worker)
        elif first_undo and len(off) >= 2:  # all still off: one stays
            _, _, move = min((loads[m[3]], -n, m) for n, m in off)
        elif trial.step < 0 and trial.steps and len(on) >= 2:
            _, _, (g, i, _, dst) = min((loads[m[3]], -n, m) for n, m in on)
            move = (g, i, worker, dst)
        else:
            return []
        if not first_undo and not self._fits(self.memory.room(), move[3],
                                             self.parts[move[:2]].nbytes):
            return []  # the step would overfill the machine: the trial ends where it is
        self._probed.add(worker)
        g, i, src, dst = move
        self._share_trial = _ShareTrial(worker, trial.halving, trial.step, trial.steps + 1)
        self._trial = ([move], pace, getattr(ctrl, "snapshots_started", 0))
        self._wait_rounds = self.settle
        self.parts[(g, i)].came_from = src
        kept = ("kept only if the job gets faster than before the halving" if first_undo else
                "kept only if the job gets faster")
        if first_undo:
            self.notes.append(f"partition {i} stays on worker {dst}, on trial: worker {worker} "
                              f"keeps one partition fewer than before its halving ({kept})")
            return []
        if trial.steps:
            why = (f"the last partition {'back on' if trial.step > 0 else 'off'} worker "
                   f"{worker} made the job {gain:.0%} faster: trying partition {i} "
                   f"{'back on it' if trial.step > 0 else f'off it too, on worker {dst}'} ({kept})")
        else:
            why = (f"half of worker {worker}'s share moved and the job "
                   f"{pace_kept(gain, self.undo_margin)}: trying "
                   f"partition {i} back on it (a share that runs within the other process's "
                   f"turns may take one more; {kept})")
        return [(g, i, dst, why)]

    def _may_empty(self, trial: _ShareTrial) -> bool:
        """Whether emptying ``trial.worker`` may follow its halving: it still loses more than
        ``drain_wait``, and the others could take all of its share, as :meth:`_drain` will
        judge it on the placement that stays. After an undone halving that is the one before
        it, which the halving judged. After a kept one it is the halved placement: the
        others' loads have grown by the halving's partitions since, maybe past what the rest
        would fit in, and then the trial goes on (a logistic regression run beside a busy
        loop skipped it for an emptying that never came)."""
        worker = trial.worker
        if worker in self._drain_tried or self.lost(worker) <= self.drain_wait:
            return False
        if trial.step < 0:
            return self._empty_fits
        speeds, loads, work = self._estimates(self.spread_groups())
        plan = self._emptying(worker, loads, speeds, work)
        return plan is not None and plan.top <= 1 - self.min_gain

    def _judge_share(self, trial: _ShareTrial, moved: list[tuple[int, int, int, int]],
                     before: float, after: float, ctrl: Any) -> list[tuple[int, int, int, str]]:
        """A step of ``trial`` (``moved``: its one move) stays only if the job got faster
        (``after`` over ``before``), and the next step follows (:meth:`_try_share`); else the
        partition goes back and the trial ends (:meth:`_end_share_trial`)."""
        if before > 0 and after > before:
            step = self._try_share(trial, after, ctrl, after / before - 1)
            if step:
                return step
            i = moved[0][1]
            self.notes.append(f"the job {pace_kept(after / before - 1, self.undo_margin)} "
                              f"after partition {i} "
                              f"moved {'back on' if trial.step > 0 else 'off'} worker "
                              f"{trial.worker}: it stays, and the trial of worker "
                              f"{trial.worker}'s share ends")
            self._end_share_trial(trial, kept=True)
            return []
        back = self._move_back(moved, ctrl, lambda i, src, dst: (
            f"partition {i} {'back on' if trial.step > 0 else 'off'} worker {trial.worker} made "
            f"the job {max(1 - after / before, 0):.0%} slower, not faster: moving it back to "
            f"worker {src}" if before > 0 else f"moving partition {i} back to worker {src}"))
        self._end_share_trial(trial, kept=False)
        return back

    def _end_share_trial(self, trial: _ShareTrial, kept: bool) -> None:
        """After the last step of ``trial`` (``kept`` or moved back). Partitions back on the
        halved worker: if the last did not pay it is held again (twice as long: see step 5);
        the policy goes on from there with no quiet rounds, the trial being its own and not a
        plan the model got wrong. Partitions off it: what follows the undone halving follows
        (:meth:`_after_undo`)."""
        if trial.step < 0:
            self._after_undo(trial.halving, trial.worker)
            return
        if not kept:  # (the halved worker has a hold to double: the halving held it)
            self._hold_longer({trial.worker})
        self._wait_rounds = self.settle
        self._forget_evidence()

    def _plan(self, loads: list[float], speeds: list[float], work: dict[tuple[int, int], float],
              ideal: float, ctrl: Any) -> list[tuple[int, int, int, str]]:
        loads = list(loads)
        owner = {k: p.holder for k, p in self.parts.items()}
        # A worker that waits for its CPU (another process on its core) answers every message
        # late, whatever it holds: that lag is not in its load, so a partition moved onto it can
        # stall the whole job (a model's weights, which every iteration waits on, did). Such a
        # worker takes no partition from one that waits markedly less.
        paces = [w.pace for w in self.workers]
        moves: list[tuple[int, int, int, str]] = []
        self._wait_blocked = self._hold_blocked = False
        self._mem_blocked = None
        self._slower = set()
        room = self.memory.room()
        while len(moves) < self.max_moves:
            src = max(range(self.n_workers), key=lambda w: (loads[w], -w))
            top = loads[src]
            best: tuple[float, float, int, tuple[int, int], int] | None = None
            for key in sorted(k for k, w in owner.items() if w == src and k in work):
                p = self.parts[key]
                if ctrl.moving(*key) or any(m[:2] == key for m in moves):
                    continue
                for dst in range(self.n_workers):
                    if dst == src or dst == p.came_from or dst in self.drained:
                        continue
                    if dst in self._held:
                        self._hold_blocked = True
                        continue
                    if paces[dst] < paces[src] - self.wait_margin:
                        self._wait_blocked = True
                        continue
                    after = list(loads)
                    after[src] -= p.cost if owner[key] == p.holder else work[key] / speeds[src]
                    after[dst] += work[key] / speeds[dst]
                    new_top = max(after)
                    gain = top - new_top
                    transfer = p.nbytes / self.bandwidth + self.latency_s
                    if gain < self.min_gain * ideal or gain * self.horizon_s <= transfer:
                        continue
                    if not self._fits(room, dst, p.nbytes):  # it would overfill the machine
                        continue
                    # while the source stays the busiest, every destination gives the same
                    # top: the one left least loaded goes first, or one fast worker takes
                    # them all
                    cand = (new_top, after[dst], p.nbytes, key, dst)
                    if best is None or cand < best:
                        best = cand
            if best is None:
                break
            new_top, _, _, key, dst = best
            p = self.parts[key]
            self.memory.take(room, dst, p.nbytes)
            loads[src] -= work[key] / speeds[src]
            loads[dst] += work[key] / speeds[dst]
            owner[key] = dst
            p.came_from = src
            lost = self.lost(src)
            cpu = (f", losing {lost:.0%} of its time waiting for a CPU (another process on its "
                   "core?)," if lost > 0.15 else "")
            # a plan's later moves may even out what its first ones did, from a faster worker
            slower = speeds[dst] / speeds[src]
            who = (f"worker {src} is {slower:.2f}x slower than worker {dst}{cpu} and busier"
                   if slower > 1.05 else f"worker {src} is the busiest")
            if slower > 1.05:
                self._slower.add(src)
            moves.append((key[0], key[1], dst,
                          f"{who} ({top:.0%} of its time against an even {ideal:.0%}); "
                          f"predicted {new_top:.0%} after"))
        return moves
