"""Declaration: clear errors for impossible programs, co-location groups, the digest."""

from __future__ import annotations

import numpy as np
import pytest

from canary import DeclarationError, PartitionMismatchError, Program
from canary.program import OP_END, OP_FOR, OP_IF, OP_JUMP, OP_NEXT, OP_PUSH, OP_STAGE, OP_WHILE
from tests.conftest import declared_at


def _ones(i: int, n: int) -> np.ndarray:
    return np.ones(2)


def test_compute_over_different_partition_counts_names_both_datasets() -> None:
    p = Program()
    a, b = p.dataset("points", 4), p.dataset("labels", 3)
    p.load([a], _ones)
    with pytest.raises(PartitionMismatchError) as e:
        p.compute(lambda x: x, [a], [b], name="assign")
    msg = str(e.value)
    assert "'points' has 4" in msg and "'labels' has 3" in msg and "assign" in msg


def test_signal_over_multi_partition_dataset_is_refused() -> None:
    p = Program()
    a = p.dataset("residual", 4)
    p.load([a], _ones)
    with pytest.raises(DeclarationError, match="'residual' has 4 partitions"):
        with p.while_(lambda x: True, on=a):
            pass


def test_reading_a_dataset_before_it_is_written() -> None:
    p = Program()
    a, b = p.dataset("w", 1), p.dataset("g", 1)
    with pytest.raises(DeclarationError, match="reads dataset 'w' before any statement writes it"):
        p.compute(lambda x: x, [a], [b], name="update")


def test_broadcast_and_reduce_shapes_are_checked() -> None:
    p = Program()
    many, one = p.dataset("many", 3), p.dataset("one", 1)
    p.load([many], _ones)
    with pytest.raises(DeclarationError, match="source 'many' must have 1 partition"):
        p.broadcast(many, one)
    p.reduce(many, one)
    with pytest.raises(DeclarationError, match="output 'many' must have 1 partition"):
        p.reduce(one, many)


def test_bad_targets_and_replace_with_several_pieces() -> None:
    p = Program()
    a, b = p.dataset("a", 2), p.dataset("b", 2)
    p.load([a], _ones)
    with pytest.raises(DeclarationError, match=r"targets of source 0 must be distinct partitions in \[0, 2\)"):
        p.scatter_gather(a, b, lambda x: [x], "concat", targets=[[5], [0]])
    with pytest.raises(DeclarationError, match="exactly one piece"):
        p.scatter_gather(a, b, lambda x: [x, x], "replace")
    with pytest.raises(DeclarationError, match="unknown gather op"):
        p.scatter_gather(a, b, lambda x: [x, x], "mean")


def test_misc_declaration_errors() -> None:
    for name in (123, "", None):
        with pytest.raises(DeclarationError, match="a program's name must be a non-empty string"):
            Program(name)  # type: ignore[arg-type]
    p = Program()
    with pytest.raises(DeclarationError, match="positive integer"):
        p.dataset("x", 0)
    p.dataset("x", 1)
    with pytest.raises(DeclarationError, match="declared twice"):
        p.dataset("x", 2)
    with pytest.raises(DeclarationError, match="else_"):
        with p.else_():
            pass
    other = Program().dataset("y", 1)
    with pytest.raises(DeclarationError, match="declared on this program"):
        p.load([other], _ones)


def test_a_dataset_named_twice_among_a_stages_outputs_is_refused() -> None:
    # two outputs of one stage raced for one partition: the job hung on 2 workers
    p = Program()
    x, y = p.dataset("x", 2), p.dataset("y", 2)
    with pytest.raises(DeclarationError, match="dataset 'x' is named twice among its outputs"):
        p.load([x, x], lambda i, n: (np.ones(2), np.ones(2)))
    p.load([x], _ones)
    with pytest.raises(DeclarationError, match="dataset 'y' is named twice among its outputs"):
        p.compute(lambda v: (v + 1, v + 2), [x], [y, y], name="pair")
    with pytest.raises(DeclarationError, match="dataset 'x' is named twice among its outputs"):
        p.compute(lambda a, b: (a, b), [x, x], [x, x])
    p.compute(lambda a, b: a + b, [x, x], [y])  # an input twice is two reads: fine


