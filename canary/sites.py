"""Where in the driver something happened, said as ``file:line``.

A stage remembers the driver line that declared it, and a mistake canary finds while the
driver declares names the line that made it: both are the innermost frame outside canary's own
package (and ``contextlib``, whose ``__enter__`` runs a ``with p.while_(...)``). One rule, so
that a declaration error and the stage it would have made name the same line.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Sequence
from types import FrameType

_CANARY_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # canary/ as installed
_CONTEXTLIB = os.path.abspath(sys.modules["contextlib"].__file__ or "contextlib")


def caller_site() -> str:
    """``file:line`` of the innermost caller of this function's caller outside canary's
    package and ``contextlib``: the line of the driver that declared what is being declared.
    "" if there is none."""
    def outwards(frame: FrameType | None) -> Iterable[tuple[str, int]]:
        while frame is not None:
            yield frame.f_code.co_filename, frame.f_lineno
            frame = frame.f_back

    return _first_site(outwards(sys._getframe(1)))


def declared_at(sites: Sequence[str], k: int) -> str:
    """``", declared at FILE:LINE"`` for statement ``k`` of ``sites`` (a program's
    :meth:`~canary.Program.statement_sites`), to follow the statement's number in a message;
    "" where its line is not known (``k`` beyond ``sites`` included)."""
    site = sites[k] if 0 <= k < len(sites) else ""
    return f", declared at {site}" if site else ""


def user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as :func:`traceback.format_exception` words it, less the
    outermost frames that are canary's own (the worker's runtime that called the user's
    kernel, loader, gather or callback): a user reads it from their own code. The innermost
    frame is kept even when canary's."""
    import traceback

    tb = exc.__traceback__
    while (tb is not None and tb.tb_next is not None
           and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_own_dirs())):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _own_dirs() -> tuple[str, ...]:
    """The folders of canary's own code: its package, and ``canary.worker`` and
    ``canary.controller``, which an editable install keeps in folders of their own."""
    # from sys.modules, not imported: this module is below the roles in the layering, and a
    # package not loaded has no frame in any traceback
    loaded = (sys.modules.get(name) for name in ("canary.worker", "canary.controller"))
    return (_CANARY_DIR, *(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                           for m in loaded if m is not None and m.__file__))


def call_site(exc: BaseException) -> str:
    """``file:line`` of the statement outside canary's package and ``contextlib`` whose call
    into canary raised ``exc``: the innermost such frame of its traceback (at the line the
    traceback records), when the frame that raised it is canary's. "" when code outside canary
    raised it (a driver's own ``raise`` words its message for its own user, who may not have
    written the driver), when it has no traceback, or when every frame is canary's."""
    places: list[tuple[str, int]] = []
    tb = exc.__traceback__
    while tb is not None:  # outermost first
        places.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    if not places or _shown_path(places[-1][0]) is not None:
        return ""
    return _first_site(reversed(places))


def _first_site(places: Iterable[tuple[str, int]]) -> str:
    """The first of ``places`` (``(filename, line)``, innermost first) that a site names, as
    ``file:line``; "" if none."""
    for filename, line in places:
        shown = _shown_path(filename)
        if shown is not None:
            return f"{shown}:{line}"
    return ""


@functools.lru_cache(maxsize=256)
def _shown_path(filename: str) -> str | None:
    """How a site names source file ``filename``: relative to the working directory when under
    it (as the driver was named on the command line, usually), else absolute; None for canary's
    own files (:func:`_own_dirs`) and ``contextlib``, which a site skips. Cached: working it
    out cost most of a declaration (26 µs a statement), and a driver declares from a few files;
    a file of canary's is in no frame before its package is loaded, so an answer never
    changes."""
    path = os.path.abspath(filename)
    if path.startswith(_own_dirs()) or path == _CONTEXTLIB:
        return None
    try:
        under = path.startswith(os.getcwd() + os.sep)
    except OSError:  # the working directory was removed
        under = False
    return os.path.relpath(path) if under else path
