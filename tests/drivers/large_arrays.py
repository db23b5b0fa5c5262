"""Rank 0 sends rank 1 arrays at and above the size the transport maps ahead of the receive
and sends in chunks (``PREFAULT_BYTES``), as a moving partition's values and as a piece, in
several shapes and dtypes; rank 1 checks each arrives whole, with its shape, dtype and values,
and writable. Prints what rank 1 received, and whether huge pages were offered here."""

import json

import numpy as np
from mpi4py import MPI

from canary.messages import MigrateArray, Piece
from canary.mpi_transport import _HUGE_PAGES, PREFAULT_BYTES, MpiTransport


def arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    n = PREFAULT_BYTES // 8
    return [rng.standard_normal(n),  # exactly the threshold
            rng.standard_normal(n + 3),  # not a whole number of pages
            rng.standard_normal((3 * n // 1000, 1000)).astype(np.float32) * 10,  # 2-D, 4 bytes
            np.arange(5 * n, dtype=np.int64)]  # 5x the threshold


comm = MPI.COMM_WORLD
tx = MpiTransport(comm)
want = arrays()
if comm.rank == 0:
    for k, a in enumerate(want):
        msg = (MigrateArray(k, k, k, a.copy()) if k % 2 == 0
               else Piece(k, k, k, 0, (0,), (0,), a.copy()))
        tx.send(1, msg)
    tx.flush()
else:
    got: dict[int, np.ndarray] = {}
    while len(got) < len(want):
        m = tx.poll()
        if m is not None:
            got[m[1].eid] = m[1].array
    for k, a in enumerate(want):
        b = got[k]
        assert b.shape == a.shape and b.dtype == a.dtype, (k, b.shape, b.dtype)
        assert np.array_equal(a, b), k
        b[...] = 0  # the receiver owns it: writable
    print(json.dumps({"received": [[list(got[k].shape), got[k].dtype.str]
                                   for k in range(len(want))],
                      "huge_pages": _HUGE_PAGES}), flush=True)
comm.Barrier()
