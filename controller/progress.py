"""The controller's progress line on long runs: how long, where in the program, how fast.

A job whose driver declares no report says nothing while it runs, and a ``while_`` whose
condition never turns false runs silently until ``--timeout``. So, every ``period_s`` seconds
(``CANARY_PROGRESS_S``; the first after half a period, so that a job of under half a period
prints nothing new), the controller prints one line on stderr::

    canary: 90 s: while_ 'never_converges' at tests/drivers/forever.py:25 iteration 20,112,
    stage instance 60,339; 121K tasks, 1.42K tasks/s, 236 iterations/s; workers 70% busy

It is built from the workers' load reports alone (no message more): each carries the worker's
position (``seq``, the interpreter's op index ``pc`` and its loop ``counters``), the tasks it
finished and the seconds it waited. The position said is the slowest worker's, since the job
is only as far as it is. Each worker reports at its own moment, ``CANARY_REPORT_MS`` apart,
so workers in step show a little apart in a fast loop; when the furthest is ahead by more than
a worker goes on by between two reports and at another iteration, it is named after the
slowest (``(worker 1; worker 0 at 1,250)``). A position is where the worker's interpreter
stands: it emits up to its run-ahead window of stage instances (8 to 64: about half a
second's worth, or 8 slow ones) ahead of the tasks that have finished, so the iteration said
can be a little ahead of the last one completed. Iterations count from 0, as in error messages
and ``ReportEvent.iteration``. The tasks are those the workers reported finished,
the rate is over the time since the previous line, and "busy" is the share of the workers'
time since then not spent waiting with nothing to run.
"""

from __future__ import annotations

from canary.messages import LoadReport
from canary.program import OP_END, OP_FOR, OP_IF, OP_STAGE, OP_WHILE, Program


