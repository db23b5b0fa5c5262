"""The pool's transport: :class:`~canary.mpi_transport.MpiTransport` with each message tagged
by its job, so that one pair of ranks carries many jobs' messages and each reaches its own job.

The header of every message is ``(job, payload)``: a job's pieces, signals and reports keep the
compact wire format of :mod:`canary.wire`, and a large array still follows as a raw buffer
(MPI's order per sender pairs it with its header, whatever the job).
"""

from __future__ import annotations

from typing import Any

from canary.mpi_transport import INLINE_BYTES, TAG_CTRL, MpiTransport, receive_raw, send_raw
from canary.pool.messages import POOL, Envelope
from canary.wire import pack, unpack


class JobTransport(MpiTransport):
    """``send(dest, message)`` sends an :class:`Envelope`'s message under its job, anything
    else as the pool's own; ``poll()`` returns ``(source rank, Envelope or pool message)``."""

    def send(self, dest: int, msg: Any) -> None:
        self.sent += 1
        if self._pending:
            self.progress()
        job = POOL
        if type(msg) is Envelope:
            job, msg = msg.job, msg.message
        payload, buf = pack(msg, INLINE_BYTES)
        r1 = self.comm.isend((job, payload), dest, TAG_CTRL)
        if buf is None:
            self._pending.append((r1,))
            return
        self._pending.append((r1, *send_raw(self.comm, buf, dest), buf))

    def _receive(self) -> tuple[int, Any] | None:
        if not self._probe():
            return None
        src = self._status.Get_source()
        job, payload = self.comm.recv(source=src, tag=TAG_CTRL)
        msg, raw = unpack(payload)
        if raw is not None:
            msg.array = receive_raw(self.comm, src, raw[0], raw[1], self.recycler)
        self.received += 1
        return src, (msg if job == POOL else Envelope(job, msg))
