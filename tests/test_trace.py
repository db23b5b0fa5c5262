"""Chrome trace output: structure of the events, and a real traced MPI run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from canary.messages import LoadReport, Piece, PieceBatch
from canary.trace import Tracer, chrome_trace, iteration_seconds, load_reports, trace_path
from tests.conftest import mpirun


def fake_task(name: str, seq: int) -> SimpleNamespace:
    return SimpleNamespace(stage=SimpleNamespace(name=name, id=3), kind="compute", part=1,
                           seq=seq, iteration=(seq,))


def test_tracer_events_and_flows_pair_up() -> None:
    a, b = Tracer(1, "worker 0"), Tracer(2, "worker 1")
    a.task(fake_task("grad", 4), 10.0, 10.5)
    msg = Piece(77, 4, 0, 1, (0,), (1,), None)  # type: ignore[arg-type]
    a.send(2, msg, 10.5)
    b.recv(1, msg, 10.6)
    t = chrome_trace([a.events, b.events], {"workers": 2})
    ev = t["traceEvents"]
    assert min(e["ts"] for e in ev if "ts" in e) == 0.0
    (task,) = [e for e in ev if e.get("cat") == "task"]
    assert task["name"] == "grad" and task["pid"] == 1 and abs(task["dur"] - 5e5) < 1e-3
    assert task["args"] == {"stage": 3, "kind": "compute", "partition": 1, "seq": 4,
                            "iteration": [4]}
    s = [e for e in ev if e["ph"] == "s"]
    f = [e for e in ev if e["ph"] == "f"]
    assert len(s) == len(f) == 1 and s[0]["id"] == f[0]["id"] == 77 and f[0]["bp"] == "e"
    assert {e["args"]["name"] for e in ev if e["name"] == "process_name"} == {"worker 0", "worker 1"}


def test_a_batch_of_pieces_is_traced_with_its_stage_instance() -> None:
    tr = Tracer(1, "w")
    pieces = tuple(Piece(70 + k, 9, 0, k, (4,), (1,), None) for k in range(3))  # type: ignore[arg-type]
    tr.send(2, PieceBatch(80, pieces), 1.0)
    (ev,) = [e for e in tr.events if e["ph"] == "X"]
    assert ev["name"] == "send PieceBatch" and ev["args"] == {"peer": 2, "seq": 9}


def test_load_reports_are_read_back_as_they_were_received() -> None:
    tr = Tracer(0, "controller")
    sent = [LoadReport(11, 1, 0.5, ((0, 3, 0.125, 4096), (2, 0, 0.01, 8)), 0.25, 40, 812, False,
                       0.3, 0.05, 17, (4, 250), True, 3 << 30, 8 << 30, "boot:cgroup"),
            LoadReport(12, 0, 0.5, (), 0.5, 0, 812, True)]
    tr.load_report(sent[0], 100.0)
    tr.load_report(sent[1], 100.5)
    ev = chrome_trace([tr.events])["traceEvents"]
    assert load_reports(ev) == [(0.0, sent[0]), (0.5, sent[1])]
    counters = [e for e in ev if e["ph"] == "C"]
    assert [(e["name"], e["args"]) for e in counters] == [
        ("worker 1 load", {"busy": 0.5, "waiting for a CPU": 0.1, "polls hot": 1}),
        ("worker 0 load", {"busy": 0.0, "waiting for a CPU": 0.0, "polls hot": 0})]


def test_iteration_seconds_from_signal_instances() -> None:
    tr = Tracer(1, "w")
    for k, t in enumerate([1.0, 1.5, 2.5, 2.75]):
        tr.task(fake_task("while_not_converged", 10 * k), t - 0.01, t)
        tr.task(fake_task("grad", 10 * k + 1), t - 0.2, t - 0.1)
    gaps = iteration_seconds(chrome_trace([tr.events])["traceEvents"])
    assert [round(g, 6) for g in gaps] == [0.5, 1.0, 0.25]
    assert iteration_seconds([]) == []


def test_trace_path_prefers_argument_then_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("CANARY_TRACE", raising=False)
    assert trace_path(None) is None
    monkeypatch.setenv("CANARY_TRACE", "/tmp/x.json")
    assert trace_path(None) == "/tmp/x.json" and trace_path("y.json") == "y.json"
    assert trace_path(Path("z.json")) == "z.json"


def test_logistic_regression_trace_over_mpi(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    r = mpirun(3, "apps/logistic_regression.py", "--generate", "2000,4", "--max-iter", "3",
               "--partitions", "4", "--print-every", "0", "--trace", str(out))
    assert r.returncode == 0, r.stderr
    ev = json.loads(out.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert names == {0: "controller", 1: "worker 0", 2: "worker 1"}
    grads = [e for e in ev if e.get("cat") == "task" and e["name"] == "gradient_kernel"]
    assert len(grads) == 4 * 3
    assert sorted(e["args"]["partition"] for e in grads) == sorted(list(range(4)) * 3)
    assert {e["pid"] for e in grads} == {1, 2}
    # 2 partitions per worker: the gradient stage runs fused, still one slice per task. From
    # the third iteration a worker whose gradients took >= LONE_TASK_S runs them as ordinary
    # tasks (see canary.worker.fusion), so only the first two are sure to be fused.
    assert all(e["args"].get("fused") for e in grads if e["args"]["iteration"][0] < 2)
    sends = {e["id"] for e in ev if e["ph"] == "s"}
    recvs = {e["id"] for e in ev if e["ph"] == "f"}
    assert recvs <= sends and len(recvs) > 0  # every received message has its send
    assert len(iteration_seconds(ev)) == 2  # 3 signal instances (max-iter stops the 4th)


def test_loop_level_trace_records_the_loop_tests_only(tmp_path: Path) -> None:
    # CANARY_TRACE_LEVEL=loop (what the benchmarks time with): the signal tasks, which give the
    # iteration times, and nothing else, so every other task runs on the untraced path.
    out = tmp_path / "trace.json"
    r = mpirun(3, "apps/logistic_regression.py", "--generate", "2000,4", "--max-iter", "4",
               "--partitions", "4", "--print-every", "0", "--trace", str(out),
               env_extra={"CANARY_TRACE_LEVEL": "loop"})
    assert r.returncode == 0, r.stderr
    ev = json.loads(out.read_text())["traceEvents"]
    # (and any load report the controller received: two a second per worker, at either level)
    recorded = [e for e in ev if e["ph"] != "M" and e.get("cat") != "load"]
    assert recorded and all(e.get("cat") == "task" and e["args"]["kind"] == "signal"
                            for e in recorded), {e["name"] for e in recorded}
    assert len(iteration_seconds(ev)) == 3  # 4 signal instances (max-iter stops the 5th)


def test_an_unknown_trace_level_is_a_clear_error(tmp_path: Path) -> None:
    r = mpirun(3, "apps/logistic_regression.py", "--generate", "200,4", "--max-iter", "2",
               "--print-every", "0", "--trace", str(tmp_path / "t.json"),
               env_extra={"CANARY_TRACE_LEVEL": "tasks"})
    assert r.returncode == 2
    assert "CANARY_TRACE_LEVEL='tasks' is not one of full, loop" in r.stderr


def test_a_trace_file_that_cannot_be_written_stops_the_job_before_it_runs(tmp_path: Path) -> None:
    # it was found only once the whole job had run, by a traceback that lost the results
    bad = tmp_path / "nope" / "t.json"
    r = mpirun(3, "apps/logistic_regression.py", "--generate", "200,4", "--max-iter", "2",
               env_extra={"CANARY_TRACE": str(bad)}, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count(f"canary: error: the trace file {bad} (trace= or CANARY_TRACE): "
                          f"directory {bad.parent} does not exist") == 1
    assert "iter" not in r.stdout and not bad.parent.exists()