class ProgressMeter:
    """Lines of progress for a job of ``n_workers`` running ``program``, one every
    ``period_s`` seconds of the controller's clock from ``period_s / 2`` on (``period_s`` > 0).

    Feed it every :class:`LoadReport` (:meth:`report`) and ask on every tick
    (:meth:`due`). ``tasks_base`` is the tasks a resumed job ran before its snapshot.
    ``heading`` begins each line, before the time: ``canary``, or for a job sharing a pool's
    workers ``canary pool: job 3``, as the pool's other lines of a job name it.
    """

    def __init__(self, program: Program, n_workers: int, period_s: float,
                 tasks_base: int = 0, heading: str = "canary") -> None:
        if not period_s > 0:
            raise ValueError(f"a progress period must be more than 0 s, got {period_s!r}")
        self.program = program
        self.heading = heading
        self.period_s = period_s
        self.next_at = period_s / 2
        self.n_workers = n_workers
        # worker -> (seq, pc, counters) of its latest report, and whether it said it is done
        self.position: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        # worker -> stage instances it went on by between its last two reports: how far apart
        # two workers in step can show, as each reports at its own moment
        self.stride: dict[int, int] = {}
        self.done: set[int] = set()
        self.tasks = tasks_base
        # since the last line: the clock, the task count, reported seconds busy and in all
        self._last_at = 0.0
        self._last_tasks = tasks_base
        self._busy_s = 0.0
        self._report_s = 0.0
        # the slowest worker's innermost loop head, outer counters and iteration at the last
        # line: an iteration rate is said only within the same run of the same loop
        self._last_loop: tuple[int, tuple[int, ...], int] | None = None
        self._loops = _enclosing_loops(program)

    def report(self, ev: LoadReport) -> None:
        """Take in one worker's load report."""
        last = self.position.get(ev.worker)
        self.stride[ev.worker] = 0 if last is None else max(ev.seq - last[0], 0)
        self.position[ev.worker] = (ev.seq, ev.pc, tuple(ev.counters))
        if ev.done:
            self.done.add(ev.worker)
        self.tasks += ev.tasks
        interval = max(ev.interval, 0.0)
        self._report_s += interval
        self._busy_s += min(max(interval - ev.idle, 0.0), interval)

    def due(self, now: float) -> str | None:
        """The line to print at ``now`` (seconds into the job), or None: before the first
        period, within a period of the last line, and once every worker has said it is done
        (the job is ending). Contract: two lines are at least ``period_s`` apart."""
        if now < self.next_at:
            return None
        # the next line a period after this one (not on a fixed grid: a controller busy in a
        # long callback must not print two lines at once when it comes back)
        self.next_at = now + self.period_s
        if len(self.done) == self.n_workers:
            return None
        line = self._line(now)
        self._last_at = now
        self._last_tasks = self.tasks
        self._busy_s = self._report_s = 0.0
        return line

    # ------------------------------------------------------------------------
    def _line(self, now: float) -> str:
        head = f"{self.heading}: {_duration(now)}:"
        running = {w: p for w, p in self.position.items() if w not in self.done}
        if not running:
            return (f"{head} no worker has reported its position yet (starting up: importing, "
                    "declaring the program, or waiting for the other ranks)")
        slow = min(running, key=lambda w: (running[w][0], w))
        seq, pc, counters = running[slow]
        where = self._where(pc, counters)
        text = f"{head} {where}, stage instance {seq:,}"
        fast = max(running, key=lambda w: (running[w][0], -w))
        fseq, fpc, fcounters = running[fast]
        loops = self._loops_at(pc)
        # Workers in step show apart by up to what one goes on by between two of its reports
        # (each reports at its own moment): only a gap beyond that is worth a word
        apart = fseq - seq > max(self.stride.get(w, 0) for w in running)
        if apart and (self._loops_at(fpc), fcounters) != (loops, counters):
            # a worker really behind: say where the furthest is too, compactly
            other = (f"{fcounters[-1]:,}" if fcounters and self._loops_at(fpc) == loops
                     and fcounters[:-1] == counters[:-1] else self._where(fpc, fcounters))
            text += f" (worker {slow}; worker {fast} at {other})"
        elapsed = now - self._last_at
        rates = [f"{_si(self.tasks)} tasks"]
        if elapsed > 0:
            rates.append(f"{_si((self.tasks - self._last_tasks) / elapsed)} tasks/s")
        if loops and counters:
            loop = (loops[-1], counters[:-1], counters[-1])
            last = self._last_loop
            if last is not None and last[:2] == loop[:2] and elapsed > 0:
                rates.append(f"{_si((loop[2] - last[2]) / elapsed)} iterations/s")
            self._last_loop = loop
        else:
            self._last_loop = None
        text += "; " + ", ".join(rates)
        if self._report_s > 0:
            text += f"; workers {100 * self._busy_s / self._report_s:.0f}% busy"
        return text

    def _where(self, pc: int, counters: tuple[int, ...]) -> str:
        """Op ``pc`` with loop ``counters`` in the driver's terms: each enclosing loop with its
        line and iteration, outermost first; outside any loop, the statement at ``pc``."""
        program = self.program
        ops = program.ops
        if not 0 <= pc < len(ops):  # not from this program: said as it is
            return f"op {pc}"
        loops = self._loops_at(pc)
        if loops:
            # the counters belong to the enclosing loops, innermost last; should they disagree
            # in number, pair them from the innermost, which the line is about
            paired = list(zip(reversed(loops), reversed(counters)))[::-1]
            return " > ".join(f"{self._loop(h)} iteration {c:,}" for h, c in paired)
        op = ops[pc]
        if op[0] == OP_END:
            return "the end of the program"
        if op[0] == OP_STAGE:
            return _at(f"stage '{program.stages[op[1]].name}'", program.site(pc))
        if op[0] == OP_IF:
            return _at(f"if_ '{program.stages[op[1]].name}'", program.site(pc))
        return f"op {pc}"

    def _loops_at(self, pc: int) -> tuple[int, ...]:
        return self._loops[pc] if 0 <= pc < len(self._loops) else ()

    def _loop(self, head: int) -> str:
        op = self.program.ops[head]
        if op[0] == OP_WHILE:
            bound = f" (max_iter {op[2]:,})" if op[2] >= 0 else ""
            return _at(f"while_ '{self.program.stages[op[1]].name}'{bound}",
                       self.program.site(head))
        return _at(f"loop({op[1]:,})", self.program.site(head))


def _enclosing_loops(program: Program) -> list[tuple[int, ...]]:
    """For each op index of ``program``, the heads (op indices) of the loops around it,
    outermost first. A loop with head ``h`` spans ``h`` up to its exit pc (its ``next`` op is
    the last within)."""
    ops = program.ops
    spans = [(h, op[2] if op[0] == OP_FOR else op[3]) for h, op in enumerate(ops)
             if op[0] in (OP_FOR, OP_WHILE)]
    return [tuple(h for h, end in spans if h <= pc < end) for pc in range(len(ops))]


def _at(what: str, site: str) -> str:
    return f"{what} at {site}" if site else what


def _si(x: float) -> str:
    """``x`` to 3 significant digits, with K, M or G for thousands, millions, billions."""
    for unit, size in (("", 1.0), ("K", 1e3), ("M", 1e6)):
        text = f"{x / size:.3g}"
        if abs(float(text)) < 1000:
            return text + unit
    return f"{x / 1e9:.3g}G"


def _duration(seconds: float) -> str:
    """``seconds`` as ``4.5 s``, ``45 s``, ``12 min 05 s`` or ``3 h 07 min`` (cut, not
    rounded: a line due at 30 s says 30 s, not 31)."""
    if seconds < 10:  # a short period (a test's, a demo's): "0 s" would say nothing
        return f"{int(seconds * 10) / 10:.1f} s"
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 120:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"