@pytest.mark.parametrize("declare, says", [
    (lambda p, x, s: p.load([x], 5), r"load 'stage': the loader must be a function, got 5"),
    (lambda p, x, s: p.compute(None, [x], [x]), r"the kernel must be a function, got None"),
    (lambda p, x, s: p.scatter_gather(x, x, lambda v: [v, v], gather=7),
     r"the gather must be a function, got 7"),
    (lambda p, x, s: p.scatter_gather(x, x, "f", one_piece=True),
     r"the scatter must be a function, got 'f'"),
    (lambda p, x, s: p.report(x, callback=3), r"the callback must be a function, got 3"),
    (lambda p, x, s: p.while_(True, on=s).__enter__(),
     r"signal 'while_stage': the condition must be a function, got True"),
    (lambda p, x, s: p.if_(None, on=s).__enter__(), r"the condition must be a function"),
    # these were AttributeErrors out of program.py
    (lambda p, x, s: p.broadcast("s", x), r"stage 'broadcast_s': source: expected a dataset "
                                          r"declared on this program \(p.dataset"),
    (lambda p, x, s: p.reduce(x, "s"), r"stage 'reduce_x': output: expected a dataset"),
    (lambda p, x, s: p.report("x"), r"stage 'report_x': dataset: expected a dataset"),
    (lambda p, x, s: p.compute(lambda v: v, x, 3), r"outputs: expected a dataset.*got 3"),
])
def test_what_cannot_be_called_or_is_no_dataset_is_refused_at_declaration(
        declare: object, says: str) -> None:
    # it failed on a worker at run time: "TypeError: 'NoneType' object is not callable"
    p = Program()
    x, s = p.dataset("x", 2), p.dataset("s", 1)
    p.load([x], _ones)
    p.load([s], _ones)
    with pytest.raises(DeclarationError, match=says):
        declare(p, x, s)  # type: ignore[operator]


def test_ops_for_loops_and_branches() -> None:
    p = Program()
    c = p.dataset("c", 1)
    p.load([c], _ones)  # stage 0
    with p.loop(3):
        p.compute(lambda x: x, [c], [c])  # stage 1
    with p.while_(lambda x: False, on=c, max_iter=5):  # stage 2 (signal)
        p.compute(lambda x: x, [c], [c])  # stage 3
    with p.if_(lambda x: True, on=c):  # stage 4
        p.compute(lambda x: x, [c], [c])  # stage 5
    with p.else_():
        p.compute(lambda x: x, [c], [c])  # stage 6
    p.finalize()
    assert p.ops == [
        (OP_STAGE, 0), (OP_PUSH,), (OP_FOR, 3, 5), (OP_STAGE, 1), (OP_NEXT, 2),
        (OP_PUSH,), (OP_WHILE, 2, 5, 9), (OP_STAGE, 3), (OP_NEXT, 6),
        (OP_IF, 4, 12), (OP_STAGE, 5), (OP_JUMP, 13), (OP_STAGE, 6), (OP_END,),
    ]


def test_colocation_groups_follow_compute_stages() -> None:
    p = Program()
    X, y, lw, w = p.dataset("X", 4), p.dataset("y", 4), p.dataset("lw", 4), p.dataset("w", 1)
    p.load([X, y], lambda i, n: (np.ones((2, 2)), np.ones(2)))
    p.load([w], _ones)
    p.broadcast(w, lw)
    p.compute(lambda a, b, c: c, [X, y, lw], [lw])
    assert [tuple(d.name for d in g) for g in p.groups] == [("X", "y", "lw"), ("w",)]
    g = p.stage_graph()
    assert g.number_of_nodes() == len(p.stages)
    assert any(d["dataset"] == "lw" for _, _, d in g.edges(data=True))


def test_colocation_groups_are_networkx_connected_components() -> None:
    import random

    import networkx as nx

    def _same(*arrays: np.ndarray) -> np.ndarray:
        return arrays[0]

    for seed in range(40):
        rng = random.Random(seed)
        p = Program()
        ds = [p.dataset(f"d{k}", 3) for k in range(rng.randint(1, 14))]
        for d in ds:
            p.load([d], _ones)
        g = nx.Graph()
        g.add_nodes_from(range(len(ds)))
        for _ in range(rng.randint(0, 10)):
            ins = rng.sample(ds, rng.randint(1, min(3, len(ds))))
            out = rng.choice(ds)
            p.compute(_same, ins, [out])
            g.add_edges_from((a.id, out.id) for a in ins)
        want = sorted((sorted(c) for c in nx.connected_components(g)), key=lambda c: c[0])
        assert [[d.id for d in grp] for grp in p.groups] == want, seed
        assert all(p.group_of(d) == next(i for i, c in enumerate(want) if d.id in c)
                   for d in ds)


def test_digest_is_stable_and_sensitive() -> None:
    def make(parts: int) -> Program:
        p = Program("d")
        a = p.dataset("a", parts)
        p.load([a], _ones)
        return p

    assert make(4).digest == make(4).digest
    assert make(4).digest != make(5).digest


FACTOR = 2.0  # a module global a kernel reads


