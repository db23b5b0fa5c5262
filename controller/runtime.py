"""The controller's thin MPI shell: feed worker messages to ControllerState, act on its output."""

from __future__ import annotations

import sys
import time

from mpi4py import MPI

from canary.env import env_number
from canary.errors import JobAborted
from canary.harness import JobResult
from canary.idle import Backoff
from canary.messages import Callback, Fail, Finish, ReportPart, Send, worker_rank
from canary.mpi_transport import MpiTransport
from canary.program import Program
from canary.trace import Tracer
from controller.state import ControllerState


def run_controller(program: Program, comm: MPI.Comm, max_sleep: float = 1e-2,
                   tracer: Tracer | None = None,
                   startup_timeout: float | None = None) -> JobResult:
    """Run rank 0 until every worker is done; return the job's result.

    Raises :class:`JobAborted` with the reason (a failed task's message, or a program mismatch)
    after telling every worker to abort. CPU time spent in report callbacks (user code) is
    excluded from ``controller_cpu_seconds``. A ``tracer`` records every message.

    If some worker has not announced itself ``startup_timeout`` seconds after start (default
    from ``CANARY_STARTUP_TIMEOUT``, else 120), the job is aborted naming those ranks: a driver
    that failed on one rank while declaring would otherwise leave everyone waiting when the
    job was not launched through ``python -m mpi4py``.
    """
    if startup_timeout is None:
        startup_timeout = env_number("CANARY_STARTUP_TIMEOUT", 120.0)
    state = ControllerState(program, comm.Get_size() - 1)
    tx = MpiTransport(comm)
    backoff = Backoff(max_sleep=max_sleep)
    t0 = time.perf_counter()
    c0 = time.process_time()
    user_cpu = 0.0
    while True:
        got = tx.poll()
        if got is None:
            tx.progress()
            backoff.sleep()
            if state.map is None and time.perf_counter() - t0 > startup_timeout:
                missing = [worker_rank(w) for w in range(state.n_workers) if w not in state.hello]
                reason = (f"rank(s) {missing} never started the program within "
                          f"{startup_timeout:.0f} s (did the driver fail there while declaring? "
                          "launch with `canary run` or `mpiexec ... python -m mpi4py` so that a "
                          "failure on any rank ends the whole job)")
                print(f"canary: job aborted: {reason}", file=sys.stderr, flush=True)
                raise JobAborted(reason)
            continue
        msg = got[1]
        if tracer is not None:
            tracer.recv(got[0], msg)
        if isinstance(msg, ReportPart):
            # Reports are not latency-critical: stay asleep-ish so a chatty driver keeps the
            # controller near idle.
            msg.seconds = time.perf_counter() - t0
        else:
            backoff.reset()
        for ins in state.handle(msg):
            if isinstance(ins, Send):
                if tracer is not None:
                    tracer.send(ins.dest, ins.message)
                tx.send(ins.dest, ins.message)
            elif isinstance(ins, Callback):
                u0 = time.process_time()
                ins.fn(ins.event)
                user_cpu += time.process_time() - u0
            elif isinstance(ins, Finish):
                tx.flush()
                return JobResult(state.results, state.tasks_run, state.n_workers,
                                 time.perf_counter() - t0, dict(state.received), dict(state.sent),
                                 time.process_time() - c0 - user_cpu,
                                 _sum_counts([d.messages_sent for d in state.done.values()]))
            elif isinstance(ins, Fail):
                # Say why before anything else: the workers, told to abort, must not be able to
                # end the job before the reason is on stderr.
                print(f"canary: job aborted: {ins.reason}", file=sys.stderr, flush=True)
                tx.flush(timeout=2.0)
                raise JobAborted(ins.reason)


def _sum_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out
