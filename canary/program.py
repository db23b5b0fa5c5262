"""Declaring a canary program: datasets, stages, loops and branches.

A driver builds a :class:`Program` on every rank. Declaration only records statements; nothing
runs until :func:`canary.run` (MPI) or :func:`canary.run_local` (in-process) is called. Every
rank must declare the same statement list; :attr:`Program.digest` is compared across ranks at
start-up.

The program is flattened into a small instruction list (``ops``) that every worker interprets
in lock-step: the n-th stage instance a worker emits is the n-th on every worker, so its
sequence number (``seq``) names it globally, and the branch taken at a signal is the same on
every rank because the signal's value is broadcast.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from canary.errors import DeclarationError, PartitionMismatchError
from canary.sites import caller_site

if TYPE_CHECKING:
    import networkx as nx

READ = 0
WRITE = 1

# Stage kinds.
LOAD = "load"
COMPUTE = "compute"
SCATTER_GATHER = "scatter_gather"
SIGNAL = "signal"
REPORT = "report"

# Gather operations built in by name; a callable may be given instead.
GATHER_OPS = ("sum", "replace", "concat")


@dataclass(frozen=True)
class Dataset:
    """A partitioned variable: ``partitions`` numpy arrays, one per partition."""

    name: str
    partitions: int
    id: int
    # the driver line that declared it, for a mismatch between ranks to name; not compared,
    # as it is not part of the statements (a comment added above it changes it)
    site: str = field(default="", compare=False, repr=False)

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, partitions={self.partitions})"


@dataclass(eq=False)
class Stage:
    """One statement of the program.

    ``reads``/``writes`` are per-partition accesses of the stage's own partitioning (for a
    scatter-gather, the scatter side). A scatter-gather also writes ``dst`` on the gather side:
    partition ``j`` of ``dst`` is produced from the pieces sent by ``sources[j]``.
    """

    id: int
    kind: str
    name: str
    fn: Callable[..., Any] | None
    reads: tuple[Dataset, ...] = ()
    writes: tuple[Dataset, ...] = ()
    dst: Dataset | None = None
    gather: str | Callable[[list[np.ndarray]], np.ndarray] = "replace"
    targets: tuple[tuple[int, ...], ...] = ()
    sources: tuple[tuple[int, ...], ...] = ()
    one_piece: bool = False
    callback: Callable[..., Any] | None = None
    # Per-partition (dataset, mode) accesses of a task of this stage, precomputed for the hot path.
    accesses: tuple[tuple[Dataset, int], ...] = field(default=())
    # "file:line" of the driver statement that declared the stage (for a while_/if_ signal, the
    # `with` line), set by Program._add; "" if unknown. Said in label(), never in describe():
    # a comment added above a statement must not change what ranks and snapshots compare.
    site: str = ""

    @property
    def partitions(self) -> int:
        """Number of tasks on the stage's own (scatter/compute/load) side."""
        ds = self.reads or self.writes
        return ds[0].partitions if ds else 1

    def describe(self) -> str:
        """A canonical one-line description used for the cross-rank program digest."""
        fn = _fn_name(self.fn)
        parts = [
            self.kind,
            self.name,
            fn,
            "r=" + ",".join(f"{d.name}/{d.partitions}" for d in self.reads),
            "w=" + ",".join(f"{d.name}/{d.partitions}" for d in self.writes),
        ]
        if self.dst is not None:
            gather = self.gather if isinstance(self.gather, str) else _fn_name(self.gather)
            parts += [f"dst={self.dst.name}/{self.dst.partitions}", f"gather={gather}",
                      "t=" + hashlib.sha256(repr(self.targets).encode()).hexdigest()[:16]]
        return " ".join(parts)

    def label(self, iteration: tuple[int, ...] | None = None, *, declared: bool = True) -> str:
        """Human-readable name for error messages, with the driver line that declared the stage
        when known: ``stage 'grad' (id 4, iteration (3,), declared at train.py:31)``.

        ``declared=False`` leaves the line out, for text that is stored and compared across
        runs (a snapshot's kernel hashes, its position) rather than read once: the line moves
        when the driver is edited above the statement, and the stage is still the same one."""
        it = "" if not iteration else f", iteration {iteration}"
        at = f", declared at {self.site}" if declared and self.site else ""
        return f"stage '{self.name}' (id {self.id}{it}{at})"


