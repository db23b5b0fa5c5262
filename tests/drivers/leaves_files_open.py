"""A driver that, after its job, leaves work for the interpreter's exit on every rank: a text
file written and never closed, an HDF5 file written and never closed, a (non-daemon) thread
that writes a file a little later, and a weak proxy whose object is gone. Files go to the
folder named by the first argument; with ``end_script`` as the second, the driver ends as the
apps do (``canary.script.end_script``)."""

import os
import sys
import threading
import time
import weakref

import h5py
import numpy as np
from mpi4py import MPI

import canary
from canary.sentinel import RUN_DIR, record_path

p = canary.Program("leaves_files_open")
a, s = p.dataset("a", 2), p.dataset("s", 1)
p.load([a], lambda i, n: np.array([float(i)]))
p.reduce(a, s)
p.report(s)
canary.run(p)

folder, rank = sys.argv[1], MPI.COMM_WORLD.Get_rank()
text = open(os.path.join(folder, f"text-{rank}.txt"), "w")  # noqa: SIM115 (left open on purpose)
text.write(f"rank {rank}\n" * 1000)
table = h5py.File(os.path.join(folder, f"table-{rank}.h5"), "w")
table.create_dataset("x", data=np.arange(1000.0) * rank)


class Gone:
    pass


gone = Gone()
dead = [weakref.proxy(gone)]  # asked anything (its class, say), it raises ReferenceError
del gone


def later() -> None:
    time.sleep(0.3)
    # under canary run: a rank's end is recorded only once what it does at the exit is done
    run_dir = os.environ.get(RUN_DIR)
    recorded = bool(run_dir) and os.path.exists(record_path(str(run_dir), "end", rank))
    with open(os.path.join(folder, f"thread-{rank}.txt"), "w") as f:
        f.write(f"done; end recorded: {recorded}\n")


threading.Thread(target=later).start()

if sys.argv[2:] == ["end_script"]:
    from canary.script import end_script

    end_script(0)