def test_the_digest_covers_the_plain_values_a_kernel_reads() -> None:
    # a value that differs between ranks (a global set from the rank) would make the answer
    # depend on where partitions run: it must make the statements differ
    import numba

    def make(factor: float) -> Program:
        p = Program("d")
        a = p.dataset("a", 2)
        p.load([a], _ones)
        p.compute(lambda v: v * factor + FACTOR, [a], [a], name="scale")
        return p

    one, same, other = make(1.0), make(1.0), make(3.0)
    assert one.digest == same.digest and one.digest != other.digest
    scale = next(s for s in one.statements() if s.startswith("compute scale"))
    assert "<lambda> [FACTOR=2.0, factor=1.0] r=a/2" in scale
    global FACTOR
    before, FACTOR = FACTOR, 5.0
    try:
        assert make(1.0).digest != one.digest
    finally:
        FACTOR = before

    # numba kernels by their Python function; arrays and objects are not compared; a long
    # string by its hash
    @numba.njit
    def kernel(v: np.ndarray) -> np.ndarray:
        return v * FACTOR

    rows, path = np.ones(3), "x" * 100
    p = Program("e")
    a = p.dataset("a", 2)
    p.load([a], lambda i, n: rows[:1] + len(path))
    p.compute(kernel, [a], [a], name="k")
    load, k = p.statements()[1:3]
    assert "kernel [FACTOR=2.0]" in k
    assert "rows" not in load and f"path='{path}'" not in load and "path=sha256:" in load


@pytest.mark.parametrize("bad", [2.5, True, -1])
def test_a_while_bound_must_be_a_whole_count(bad: object) -> None:
    # True was taken as 1, and 2.5 was told to be ">= 0"
    p = Program("bounded")
    c = p.dataset("c", 1)
    p.load([c], lambda i, n: np.zeros(1))
    with pytest.raises(DeclarationError, match=r"max_iter must be an integer >= 0 \(or None\), "
                                               rf"got {bad!r}"):
        with p.while_(lambda v: True, on=c, max_iter=bad):  # type: ignore[arg-type]
            pass


def test_a_declaration_error_names_the_driver_line_that_called_canary() -> None:
    # as a stage names the line that declared it: the innermost frame outside canary, the
    # `with` line for a loop (not contextlib's __enter__, which runs while_)
    from canary.errors import user_error_line

    p = Program("said")
    c = p.dataset("c", 1)
    p.load([c], _ones)
    with pytest.raises(DeclarationError) as caught:
        with p.while_(lambda v: True, on=c, max_iter=-1):  # raises: while
            pass
    assert user_error_line("drv", caught.value) == (
        f"drv: error: {declared_at('# raises: while')}: while 'while_<lambda>': max_iter must "
        "be an integer >= 0 (or None), got -1")

    def declare_twice() -> None:  # a helper of the driver's: its line, where canary was called
        p.dataset("c", 1)  # raises: twice

    with pytest.raises(DeclarationError) as caught:
        declare_twice()
    assert user_error_line("drv", caught.value) == (
        f"drv: error: {declared_at('# raises: twice')}: dataset 'c' is declared twice")


def test_each_loop_branch_and_stage_knows_the_driver_line_that_declared_it() -> None:
    # the controller's progress line names the loop a long job is in by its line
    import inspect

    here = inspect.currentframe()
    assert here is not None
    first = here.f_lineno + 3  # the line of p.load below
    p = Program("sites")
    x = p.dataset("x", 1)
    p.load([x], _ones)
    with p.while_(lambda v: True, on=x):
        with p.loop(2):
            p.compute(lambda v: v, [x], [x])
    with p.if_(lambda v: True, on=x):
        p.report(x)
    p.finalize()
    me = "tests/test_program.py"
    assert [(op[0], p.site(pc)) for pc, op in enumerate(p.ops) if p.site(pc)] == [
        (OP_STAGE, f"{me}:{first}"), (OP_WHILE, f"{me}:{first + 1}"),
        (OP_FOR, f"{me}:{first + 2}"), (OP_STAGE, f"{me}:{first + 3}"),
        (OP_IF, f"{me}:{first + 4}"), (OP_STAGE, f"{me}:{first + 5}")]
    assert p.site(len(p.ops) - 1) == ""  # the end was declared by no line
    # each stage knows its line too, for the messages that name it: a loop's or branch's
    # signal stage by its `with` line
    assert [st.site for st in p.stages] == [f"{me}:{first + k}" for k in (0, 1, 3, 4, 5)]
    assert p.stages[1].label((2,)) == f"stage 'while_<lambda>' (id 1, iteration (2,), " \
        f"declared at {me}:{first + 1})"
    # each of the statements ranks compare, for a mismatch to name its line on each side: the
    # dataset, the stages, then the ops
    sites = p.statement_sites()
    assert len(sites) == len(p.statements())
    assert sites == [f"{me}:{first - 1}"] + [st.site for st in p.stages] + [
        p.site(pc) for pc in range(len(p.ops))]
    # not part of what ranks and snapshots compare: a comment added above a loop must not make
    # a snapshot of the job unresumable (nor say its kernels changed)
    assert "test_program.py" not in "".join(p.statements()) + "".join(p.sources())
