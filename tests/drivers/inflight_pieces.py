"""Each of 2 partitions of 2 MB is sent to the other partition's worker, then tripled in place
at once, ITERATIONS times; prints what the receivers got the last time.

The sends are large enough for MPI's rendezvous protocol, so they can still be in flight when
the in-place kernel runs: a receiver must get the values from before it.
"""

import json
import sys

import numpy as np

import canary

N = 1 << 18  # 2 MB of float64
iterations = int(sys.argv[1])


def triple(x: np.ndarray) -> np.ndarray:
    x *= 3.0
    return x


p = canary.Program("inflight_pieces")
a, got, got_view = p.dataset("a", 2), p.dataset("got", 2), p.dataset("got_view", 2)
p.load([a], lambda i, n: np.full(N, float(i + 1)))
with p.loop(iterations):
    p.scatter_gather(a, got, None, "replace", targets=lambda i: [1 - i], one_piece=True,
                     name="send_itself")
    p.scatter_gather(a, got_view, lambda x: x.reshape(-1), "replace", targets=lambda i: [1 - i],
                     one_piece=True, name="send_a_view")
    p.compute(triple, [a], [a], name="triple_in_place")
p.report(got)
p.report(got_view)
r = canary.run(p)
if r is not None:
    out = {}
    for name in ("got", "got_view"):
        parts = r.results[name]
        out[name] = [[float(v.min()), float(v.max())] for v in parts]
    print(json.dumps(out))
