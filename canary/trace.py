"""Chrome trace-event output (open the file in https://ui.perfetto.dev or chrome://tracing).

``canary.run(program, trace=PATH)``, or the environment variable ``CANARY_TRACE=PATH`` (which
every app's and benchmark's ``--trace PATH`` flag sets), records on every rank:

* each task as a complete event (``ph: "X"``) on its worker's track, named after its stage, with
  the stage, kind, partition, stage-instance number and iteration in ``args``;
* a task run inside a fused compute stretch (see ``worker.state.Stretch``) the same way, with
  ``args.fused`` true: in a traced run, stretches call their kernels from Python so that every
  task is timed alone (an untraced run may call them from one compiled loop);
* each partition's move (``cat: "migration"``) as a span on its source (``migrate out``: from
  the move's arrival to the values' departure; ``args``: the move, the group and the partition
  index) and on its destination (``migrate in``: from the offer to the partition's
  installation; ``args`` as well as ``bytes``, what came, and ``recycled``, the bytes that
  arrived meanwhile in pages kept from earlier arrays, see ``canary.mpi_transport.Recycler``),
  at either level;
* each load report the controller receives (``cat: "load"``), at either level: a counter track
  per worker on the controller (``worker 1 load``: the fraction of the report's interval the
  worker was busy, the fraction it waited for a CPU, and 1 while it polls hot when idle, 0 while
  it sleeps: see ``canary.idle.Backoff.note_cpu_wait``) and the report itself as an instant
  event, which :func:`load_reports` reads back, so that a run's reports can be replayed through
  a move policy offline;
* each message as a short slice on the sender's and the receiver's track (``send Piece`` /
  ``recv Piece``) joined by a flow arrow (``ph: "s"``/``"f"``, id = the message's ``eid``, which
  is unique per job).

With ``CANARY_TRACE_LEVEL=loop`` (the benchmarks' setting) only the loop tests are recorded
besides the moves and load reports above: each signal task, whose instances end the iterations
(:func:`iteration_seconds`), and no message. Every other task then runs on the untraced path
(fused stretches may run compiled), so iteration times are those of an untraced run, not of
one paying the tracer on every task.

Timestamps are ``time.time()`` in microseconds, so the tracks of different ranks line up (on one
host exactly; across hosts as well as their clocks agree). At the end of the job every rank sends
its events to rank 0, which writes one JSON file. A disabled tracer costs nothing on the hot
path: the worker runs a separate, instrumented loop only when tracing.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

ENV = "CANARY_TRACE"
LEVEL_ENV = "CANARY_TRACE_LEVEL"
LEVELS = ("full", "loop")
MESSAGE_US = 1.0  # drawn width of a send/receive slice


def trace_path(trace: str | os.PathLike[str] | None = None) -> str | None:
    """The trace file asked for: ``trace`` if given, else ``$CANARY_TRACE``, else None.

    Raises TypeError if ``trace`` is neither a path nor None."""
    if trace is not None and not isinstance(trace, (str, os.PathLike)):
        raise TypeError(f"trace must be a file path (str), got {trace!r}")
    if trace:
        return os.fspath(trace)
    return os.environ.get(ENV) or None


def trace_level() -> str:
    """``$CANARY_TRACE_LEVEL``: "full" (the default: every task and message) or "loop" (signal
    tasks only). Raises ValueError for any other value."""
    from canary.env import env_choice

    return env_choice(LEVEL_ENV, LEVELS, "full")


class Tracer:
    """Events of one rank. ``clock()`` is the time base (seconds); events are plain dicts.

    With ``loop_only`` the runtimes record signal tasks only (the worker checks the flag;
    ``send``/``recv`` record nothing)."""

    def __init__(self, rank: int, name: str, loop_only: bool = False) -> None:
        self.rank = rank
        self.loop_only = loop_only
        self.events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": name}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
             "args": {"sort_index": rank}},
        ]
        self.clock = time.time

    def placement(self, host: str, cores: frozenset[int], own_core: bool) -> None:
        """Where this worker runs, as its track's label: its host, the cores it may run on and
        whether it has a core to itself (``canary.idle.has_own_core``: then it polls hot when
        idle, unless another process takes its core). ``args.own_core`` says it too."""
        shown = ",".join(map(str, sorted(cores)[:8])) + (",..." if len(cores) > 8 else "")
        self.events.append({
            "ph": "M", "name": "process_labels", "pid": self.rank, "tid": 0,
            "args": {"labels": f"{host}, cores {shown}, "
                               f"{'a core of its own' if own_core else 'shares its cores'}",
                     "host": host, "cores": sorted(cores), "own_core": own_core}})

    def task(self, task: Any, start: float, end: float, ok: bool = True) -> None:
        """A task of ``worker.state.Task`` that ran from ``start`` to ``end`` (seconds)."""
        st = task.stage
        args: dict[str, Any] = {"stage": st.id, "kind": task.kind, "partition": task.part,
                                "seq": task.seq, "iteration": list(task.iteration)}
        self._task(st.name, ok, start, end, args)

    def fused_task(self, stage: Any, seq: int, iteration: tuple[int, ...], partition: int,
                   start: float, end: float) -> None:
        """One compute task run inside a fused stretch (``args.fused`` is true)."""
        self._task(stage.name, True, start, end,
                   {"stage": stage.id, "kind": "compute", "partition": partition, "seq": seq,
                    "iteration": list(iteration), "fused": True})

    def _task(self, name: str, ok: bool, start: float, end: float, args: dict[str, Any]) -> None:
        self.events.append({
            "ph": "X", "name": name, "cat": "task" if ok else "task,failed", "pid": self.rank,
            "tid": 0, "ts": start * 1e6, "dur": max((end - start) * 1e6, 0.01), "args": args,
        })

    def span(self, name: str, start: float, end: float, args: dict[str, Any]) -> None:
        """Something that took from ``start`` to ``end`` (seconds) on this rank: a partition's
        move, as its source hands it over or its destination takes it in."""
        self.events.append({"ph": "X", "name": name, "cat": "migration", "pid": self.rank,
                            "tid": 0, "ts": start * 1e6, "dur": max((end - start) * 1e6, 0.01),
                            "args": args})

    def load_report(self, rep: Any, t: float | None = None) -> None:
        """A :class:`canary.messages.LoadReport` the controller received, at either level (see
        the module doc; about two a second per worker)."""
        ts = (self.clock() if t is None else t) * 1e6
        interval = max(rep.interval, 1e-9)
        self.events.append({
            "ph": "C", "name": f"worker {rep.worker} load", "cat": "load", "pid": self.rank,
            "tid": 0, "ts": ts,
            "args": {"busy": round(min(max(1.0 - rep.idle / interval, 0.0), 1.0), 4),
                     "waiting for a CPU": round(min(rep.cpu_wait / interval, 1.0), 4),
                     "polls hot": int(rep.polls_hot)}})
        self.events.append({
            "ph": "i", "s": "p", "name": "LoadReport", "cat": "load", "pid": self.rank,
            "tid": 0, "ts": ts,
            "args": {"eid": rep.eid, "worker": rep.worker, "interval": rep.interval,
                     "busy": [list(row) for row in rep.busy], "idle": rep.idle,
                     "tasks": rep.tasks, "seq": rep.seq, "done": rep.done, "cpu": rep.cpu,
                     "cpu_wait": rep.cpu_wait, "pc": rep.pc,
                     "counters": list(rep.counters), "polls_hot": rep.polls_hot,
                     "mem_free": rep.mem_free, "mem_total": rep.mem_total,
                     "mem_pool": rep.mem_pool}})

    def send(self, dest: int, msg: Any, t: float | None = None) -> None:
        """Message ``msg`` sent to rank ``dest`` (a flow starts)."""
        self._message("send", dest, msg, "s", self.clock() if t is None else t)

    def recv(self, src: int, msg: Any, t: float | None = None) -> None:
        """Message ``msg`` received from rank ``src`` (the flow from its send ends)."""
        self._message("recv", src, msg, "f", self.clock() if t is None else t)

    def _message(self, what: str, peer: int, msg: Any, ph: str, t: float) -> None:
        if self.loop_only:
            return
        kind = type(msg).__name__
        eid = getattr(msg, "eid", None)
        ts = t * 1e6
        args: dict[str, Any] = {"peer": peer}
        seq = getattr(msg, "seq", None)
        if seq is not None:
            args["seq"] = seq
        self.events.append({"ph": "X", "name": f"{what} {kind}", "cat": "message",
                            "pid": self.rank, "tid": 0, "ts": ts, "dur": MESSAGE_US, "args": args})
        if eid:
            flow: dict[str, Any] = {"ph": ph, "name": kind, "cat": "message", "id": eid,
                                    "pid": self.rank, "tid": 0, "ts": ts + MESSAGE_US / 2}
            if ph == "f":
                flow["bp"] = "e"
            self.events.append(flow)


def chrome_trace(per_rank: list[list[dict[str, Any]]], metadata: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """One Chrome trace object from every rank's events, timestamps relative to the first."""
    events = [e for evs in per_rank for e in evs]
    t0 = min((e["ts"] for e in events if "ts" in e), default=0.0)
    out = []
    for e in events:
        if "ts" in e:
            e = dict(e, ts=round(e["ts"] - t0, 3))
            if "dur" in e:
                e["dur"] = round(e["dur"], 3)
        out.append(e)
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": metadata or {}}


