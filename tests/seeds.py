"""Many-seed test loops spread over this machine's cores.

The in-process runner runs a job on one core, and the protocol tests run hundreds of seeded
jobs each. :func:`over_seeds` runs them in forked copies of the test process, one per core, so a
sweep takes its time divided by the cores (two on the development VM) and still reports the
first seed that failed, with its own traceback.
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def over_seeds(check: Callable[[int], T], seeds: Sequence[int],
               processes: int | None = None) -> list[T]:
    """``[check(s) for s in seeds]``, computed in up to ``processes`` processes (default: the
    cores this process may use), in the order of ``seeds``.

    ``check`` runs in a fork of this process, so it may be a closure; what it returns must
    pickle. Raises AssertionError naming the first seed (in ``seeds`` order) whose ``check``
    raised, with that exception's traceback; a child that died without answering is an
    AssertionError too. Without ``os.fork`` (or with one process) it runs in this process.
    """
    n = min(processes or len(os.sched_getaffinity(0)), len(seeds)) if hasattr(os, "fork") else 1
    slices = [list(seeds[k::max(n, 1)]) for k in range(max(n, 1))]  # this process: the first
    children = []
    for part in slices[1:]:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: answer for its slice, then leave without any teardown
            os.close(read)
            try:
                data = pickle.dumps(_answers(check, part))
            except BaseException:  # noqa: BLE001 - whatever failed must reach the parent
                data = pickle.dumps([(part[0], False, traceback.format_exc())])
            with os.fdopen(write, "wb") as out:
                out.write(data)
            os._exit(0)
        os.close(write)
        children.append((pid, read, part))
    answers = dict((s, (ok, v)) for s, ok, v in _answers(check, slices[0]))
    for pid, read, part in children:
        with os.fdopen(read, "rb") as inp:
            data = inp.read()
        os.waitpid(pid, 0)
        got = pickle.loads(data) if data else []
        if not got:
            raise AssertionError(f"the process checking seeds {part} died without answering")
        answers.update((s, (ok, v)) for s, ok, v in got)
    out = []
    for s in seeds:
        if s not in answers:
            raise AssertionError(f"seed {s} was not checked: an earlier one failed in its process")
        ok, value = answers[s]
        if not ok:
            raise AssertionError(f"seed {s} failed:\n{value}")
        out.append(value)
    return out


def _answers(check: Callable[[int], T], seeds: list[int]) -> list[tuple[int, bool, object]]:
    """``(seed, True, value)`` for each seed until one raises: then ``(seed, False,
    traceback)`` for it, and none after it."""
    got: list[tuple[int, bool, object]] = []
    for s in seeds:
        try:
            got.append((s, True, check(s)))
        except Exception:  # noqa: BLE001 - reported with its seed
            got.append((s, False, traceback.format_exc()))
            break
    return got

