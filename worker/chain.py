"""A numba-compiled run loop for fused compute stretches (see ``worker.state.Stretch``).

Calling a numba kernel from Python costs ~0.4-1 µs (argument type dispatch, boxing the result),
more than the rest of a fused task's bookkeeping. When every instance of a stretch updates one
dataset in place (``v = f(v)``) and every ``f`` is a numba dispatcher, the stretch's sequence of
kernels on a partition is a *chain*: ``body`` repeated ``reps`` times, then the first ``tail``
stages of ``body``. This module compiles one loop per distinct body, which calls the kernels
directly from machine code (a few ns per call).

Compiling costs ~0.5-1 s, so a body is compiled only once its stretches have run
``compile_after`` tasks through Python dispatch (ski rental: the time lost to dispatch before
compiling is about what compiling costs, so the total is at most ~2x the better of the two
choices made in hindsight). A body whose loop fails to compile (a kernel numba cannot call from
compiled code, types that change from one stage to the next) is not tried again. The first
stretches of a body always run through the Python path, which checks every result's type, so
the compiled loop only ever sees kernels already seen to return arrays.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from canary.worker.config import WorkerConfig

MAX_BODY = 16  # longest body compiled (a stretch with no shorter period is one long body)
# Bodies remembered (their task counts and compiled loops), the least recently run dropped
# first. Every entry holds its kernels, and with them whatever they hold (closures, globals):
# a process that runs many programs (a pool worker, a driver calling canary.run in a loop),
# each declaring kernels of its own, kept every one of them for its whole life.
MAX_BODIES = 64

_FAILED = object()


def split_period(fns: Sequence[Any]) -> tuple[tuple[Any, ...], int, int]:
    """``(body, reps, tail)`` with ``fns == body * reps + body[:tail]`` and ``body`` shortest."""
    fns = list(fns)
    n = len(fns)
    for p in range(1, n + 1):
        # list equality compares items by identity first: kernels are compared by identity
        if fns[p:] == fns[:n - p]:
            return tuple(fns[:p]), n // p, n % p
    raise AssertionError("unreachable: p = n always matches")


def is_numba_kernel(fn: Any) -> bool:
    """Whether ``fn`` is a numba CPU dispatcher (``@numba.njit``)."""
    try:
        from numba.core.registry import CPUDispatcher
    except ImportError:  # pragma: no cover - numba is a dependency
        return False
    return isinstance(fn, CPUDispatcher)


class ChainCache:
    """Compiled chain loops by body, with the Python-dispatch task count that triggers them.

    ``runner(fns, tasks)`` returns ``(loop, reps, tail)`` to run the stretch compiled, or None
    to run it in Python (and counts its ``tasks`` towards compiling). ``loop(v, reps, tail,
    progress)`` returns the partition's new value, or None when that is ``v`` itself (updated in
    place: the same buffer, shape and strides, which is what numba's boxing would hand back as
    ``v``); not boxing a result saves ~0.5 µs a call. ``progress[0]`` counts the kernel calls that
    finished, so a failure can be pinned on its instance. If calling it raises a compile error
    (:func:`is_compile_error`; nothing has run then), call ``failed(fns)`` and run in Python.
    """

    # an MPI worker sets its WorkerConfig's (CANARY_COMPILE_AFTER, read with the other knobs)
    def __init__(self, compile_after: int = WorkerConfig.compile_after) -> None:
        self.compile_after = compile_after
        self.python_tasks: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self.loops: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self.compiled = 0

    def runner(self, fns: Sequence[Any], tasks: int) -> tuple[Any, int, int] | None:
        body, reps, tail = split_period(fns)
        loop = self.loops.get(body)
        if loop is _FAILED:
            return None
        if loop is None:
            if len(body) > MAX_BODY or not all(is_numba_kernel(f) for f in body):
                return None  # never compiled: nothing to count, and nothing of it kept
            seen = self.python_tasks.get(body, 0)
            if seen < self.compile_after:
                _remember(self.python_tasks, body, seen + tasks)
                return None
            self.python_tasks.pop(body, None)
            loop = _compile(body)
            _remember(self.loops, body, loop)
            if loop is _FAILED:
                return None
            self.compiled += 1
        else:
            self.loops.move_to_end(body)
        return loop, reps, tail

    def failed(self, fns: Sequence[Any]) -> None:
        _remember(self.loops, split_period(fns)[0], _FAILED)
        self.compiled -= 1


def _remember(table: OrderedDict[tuple[Any, ...], Any], body: tuple[Any, ...],
              value: Any) -> None:
    """Set ``table[body]`` as the most recently run, dropping the least recent past
    ``MAX_BODIES``."""
    table[body] = value
    table.move_to_end(body)
    if len(table) > MAX_BODIES:
        table.popitem(last=False)


CHAINS = ChainCache()  # this process's compiled loops (compiled code is per process anyway)


def _compile(body: tuple[Any, ...]) -> Any:
    if not all(is_numba_kernel(f) for f in body):
        return _FAILED
    import numba

    lines = ["def loop(v, reps, tail, progress):", "    v0 = v", "    for _ in range(reps):"]
    for k in range(len(body)):
        lines += [f"        v = f{k}(v)", "        progress[0] += 1"]
    for k in range(len(body)):
        lines += [f"    if tail > {k}:", f"        v = f{k}(v)", "        progress[0] += 1"]
    lines += ["    if (v.ctypes.data == v0.ctypes.data and v.shape == v0.shape",
              "            and v.strides == v0.strides):",
              "        return None", "    return v"]
    namespace: dict[str, Any] = {f"f{k}": f for k, f in enumerate(body)}
    exec("\n".join(lines), namespace)  # noqa: S102 - source built above from fixed templates
    return numba.njit(nogil=True)(namespace["loop"])


def is_compile_error(exc: BaseException) -> bool:
    """Whether ``exc`` is numba failing to compile a loop (not a kernel raising at run time)."""
    from numba.core.errors import NumbaError

    return isinstance(exc, NumbaError)