def write_trace(path: str, per_rank: list[list[dict[str, Any]]],
                metadata: dict[str, Any] | None = None) -> None:
    """Write the merged trace to ``path`` (through a temporary file, then rename).

    Raises OSError if it cannot; the temporary file is then removed."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(chrome_trace(per_rank, metadata), f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def gather_and_write(comm: Any, tracer: Tracer, path: str,
                     metadata: dict[str, Any] | None = None) -> None:
    """Collective over ``comm``: every rank's events to rank 0, which writes ``path``."""
    per_rank = comm.gather(tracer.events, root=0)
    if comm.Get_rank() == 0:
        write_trace(path, per_rank, metadata)


def load_events(path: str) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a trace file written by :func:`write_trace`."""
    with open(path) as f:
        return list(json.load(f)["traceEvents"])


def load_reports(events: list[dict[str, Any]]) -> list[tuple[float, Any]]:
    """The load reports a traced job's controller received, in the order it received them:
    ``(seconds into the trace, LoadReport)`` pairs, equal to the reports sent."""
    from canary.messages import LoadReport

    out = []
    for e in events:
        if e.get("ph") == "i" and e.get("cat") == "load" and e.get("name") == "LoadReport":
            a = e["args"]
            rep = LoadReport(a["eid"], a["worker"], a["interval"],
                             tuple((g, i, sec, nb) for g, i, sec, nb in a["busy"]), a["idle"],
                             a["tasks"], a["seq"], a["done"], a["cpu"], a["cpu_wait"],
                             # traces written before reports carried the position lack them
                             a.get("pc", 0), tuple(a.get("counters", ())),
                             a.get("polls_hot", False), a.get("mem_free", -1),
                             a.get("mem_total", -1), a.get("mem_pool", ""))
            out.append((e["ts"] / 1e6, rep))
    out.sort(key=lambda pair: pair[0])
    return out


def iteration_seconds(events: list[dict[str, Any]], prefix: str = "while_") -> list[float]:
    """Seconds between consecutive instances of the main loop's signal stage.

    The loop's signal task runs once per iteration (on the worker holding the tested dataset),
    after everything the test depends on, so the gaps between the ends of its instances are the
    iteration times as every worker sees them. The stage chosen is the one named ``prefix...``
    with the most instances. Returns [] if there is none.
    """
    ends: dict[str, dict[int, float]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "task" and str(e["name"]).startswith(prefix):
            seqs = ends.setdefault(e["name"], {})
            seq = e["args"]["seq"]
            seqs[seq] = max(seqs.get(seq, 0.0), e["ts"] + e["dur"])
    if not ends:
        return []
    main = max(ends.values(), key=len)
    t = [main[s] for s in sorted(main)]
    return [(b - a) / 1e6 for a, b in zip(t, t[1:])]