def _fn_name(fn: Any) -> str:
    """The function's module and name, with the plain values it captures (see
    :func:`_captured`)."""
    if fn is None:
        return "-"
    py = getattr(fn, "py_func", fn)  # numba dispatchers wrap the Python function
    return f"{getattr(py, '__module__', '?')}.{getattr(py, '__qualname__', repr(py))}" \
        f"{_captured(py)}"


def _source_hash(fn: Any) -> str:
    """16 hex digits of SHA-256 of ``fn``'s source text, or of its bytecode and constants where
    the source cannot be read (a function made by ``exec``)."""
    import inspect

    py = getattr(fn, "py_func", fn)
    try:
        text = inspect.getsource(py)
    except (OSError, TypeError):
        code = getattr(py, "__code__", None)
        text = repr((code.co_code, code.co_consts)) if code is not None else _fn_name(py)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_PLAIN = (bool, int, float, complex, str, np.generic)


def _captured(fn: Any) -> str:
    """`` [name=value, ...]``: the numbers and strings that ``fn`` reads from its closure or
    its module's globals, by name; empty if none.

    Part of the statements compared across ranks: a kernel that reads a value which differs
    between ranks (a global set from the rank, the clock) computes an answer that depends on
    where its partitions run, and the job must not start. Arrays and other objects are not
    compared (too costly, or no faithful repr); nor are values read by functions it calls."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    seen: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            seen[name] = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
    module = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name in module and name not in seen:
            seen[name] = module[name]
    said = []
    for name in sorted(seen):
        v = seen[name]
        if isinstance(v, _PLAIN):
            text = repr(v)
            if len(text) > 64:
                text = "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
            said.append(f"{name}={text}")
    return f" [{', '.join(said)}]" if said else ""


# Interpreter instructions (tuples keep the interpreter loop cheap).
OP_STAGE = "stage"  # ("stage", stage_id)
OP_PUSH = "push"  # ("push",): enter a loop, counter 0
OP_FOR = "for"  # ("for", count, exit_pc): leave when counter == count
OP_WHILE = "while"  # ("while", stage_id, max_iter, exit_pc): signal decides, max_iter bounds
OP_NEXT = "next"  # ("next", head_pc): counter += 1, jump to head
OP_IF = "if"  # ("if", stage_id, else_pc)
OP_JUMP = "jump"  # ("jump", pc)
OP_END = "end"  # ("end",)


class Program:
    """A canary program under declaration.

    Typical use::

        p = Program("logreg")
        X = p.dataset("X", partitions=8)
        p.load([X], load_rows)
        ...
        with p.loop(10):
            p.broadcast(w, local_w)
            p.compute(gradient, inputs=[X, local_w], outputs=[local_g])
            p.reduce(local_g, g)

    Every method raises :class:`DeclarationError` (or its subclass
    :class:`PartitionMismatchError`) with the offending dataset and stage named.
    """

    def __init__(self, name: str = "program") -> None:
        if not isinstance(name, str) or not name.strip():  # it names snapshots, traces, logs
            raise DeclarationError(f"a program's name must be a non-empty string, got {name!r}")
        self.name = name
        _DECLARED.add(self)
        self.datasets: list[Dataset] = []
        self.stages: list[Stage] = []
        self.ops: list[tuple[Any, ...]] = []
        self._names: set[str] = set()
        self._written: set[int] = set()
        self._open_blocks: list[str] = []
        self._finalized = False
        self._groups: list[tuple[Dataset, ...]] | None = None
        self._last_if: int | None = None
        self._group_of: dict[int, int] | None = None
        self._statements: list[str] | None = None
        # op index -> "file:line" of the driver's statement that made it (stages, loop heads,
        # branches): for the controller's progress lines. Not in the statements: a comment
        # added above a loop must not make a snapshot of the job unresumable.
        self._sites: dict[int, str] = {}
        self._sources: dict[str, str] | None = None

    # ----------------------------------------------------------------- datasets
    def dataset(self, name: str, partitions: int = 1) -> Dataset:
        """Declare a dataset of ``partitions`` partitions (a scalar or model is 1 partition)."""
        self._check_open()
        if not isinstance(name, str) or not name:
            raise DeclarationError(f"dataset name must be a non-empty string, got {name!r}")
        if name in self._names:
            raise DeclarationError(f"dataset '{name}' is declared twice")
        if not isinstance(partitions, (int, np.integer)) or isinstance(partitions, bool) or partitions < 1:
            raise DeclarationError(
                f"dataset '{name}': partitions must be a positive integer, got {partitions!r}"
            )
        ds = Dataset(name, int(partitions), len(self.datasets), caller_site())
        self.datasets.append(ds)
        self._names.add(name)
        return ds

    # ------------------------------------------------------------------- stages
    def load(
        self,
        outputs: Dataset | Sequence[Dataset],
        loader: Callable[[int, int], Any],
        name: str | None = None,
    ) -> Stage:
        """Fill partition ``i`` of each output with ``loader(i, partitions)`` on its owner.

        ``loader`` returns one array per output (a tuple when there are several). It runs only on
        the worker that owns partition ``i``, so each worker reads only its own rows.
        """
        label = name or _short(loader)
        _check_callable(loader, f"load '{label}'", "loader")
        outs = self._as_datasets(outputs, label, "outputs", distinct=True)
        if not outs:
            raise DeclarationError("load: give at least one output dataset")
        self._check_same_partitions(outs, label, "load")
        return self._add(Stage(0, LOAD, label, loader, (), outs))

    def compute(
        self,
        kernel: Callable[..., Any],
        inputs: Sequence[Dataset] = (),
        outputs: Sequence[Dataset] = (),
        name: str | None = None,
    ) -> Stage:
        """Run ``kernel(*input_partitions)`` on every partition ``i``; it returns the outputs.

        The kernel (ideally ``@numba.njit``) receives partition ``i`` of each input and returns
        the new partition ``i`` of each output: one array, or a tuple for several outputs. To
        update in place, name the dataset as both input and output and return the array.
        All datasets of a compute stage must have the same partition count.
        """
        label = name or _short(kernel)
        _check_callable(kernel, f"compute stage '{label}'", "kernel")
        ins = self._as_datasets(inputs, label, "inputs")
        outs = self._as_datasets(outputs, label, "outputs", distinct=True)
        if not outs:
            raise DeclarationError(f"compute stage '{label}' declares no outputs")
        self._check_same_partitions(ins + outs, label, "compute stage")
        self._check_written(ins, label)
        return self._add(Stage(0, COMPUTE, label, kernel, ins, outs))

    def scatter_gather(
        self,
        inputs: Dataset | Sequence[Dataset],
        output: Dataset,
        scatter: Callable[..., Any] | None = None,
        gather: str | Callable[[list[np.ndarray]], np.ndarray] = "concat",
        targets: Callable[[int], Sequence[int]] | Sequence[Sequence[int]] | None = None,
        one_piece: bool = False,
        name: str | None = None,
    ) -> Stage:
        """The general P -> Q exchange, the only way data crosses partitions.

        For each source partition ``i`` (of ``inputs``), ``scatter(*input_partitions)`` returns one
        piece per destination in ``targets(i)`` (a sequence of arrays in that order), or a single
        array sent to all of them when ``one_piece`` is true. ``scatter=None`` sends the input
        partition itself (one input, ``one_piece``). For each destination partition ``j``,
        ``gather(pieces)`` receives the pieces addressed to ``j`` ordered by source partition and
        returns the new partition ``j`` of ``output``; built-ins: ``"sum"`` (element-wise, in
        source order, so the result does not depend on arrival order), ``"replace"`` (exactly one
        piece; copied) and ``"concat"`` (along axis 0). ``targets`` defaults to all-to-all and
        is evaluated once at declaration (a function of ``i`` or an explicit list per source).
        """
        label = name or (_short(scatter) if scatter is not None
                         else f"sg_{getattr(output, 'name', output)}")
        if scatter is not None:
            _check_callable(scatter, f"scatter-gather '{label}'", "scatter")
        if not isinstance(gather, str):
            _check_callable(gather, f"scatter-gather '{label}'", "gather")
        ins = self._as_datasets(inputs, label, "inputs")
        if not ins:
            raise DeclarationError(f"scatter-gather '{label}' needs at least one input dataset")
        if not isinstance(output, Dataset):
            raise DeclarationError(f"scatter-gather '{label}': output must be a Dataset, got {output!r}")
        self._check_same_partitions(ins, label, "scatter-gather (inputs)")
        self._check_written(ins, label)
        if scatter is None and (len(ins) != 1 or not one_piece):
            raise DeclarationError(
                f"scatter-gather '{label}': without a scatter function the single input is sent "
                "as is; pass one input and one_piece=True"
            )
        if isinstance(gather, str) and gather not in GATHER_OPS:
            raise DeclarationError(
                f"scatter-gather '{label}': unknown gather op {gather!r}; use one of {GATHER_OPS} "
                "or a function of the list of pieces"
            )
        p, q = ins[0].partitions, output.partitions
        tgt = _resolve_targets(targets, p, q, label)
        # one set per source (building one per (source, destination) pair is cubic in the
        # partitions: minutes for an all-to-all of 1,024)
        tgt_sets = [set(t) for t in tgt]
        sources = tuple(tuple(i for i in range(p) if j in tgt_sets[i]) for j in range(q))
        if gather == "replace":
            bad = [j for j in range(q) if len(sources[j]) != 1]
            if bad:
                raise DeclarationError(
                    f"scatter-gather '{label}': gather 'replace' needs exactly one piece per "
                    f"destination, but partition {bad[0]} of '{output.name}' gets "
                    f"{len(sources[bad[0]])}"
                )
        elif isinstance(gather, str):  # "sum" and "concat" make nothing out of no pieces
            bad = [j for j in range(q) if not sources[j]]
            if bad:
                raise DeclarationError(
                    f"scatter-gather '{label}': partition {bad[0]} of '{output.name}' gets no "
                    f"piece, and gather {gather!r} needs at least one per destination (name it "
                    "in some source's targets, or declare fewer output partitions)"
                )
        st = Stage(0, SCATTER_GATHER, label, scatter, ins, (), dst=output, gather=gather,
                   targets=tgt, sources=sources, one_piece=one_piece)
        stage = self._add(st)
        self._written.add(output.id)
        return stage

    def broadcast(self, source: Dataset, output: Dataset, name: str | None = None) -> Stage:
        """Copy the single partition of ``source`` into every partition of ``output`` (1 -> P)."""
        label = name or f"broadcast_{getattr(source, 'name', source)}"
        (source,) = self._as_datasets([source], label, "source")
        (output,) = self._as_datasets([output], label, "output")
        if source.partitions != 1:
            raise DeclarationError(
                f"broadcast '{label}': source '{source.name}' must have 1 partition, "
                f"has {source.partitions}"
            )
        return self.scatter_gather(source, output, None, "replace", None, True, label)

    def reduce(
        self,
        source: Dataset,
        output: Dataset,
        op: str | Callable[[list[np.ndarray]], np.ndarray] = "sum",
        name: str | None = None,
    ) -> Stage:
        """Combine every partition of ``source`` into the single partition of ``output`` (P -> 1).

        ``op="sum"`` adds the partitions in partition order, so the result is the same whatever
        the number of workers or the order in which pieces arrive.
        """
        label = name or f"reduce_{getattr(source, 'name', source)}"
        (source,) = self._as_datasets([source], label, "source")
        (output,) = self._as_datasets([output], label, "output")
        if output.partitions != 1:
            raise DeclarationError(
                f"reduce '{label}': output '{output.name}' must have 1 partition, "
                f"has {output.partitions}"
            )
        return self.scatter_gather(source, output, None, op, None, True, label)

    def report(
        self,
        dataset: Dataset,
        callback: Callable[[ReportEvent], None] | None = None,
        name: str | None = None,
    ) -> Stage:
        """Send every partition of ``dataset`` to the controller (rank 0) at this point.

        ``callback(event)`` runs on rank 0 once all partitions have arrived (progress lines,
        metrics). The latest reported value of each dataset is returned by ``run`` on rank 0,
        so a final ``report`` is how a driver fetches its result.
        """
        label = name or f"report_{getattr(dataset, 'name', dataset)}"
        if callback is not None:
            _check_callable(callback, f"report '{label}'", "callback")
        (ds,) = self._as_datasets([dataset], label, "dataset")
        self._check_written([ds], label)
        return self._add(Stage(0, REPORT, label, None, (ds,), (), callback=callback))

    # ------------------------------------------------------------- control flow
    @contextmanager
    def loop(self, count: int) -> Iterator[None]:
        """A fixed-count loop: the body runs ``count`` times on every worker, with no signal."""
        self._check_open()
        if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
            raise DeclarationError(f"loop count must be a non-negative integer, got {count!r}")
        self.ops.append((OP_PUSH,))
        head = len(self.ops)
        self._sites[head] = caller_site()
        self.ops.append((OP_FOR, int(count), -1))
        self._open_blocks.append("loop")
        yield
        self._open_blocks.pop()
        self.ops.append((OP_NEXT, head))
        self.ops[head] = (OP_FOR, int(count), len(self.ops))

    @contextmanager
    def while_(
        self,
        condition: Callable[[np.ndarray], Any],
        on: Dataset,
        max_iter: int | None = None,
        name: str | None = None,
    ) -> Iterator[None]:
        """Repeat the body while ``condition(on[0])`` is true, at most ``max_iter`` times.

        The condition is evaluated by the worker holding ``on``'s single partition before each
        iteration and broadcast to every worker, so all take the same branch.
        """
        stage = self._signal_stage(condition, on, name or f"while_{_short(condition)}")
        if max_iter is not None and (isinstance(max_iter, bool)
                                     or not isinstance(max_iter, (int, np.integer))
                                     or max_iter < 0):
            raise DeclarationError(f"while '{stage.name}': max_iter must be an integer >= 0 (or "
                                   f"None), got {max_iter!r}")
        bound = -1 if max_iter is None else int(max_iter)
        self.ops.append((OP_PUSH,))
        head = len(self.ops)
        self._sites[head] = stage.site  # the `with` line, as for the loop's test
        self.ops.append((OP_WHILE, stage.id, bound, -1))
        self._open_blocks.append("while")
        yield
        self._open_blocks.pop()
        self.ops.append((OP_NEXT, head))
        self.ops[head] = (OP_WHILE, stage.id, bound, len(self.ops))

    @contextmanager
    def if_(
        self, condition: Callable[[np.ndarray], Any], on: Dataset, name: str | None = None
    ) -> Iterator[None]:
        """Run the body only if ``condition(on[0])`` is true (decided once, broadcast to all).

        An ``else_()`` block may follow immediately.
        """
        stage = self._signal_stage(condition, on, name or f"if_{_short(condition)}")
        at = len(self.ops)
        self._sites[at] = stage.site  # the `with` line, as for the branch's test
        self.ops.append((OP_IF, stage.id, -1))
        self._open_blocks.append("if")
        yield
        self._open_blocks.pop()
        self.ops[at] = (OP_IF, stage.id, len(self.ops))
        self._last_if = at

    @contextmanager
    def else_(self) -> Iterator[None]:
        """The alternative of the ``if_`` block that immediately precedes it."""
        at = self._last_if
        if at is None or self.ops[at][2] != len(self.ops):
            raise DeclarationError("else_() must directly follow an if_() block")
        jump_at = len(self.ops)
        self.ops.append((OP_JUMP, -1))
        self.ops[at] = (OP_IF, self.ops[at][1], len(self.ops))
        self._last_if = None
        self._open_blocks.append("else")
        yield
        self._open_blocks.pop()
        self.ops[jump_at] = (OP_JUMP, len(self.ops))

    # ----------------------------------------------------------------- analysis
    def finalize(self) -> Program:
        """Close the declaration; idempotent. Raises if a loop or branch is still open."""
        if self._open_blocks:
            raise DeclarationError(f"program ends inside an open '{self._open_blocks[-1]}' block")
        if not self._finalized:
            self.ops.append((OP_END,))
            self._finalized = True
        return self

    @property
    def reported(self) -> frozenset[str]:
        """The names of the datasets some report stage sends to rank 0."""
        return frozenset(st.reads[0].name for st in self.stages if st.kind == REPORT)

    @property
    def updated_in_place(self) -> frozenset[int]:
        """The ids of the datasets some compute stage both reads and writes: a kernel may
        update their partitions in place (return its input), so a worker must own them."""
        return frozenset(d.id for st in self.stages if st.kind == COMPUTE
                         for d in st.writes if d in st.reads)

    @property
    def groups(self) -> list[tuple[Dataset, ...]]:
        """Co-location groups: datasets whose partition ``i`` must live on one worker.

        Connected components of the graph linking the datasets each stage accesses per
        partition (compute inputs/outputs, load outputs, scatter inputs). Deterministic order:
        by smallest dataset id.
        """
        if self._groups is None:
            # a union-find over a few dozen datasets: importing networkx for it would cost every
            # rank of every job a quarter of a second at start-up
            root = list(range(len(self.datasets)))

            def find(i: int) -> int:
                while root[i] != i:
                    root[i] = root[root[i]]
                    i = root[i]
                return i

            for st in self.stages:
                ds = [d.id for d in st.reads + st.writes]
                for a, b in zip(ds, ds[1:]):
                    root[find(a)] = find(b)
            members: dict[int, list[int]] = {}
            for i in range(len(self.datasets)):
                members.setdefault(find(i), []).append(i)
            comps = sorted(members.values(), key=lambda c: c[0])
            self._groups = [tuple(self.datasets[i] for i in c) for c in comps]
            self._group_of = {d.id: gi for gi, grp in enumerate(self._groups) for d in grp}
        return self._groups

    def group_of(self, dataset: Dataset) -> int:
        """Index in :attr:`groups` of the group holding ``dataset``."""
        self.groups  # noqa: B018 - computes the lookup table
        assert self._group_of is not None
        return self._group_of[dataset.id]

    def stage_graph(self) -> nx.MultiDiGraph:
        """Stage dependency graph: an edge s -> t labelled ``dataset`` when t may next access a
        dataset s accessed (in program order, loop back-edges included). For analysis and docs.
        """
        import networkx as nx

        g = nx.MultiDiGraph()
        g.add_nodes_from((s.id, {"name": s.name, "kind": s.kind}) for s in self.stages)
        order = [op[1] for op in self.ops if op[0] == OP_STAGE or op[0] in (OP_WHILE, OP_IF)]
        touches: dict[int, set[int]] = {}
        for sid in order:
            st = self.stages[sid]
            for d in st.reads + st.writes + ((st.dst,) if st.dst is not None else ()):
                touches.setdefault(d.id, set()).add(sid)
        for did, sids in touches.items():
            seq = [s for s in order if s in sids]
            for a, b in zip(seq, seq[1:] + seq[:1]):
                if len(seq) > 1 or a != b:
                    g.add_edge(a, b, dataset=self.datasets[did].name)
        return g

    def statements(self) -> list[str]:
        """The canonical statement list compared across ranks."""
        self.finalize()
        if self._statements is None:  # once: a finalized program no longer changes, and every
            # worker's Hello lists them (each all-to-all stage's targets are hashed in)
            self._statements = [f"dataset {d.name}/{d.partitions}" for d in self.datasets] + [
                s.describe() for s in self.stages
            ] + [repr(op) for op in self.ops]
        return list(self._statements)

    def statement_sites(self) -> list[str]:
        """Where the driver declared each of :meth:`statements`, in the same order: ``file:line``
        (as :meth:`site` says it), or "" where no line did (loop control, the end). Not part of
        the statements or the digest, which ranks and snapshots compare: a comment added above
        a statement moves its line. A worker sends them with its statements, so that a
        mismatch names the driver line on each side."""
        self.finalize()
        return [d.site for d in self.datasets] + [s.site for s in self.stages] + [
            self.site(pc) for pc in range(len(self.ops))]

    def sources(self) -> dict[str, str]:
        """For each stage that runs a function of the driver's (a kernel, loader, signal or
        custom gather), by the stage's label: a hash of that function's source text (of its
        bytecode where the source cannot be read). A snapshot records them, so that resuming
        with a kernel whose code has changed since is refused. Computed once."""
        if self._sources is None:
            self.finalize()
            found = {}
            for st in self.stages:
                fns = [f for f in (st.fn, st.gather) if f is not None and not isinstance(f, str)]
                if fns:
                    # keyed without the line: the snapshot must match after an edit above
                    found[st.label(declared=False)] = ",".join(_source_hash(f) for f in fns)
            self._sources = found
        return dict(self._sources)

    def site(self, pc: int) -> str:
        """Where the driver declared op ``pc`` (a stage, a loop's head, a branch), as
        ``file:line`` (the file relative to the working directory when under it), or "" when
        not known (the end, loop control, a declaration made from canary's own code only)."""
        return self._sites.get(pc, "")

    @property
    def digest(self) -> str:
        """SHA-256 of :meth:`statements`; equal on every rank of a deterministic driver."""
        return hashlib.sha256("\n".join(self.statements()).encode()).hexdigest()

    def tasks_per_instance(self, stage: Stage) -> int:
        """Number of tasks one instance of ``stage`` runs across all workers."""
        if stage.kind == SCATTER_GATHER:
            assert stage.dst is not None
            return stage.partitions + stage.dst.partitions
        if stage.kind == REPORT:
            return stage.reads[0].partitions
        return stage.partitions

    # ------------------------------------------------------------------ helpers
    def _add(self, stage: Stage) -> Stage:
        self._check_open()
        stage.id = len(self.stages)
        stage.accesses = tuple((d, READ) for d in stage.reads if d not in stage.writes) + tuple(
            (d, WRITE) for d in stage.writes
        )
        # for a signal, the `with p.while_(...)`/`with p.if_(...)` line: caller_site skips
        # contextlib's __enter__, which runs while_/if_ and so this
        stage.site = caller_site()
        self.stages.append(stage)
        self._written.update(d.id for d in stage.writes)
        if stage.kind != SIGNAL:
            self._sites[len(self.ops)] = stage.site
            self.ops.append((OP_STAGE, stage.id))
        return stage

    def _signal_stage(self, condition: Callable[..., Any], on: Dataset, label: str) -> Stage:
        _check_callable(condition, f"signal '{label}'", "condition")
        (ds,) = self._as_datasets([on], label, "on")
        if ds.partitions != 1:
            raise DeclarationError(
                f"signal '{label}': dataset '{ds.name}' has {ds.partitions} partitions; a signal "
                "is computed from a one-partition dataset (reduce into one first)"
            )
        self._check_written([ds], label)
        return self._add(Stage(0, SIGNAL, label, condition, (ds,), ()))

    def _check_open(self) -> None:
        if self._finalized:
            raise DeclarationError(f"program '{self.name}' is already finalized (it has run)")

    def _as_datasets(self, value: Any, label: str, what: str,
                     distinct: bool = False) -> tuple[Dataset, ...]:
        """``value`` (a dataset or a sequence of them) as a tuple. Raises DeclarationError for
        anything but datasets of this program, and, with ``distinct``, for one named twice
        (two outputs of one stage would race for one partition: the job hung)."""
        if isinstance(value, (str, bytes)) or not isinstance(value, (Dataset, Iterable)):
            value = [value]  # a name or a number: said below, not as "not iterable"
        items = (value,) if isinstance(value, Dataset) else tuple(value)
        for d in items:
            if not isinstance(d, Dataset) or d.id >= len(self.datasets) or self.datasets[d.id] is not d:
                raise DeclarationError(
                    f"stage '{label}': {what}: expected a dataset declared on this program "
                    f"(p.dataset(...)), got {d!r}"
                )
        if distinct:
            twice = next((d for k, d in enumerate(items) if any(d is e for e in items[:k])), None)
            if twice is not None:
                raise DeclarationError(
                    f"stage '{label}': dataset '{twice.name}' is named twice among its {what}; "
                    "each output takes one of the results, so name each dataset once")
        return items

    def _check_same_partitions(self, ds: Sequence[Dataset], label: str, kind: str) -> None:
        for d in ds[1:]:
            if d.partitions != ds[0].partitions:
                raise PartitionMismatchError(
                    f"{kind} '{label}': dataset '{ds[0].name}' has {ds[0].partitions} partitions "
                    f"but '{d.name}' has {d.partitions}; all datasets of a stage must be "
                    "partitioned alike (use scatter_gather to move data between partitionings)"
                )

    def _check_written(self, ds: Sequence[Dataset], label: str) -> None:
        for d in ds:
            if d.id not in self._written:
                raise DeclarationError(
                    f"stage '{label}' reads dataset '{d.name}' before any statement writes it "
                    "(load or compute it first)"
                )


def check_program(program: Any, caller: str) -> None:
    """Raises TypeError unless ``program`` is a :class:`Program` (it was an AttributeError out
    of the runner)."""
    if not isinstance(program, Program):
        raise TypeError(f"{caller}: expected a canary.Program (declare one with "
                        f"canary.Program(name)), got {program!r}")


def _check_callable(fn: Any, where: str, what: str) -> None:
    """Raises DeclarationError if ``fn`` cannot be called: at declaration, not as a TypeError
    out of a worker's task."""
    if not callable(fn):
        raise DeclarationError(f"{where}: the {what} must be a function, got {fn!r}")


@dataclass
class ReportEvent:
    """What a report callback receives on rank 0."""

    name: str
    dataset: str
    iteration: tuple[int, ...]
    values: list[np.ndarray]
    tasks: int
    seconds: float

    @property
    def value(self) -> np.ndarray:
        """The single partition of a one-partition dataset. Raises ValueError for a dataset of
        several (``values`` lists them), as :meth:`canary.JobResult.value` does."""
        if len(self.values) != 1:
            raise ValueError(f"dataset '{self.dataset}' has {len(self.values)} partitions: "
                             "ReportEvent.value is for a one-partition dataset; .values lists "
                             "them")
        return self.values[0]


_DECLARED: weakref.WeakSet[Program] = weakref.WeakSet()  # every Program this process made


def never_run() -> list[str]:
    """The names of the programs this process declared (with a stage at least) and never
    handed to a runner, which finalizes them: a driver that forgot ``canary.run(p)`` computed
    nothing."""
    return sorted(p.name for p in _DECLARED if p.stages and not p._finalized)


def _short(fn: Any) -> str:
    py = getattr(fn, "py_func", fn)
    return str(getattr(py, "__name__", "stage"))


def _resolve_targets(
    targets: Callable[[int], Sequence[int]] | Sequence[Sequence[int]] | None, p: int, q: int, label: str
) -> tuple[tuple[int, ...], ...]:
    if targets is None:
        out = [tuple(range(q))] * p
    elif callable(targets):
        out = [tuple(int(j) for j in targets(i)) for i in range(p)]
    else:
        out = [tuple(int(j) for j in t) for t in targets]
        if len(out) != p:
            raise DeclarationError(
                f"scatter-gather '{label}': targets lists {len(out)} sources, inputs have {p} partitions"
            )
    for i, t in enumerate(out):
        if len(set(t)) != len(t) or any(j < 0 or j >= q for j in t):
            raise DeclarationError(
                f"scatter-gather '{label}': targets of source {i} must be distinct partitions "
                f"in [0, {q}), got {list(t)}"
            )
    return tuple(out)
