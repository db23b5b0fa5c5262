"""Messages over MPI: the transport the two role runtimes send and receive through.

The other modules that import mpi4py are the two runtimes, ``canary.mpi_runner`` (the start-up
handshake and the communicator's ``Dup``), ``canary.script`` (ending the job when a driver
fails on one rank) and ``canary.ranks`` (how ``canary run`` starts each rank);
``tests/test_layering.py`` keeps it to these.

Headers are pickled (lower-case calls): pieces, signals and report parts as the compact tuples
of :mod:`canary.wire`, other messages as they are. A large array in a :class:`Piece` or
:class:`ReportPart` travels as a raw buffer right behind its header (upper-case, zero-copy on
the wire; in chunks of ``PREFAULT_BYTES`` when larger, see :func:`receive_raw`); MPI's
non-overtaking rule per (sender, tag) pairs each header with its buffer.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from canary.idle import Backoff
from canary.messages import MigrateArray
from canary.wire import pack, unpack

TAG_CTRL = 11
TAG_BUF = 12
# Below this many bytes an array rides inside the pickled header: one message instead of two.
INLINE_BYTES = 8192


# A raw buffer larger than this travels in chunks of this size, and a received one this large
# is mapped before MPI copies into it, a chunk at a time, just ahead of each chunk's copy. Left
# to fault one 4 KB page at a time during the copy, 100 MB took MPI about 0.23 s on a virtual
# machine; mapped in one call (MAP_POPULATE) 35 ms; on transparent huge pages, touched once per
# page, 9 ms: zeroing new pages costs about what the copy itself does. Chunk by chunk, the
# zeroed pages are still in the cache when MPI writes them (100 MB: 15 ms, against 19 ms for
# the whole array mapped first).
PREFAULT_BYTES = 1 << 22


def _huge_pages_offered() -> bool:
    """Whether ``madvise(MADV_HUGEPAGE)`` gets huge pages here (Linux with THP not ``never``)."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


_HUGE_PAGES = _huge_pages_offered()


def send_raw(comm: MPI.Comm, buf: np.ndarray, dest: int) -> list[MPI.Request]:
    """Start sending C-contiguous ``buf`` to ``dest`` behind its header, in chunks of
    ``PREFAULT_BYTES`` (what :func:`receive_raw` expects); ``buf`` must live until every returned
    request completes."""
    flat = buf.reshape(-1).view(np.uint8)
    return [comm.Isend(flat[o:o + PREFAULT_BYTES], dest, TAG_BUF)
            for o in range(0, flat.nbytes, PREFAULT_BYTES)]


def wait_sent(requests: list[MPI.Request], receive: Callable[[], Any] = lambda: None,
              keep: Callable[[Any], None] = lambda got: None) -> None:
    """Wait until ``requests`` (a :func:`send_raw`'s) complete, calling ``receive`` meanwhile and
    passing ``keep`` what it returns other than None (so that two ranks sending each other
    large arrays cannot wait for each other forever). Sleeps briefly between tests rather than
    spinning: the receiver maps its memory meanwhile, maybe on this core."""
    backoff = Backoff(min_sleep=1e-5, max_sleep=1e-4)
    while not MPI.Request.Testall(requests):
        got = receive()
        if got is not None:
            keep(got)
            backoff.reset()
        backoff.sleep()


# Linux 5.14+ maps (zeroed) pages for a range in one call. Called through ctypes, which lets go
# of the GIL, it runs in a helper thread while MPI copies the chunk before.
_MADV_POPULATE_WRITE = 23
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
if _LIBC is not None:
    _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _map_ahead(addr: int, nbytes: int, ready: threading.Semaphore, failed: list[int]) -> None:
    """Map ``nbytes`` from ``addr`` a chunk at a time, releasing ``ready`` once per chunk (every
    chunk's release comes, whatever happens). After a chunk the kernel will not map this way
    (an older kernel), or any error, it notes that in ``failed`` and maps no more."""
    chunks = range(0, nbytes, PREFAULT_BYTES)
    released = 0
    try:
        for o in chunks:
            if not failed and (_LIBC is None or _LIBC.madvise(
                    addr + o, min(PREFAULT_BYTES, nbytes - o), _MADV_POPULATE_WRITE) != 0):
                failed.append(o)
            ready.release()
            released += 1
    except Exception:  # the receiver touches the pages itself: slower, never wrong or stuck
        failed.append(-1)
        ready.release(len(chunks) - released)


# Pages of received arrays are mapped in multiples of this (a huge page), so that an array of
# about the same size can take pages kept by a :class:`Recycler`.
_MAP_GRAIN = 1 << 21


def _mapped_size(nbytes: int) -> int:
    """The bytes mapped for an array of ``nbytes``: rounded up to ``_MAP_GRAIN``."""
    return -(-nbytes // _MAP_GRAIN) * _MAP_GRAIN


class _Pages:
    """The base of an array :func:`receive_raw` received into pages it mapped: when the array and
    every view of it are gone, the pages go to ``recycler`` (or are unmapped)."""

    __slots__ = ("mem", "recycler", "__array_interface__")

    def __init__(self, mem: mmap.mmap, nbytes: int, recycler: Recycler | None) -> None:
        self.mem = mem
        self.recycler = recycler
        addr = np.frombuffer(mem, dtype=np.uint8).ctypes.data  # the export ends at once
        self.__array_interface__ = {"data": (addr, False), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}

    def __del__(self) -> None:
        if self.recycler is not None:
            self.recycler.keep(self.mem)


class Recycler:
    """Pages of received arrays, kept for a while after their arrays are gone, for the next
    array of the same size to arrive in without new pages.

    A worker receiving large arrays over and over (a scatter's pieces every iteration, a
    partition that moves back) would otherwise map new pages for each, and the kernel's zeroing
    of new pages costs about what MPI's copy into them does. At most ``max_bytes`` are kept, each
    mapping for about ``keep_s`` seconds (:meth:`expire`, which the transport calls as it polls):
    memory the program no longer holds goes back to the system soon, and never more than
    ``max_bytes`` of it is held. ``max_bytes=0`` keeps nothing (``CANARY_RECYCLE_MB``).

    Pages come back from whichever thread drops an array's last reference; ``take`` is called by
    the thread that receives. A return that would wait for the lock (or that comes from inside
    ``take``, at a garbage collection) lets the pages go instead: never a wait, never a deadlock.
    """

    def __init__(self, max_bytes: int = 256 << 20, keep_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes < 0 or not keep_s >= 0:
            raise ValueError(f"Recycler needs max_bytes >= 0 and keep_s >= 0, got {max_bytes!r} "
                             f"and {keep_s!r}")
        self.max_bytes = max_bytes
        self.keep_s = keep_s
        self.clock = clock
        self._kept: deque[tuple[float, mmap.mmap]] = deque()  # oldest first
        self._held = 0
        self._lock = threading.Lock()
        self.recycled_bytes = 0  # bytes received into kept pages, for traces and benchmarks

    @property
    def held_bytes(self) -> int:
        """Bytes of pages kept now."""
        return self._held

    def keep(self, mem: mmap.mmap) -> None:
        """Keep ``mem`` (pages no array uses any more), unless that would hold more than
        ``max_bytes``; pages not kept are unmapped when the last reference to them goes."""
        if len(mem) > self.max_bytes - self._held or not self._lock.acquire(blocking=False):
            return
        try:
            if len(mem) <= self.max_bytes - self._held:
                self._kept.append((self.clock(), mem))
                self._held += len(mem)
        finally:
            self._lock.release()

    def expire(self) -> None:
        """Let go of the pages kept longer than ``keep_s``."""
        with self._lock:
            self._expire()

    def _expire(self) -> None:
        stale = self.clock() - self.keep_s
        while self._kept and self._kept[0][0] < stale:
            self._held -= len(self._kept.popleft()[1])

    def take(self, nbytes: int) -> mmap.mmap | None:
        """Kept pages for an array of ``nbytes`` (the mapping's size rounded up alike), or None.
        Pages kept longer than ``keep_s`` are let go first."""
        size = _mapped_size(nbytes)
        with self._lock:
            self._expire()
            for entry in self._kept:
                if len(entry[1]) == size:
                    self._kept.remove(entry)
                    self._held -= size
                    self.recycled_bytes += nbytes
                    return entry[1]
        return None


def receive_raw(comm: MPI.Comm, src: int, dtype: np.dtype, shape: tuple[int, ...],
                recycler: Recycler | None = None) -> np.ndarray:
    """Receive the array :func:`send_raw` sends from ``src``: a new, writable array of ``shape``
    and ``dtype``.

    An array of a chunk or more arrives in pages of its own: pages ``recycler`` kept from an
    earlier array of the same size if it has some (and they go back to it when this array is
    gone), else new pages mapped just ahead of MPI's copy into them. On huge pages, an array of
    several chunks is mapped by a helper thread, a chunk or more ahead of the copy: zeroing new
    pages costs about what the copy does, and the sender, which waits without spinning while its
    array is copied, leaves its core to it."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    populate = getattr(mmap, "MAP_POPULATE", 0)
    touch = False
    if nbytes < PREFAULT_BYTES or not (populate or _HUGE_PAGES):
        flat = np.empty(nbytes, dtype=np.uint8)
    else:
        mem = recycler.take(nbytes) if recycler is not None else None
        if mem is None:
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
            size = _mapped_size(nbytes)
            if _HUGE_PAGES:
                mem = mmap.mmap(-1, size, flags=flags)
                mem.madvise(mmap.MADV_HUGEPAGE)
                touch = True
            else:  # 4 KB pages: one call maps them far faster than touching each
                mem = mmap.mmap(-1, size, flags=flags | populate)
        flat = np.asarray(_Pages(mem, nbytes, recycler))
    helper = None
    failed: list[int] = []
    if touch and nbytes > PREFAULT_BYTES and _LIBC is not None:  # not for a piece's few KB
        ready = threading.Semaphore(0)
        helper = threading.Thread(target=_map_ahead, args=(flat.ctypes.data, nbytes, ready, failed),
                                  name="canary-map-ahead", daemon=True)
        helper.start()
    for o in range(0, nbytes, PREFAULT_BYTES):  # the chunks send_raw sends
        chunk = flat[o:o + PREFAULT_BYTES]
        if helper is not None:
            ready.acquire()
        if touch and (helper is None or failed):
            chunk[::mmap.PAGESIZE] = 0  # cheap where the helper mapped it already
        comm.Recv(chunk, source=src, tag=TAG_BUF)
    if helper is not None:
        helper.join()
    return flat.view(dtype).reshape(shape)


class MpiTransport:
    """Non-blocking sends and polled receives on ``comm``.

    ``send`` never lets the caller's array be modified under an in-flight send: large arrays
    are copied once into a send buffer kept alive until MPI is done with it. Buffers are
    released by ``progress``, which ``send`` itself calls: a worker that never runs out of tasks
    (so never reaches its idle loop's ``progress``) still holds only the sends still in flight,
    not every buffer since it was last idle.

    ``send`` returns at once, except for a :class:`MigrateArray`: a moving partition's values
    are sent to the end before it returns. MPI moves a large message only while both ranks are
    inside MPI calls, and a worker busy with tasks calls MPI only between batches, so a 100 MB
    partition left to progress that way crawled at a few % of MPI's bandwidth. Meanwhile the
    transport keeps receiving (into its inbox, which ``poll`` returns first), so two workers
    moving partitions to each other cannot wait for each other forever.
    """

    def __init__(self, comm: MPI.Comm, recycler: Recycler | None = None) -> None:
        self.comm = comm
        self.recycler = recycler  # pages of received arrays, kept for the next ones
        self._pending: list[tuple[Any, ...]] = []
        self._inbox: deque[tuple[int, Any]] = deque()
        self._status = MPI.Status()
        self.sent = 0
        self.received = 0

    def send(self, dest: int, msg: Any) -> None:
        self.sent += 1
        if self._pending:
            self.progress()
        payload, buf = pack(msg, INLINE_BYTES)
        if buf is None:
            self._pending.append((self.comm.isend(payload, dest, TAG_CTRL),))
            return
        r1 = self.comm.isend(payload, dest, TAG_CTRL)
        raw = send_raw(self.comm, buf, dest)
        if type(msg) is MigrateArray:
            wait_sent(raw, self._receive, self._inbox.append)
        self._pending.append((r1, *raw, buf))

    @property
    def in_flight(self) -> int:
        """Sends whose buffers are still held (not yet released by ``progress``)."""
        return len(self._pending)

    def poll(self) -> tuple[int, Any] | None:
        """Return (source rank, message) if one has arrived, else None; never blocks long."""
        if self._inbox:
            return self._inbox.popleft()
        return self._receive()

    def _probe(self) -> bool:
        """Whether a message is there (its source in ``self._status``). MPICH's ``Iprobe``
        looks for a message before it makes progress, so one that arrived while this rank ran
        tasks (made no MPI call) is found only by the second probe: with one, a busy worker
        saw it a whole batch of tasks later (a pool's cancel, a 4 s task later)."""
        st = self._status
        comm = self.comm
        return bool(comm.Iprobe(MPI.ANY_SOURCE, TAG_CTRL, st)
                    or comm.Iprobe(MPI.ANY_SOURCE, TAG_CTRL, st))

    def _receive(self) -> tuple[int, Any] | None:
        if not self._probe():
            return None
        src = self._status.Get_source()
        msg, raw = unpack(self.comm.recv(source=src, tag=TAG_CTRL))
        if raw is not None:  # the array follows as a raw buffer (MPI keeps per-sender order)
            msg.array = receive_raw(self.comm, src, raw[0], raw[1], self.recycler)
        self.received += 1
        return src, msg

    def progress(self) -> None:
        """Release send buffers whose sends completed, and kept pages past their time."""
        if self.recycler is not None and self.recycler.held_bytes:
            self.recycler.expire()
        if self._pending:
            self._pending = [p for p in self._pending if not all(r.Test() for r in p if
                                                                    isinstance(r, MPI.Request))]

    def flush(self, timeout: float = 30.0) -> None:
        """Wait (polling, not spinning hot) until every send has completed, at most ``timeout``."""
        end = time.monotonic() + timeout
        backoff = Backoff(max_sleep=1e-3)
        while self._pending and time.monotonic() < end:
            self.progress()
            backoff.sleep()
