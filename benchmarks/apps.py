"""Per-iteration time of the apps next to the bound they chase and the peers a user would pick.

For each app and size, in one run:

* **canary**: ``mpiexec -n W+1 python -m mpi4py apps/<app>.py --generate ... --max-iter K`` with
  ``CANARY_TRACE`` set and ``CANARY_TRACE_LEVEL=loop``: only the loop tests are recorded, every
  other task runs on the untraced path (with ``--trace``, each size's first repeat records
  everything, at the tracer's cost); the per-iteration time is the mean gap between
  consecutive instances of the main loop's signal task as the workers recorded them
  (``canary.trace.iteration_seconds``),
  first and last iteration excluded (as the paper reports). The controller's report timestamps
  are not used: it polls with a back-off of up to 10 ms, so they arrive in bursts. Peak RSS of the largest rank
  (each worker rank's own ``ru_maxrss``, via ``benchmarks/peak_rss.py``) minus the same app's at
  a tiny size (the runtime's own footprint) is compared with the data's bytes per worker
  (``memory_vs_partitions``) and with the bytes of the arrays each worker holds in its
  partitions when the job ends (``memory_vs_held``, the worst worker).
* **numba bound**: one process, ``W`` numba threads (``parallel=True``) calling the app's own
  kernel (logistic regression's gradient, k-means' assignment) over row blocks of the same data,
  or a CSR pull PageRank: the memory-bandwidth-bound time canary chases. Timed on ``W`` threads
  and on one; the faster is the bound (on a loaded machine one thread can win).
* **peers** (optional extra, ``pip install -e .[compare]``; skipped with a message when absent):
  Dask threaded and Dask distributed (``W`` single-thread workers) and PySpark ``local[W]``
  with ``mapPartitions`` over numpy blocks, for logistic regression and k-means; the
  functional per-row PySpark ``map``/``reduce`` for logistic regression and the classic
  PySpark RDD-join PageRank, at the smallest size only unless ``--full-peers``; for PageRank,
  Dask (threaded and distributed) sums a ``bincount`` per persisted edge block
  (``dask.delayed``). These time ``max(3, K // 3)`` iterations from Python, and each one's
  answer after them is checked against numpy's (``"correct"``, ``max_rel_err``; the row's
  ``peers_correct``).
* **Spark JVM peers** (``benchmarks/spark_jvm.py``; pyspark plus a JDK's ``javac``): Java
  sources under ``benchmarks/jvm`` compiled against pyspark's jars, run in the same
  ``local[W]`` SparkContext through py4j on data written once to a raw file that each
  partition reads itself. ``spark_jvm_mappartitions``: logistic regression at every size and
  k-means (cached ``double[]`` blocks, ``mapPartitions`` + ``reduce``); ``spark_jvm_rdd_join``
  (the classic RDD-join PageRank) and ``spark_graphx`` (``graphx.lib.PageRank.run``) at the
  smallest PageRank size unless ``--full-peers``. The JVM times iterations itself
  (``System.nanoTime``; GraphX, which runs every iteration in one call, as
  ``(T(2 + K) - T(2)) / K``): ``K`` for ``mapPartitions``, ``max(3, K // 3)`` for the two
  PageRank peers (~0.5-1.3 s an iteration), and each answer is checked against numpy
  (``"correct"``). Each peer's row has its ``wall_s``, setup included.

Canary and the bound are each measured ``--repeats`` times (default 2), interleaved; the row
compares the fastest of each (``canary_vs_numba``; ``canary_s_runs`` and ``numba_s_runs`` keep
them all), gives the median of the rounds' own ratios beside it (``canary_vs_numba_paired``:
each round's bound and canary run back to back, under the same load) and reports the largest
peak memory. Each peer's seconds over canary's is ``speedup_vs_<peer>`` in the
app's row. Every canary run and bound is measured before the first peer starts: pyspark's
JVM outlives its SparkContext and slows whatever is measured beside it.

Every line printed is JSON; the last is the summary with the ratios.

    python benchmarks/apps.py               # default sizes (a few minutes, more with peers)
    python benchmarks/apps.py --quick       # tiny sizes (tests)
    python benchmarks/apps.py --apps logistic_regression --no-peers
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numba
import numpy as np
from numba import prange

ROOT = Path(__file__).resolve().parent.parent
# first the repository root, and not this folder: benchmarks/apps.py would shadow the apps package
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks")]

import apps.kmeans as km_app  # noqa: E402
import apps.logistic_regression as lr_app  # noqa: E402
from benchmarks import spark_jvm  # noqa: E402
from benchmarks.datasets import lr_data, pagerank_csr, rmat  # noqa: E402
from canary.trace import iteration_seconds, load_events  # noqa: E402

SIZES: dict[str, list[tuple[int, ...]]] = {
    "logistic_regression": [(400_000, 20), (4_000_000, 20)],
    "kmeans": [(1_000_000, 20, 8)],
    # 2^17 vertices: the size the PySpark RDD-join PageRank can iterate in seconds (peers run
    # only there); 2^20 vertices, 10M edges: canary and the bound only.
    "pagerank": [(131_072, 1_310_720), (1_048_576, 10_000_000)],
}
QUICK_SIZES: dict[str, list[tuple[int, ...]]] = {
    "logistic_regression": [(20_000, 8)],
    "kmeans": [(20_000, 4, 3)],
    "pagerank": [(4_096, 40_000)],
}


# ------------------------------------------------------------------ numba bounds
def njit_keyed_on(app: ModuleType) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(parallel=True, cache=True)`` for a bound that calls ``app``'s kernels,
    cached in a folder named by a digest of ``app``'s source file.

    Why: numba keys a cache entry on the file of the function it compiles, not on the files
    of the kernels that function calls, so a bound cached as usual would keep running the app's
    kernel as it was first compiled, however the app changed since; compiled afresh instead,
    each bound costs every process that uses it 12 s. The folder is numba's own cache folder
    (``NUMBA_CACHE_DIR``, else this file's ``__pycache__``) plus ``bounds-DIGEST``; numba
    reads the cache folder when a function is decorated, so it is set for that moment only.
    Where that folder cannot be written, the bound is not cached: numba would fall back to a
    folder keyed on this file alone.
    """
    digest = hashlib.sha256(Path(app.__file__ or "").read_bytes()).hexdigest()[:16]
    base = numba.config.CACHE_DIR or str(Path(__file__).resolve().parent / "__pycache__")
    folder = os.path.join(base, f"bounds-{digest}")
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return numba.njit(parallel=True)  # type: ignore[no-any-return]

    def jit(fn: Callable[..., Any]) -> Any:
        saved = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = folder
        try:
            return numba.njit(parallel=True, cache=True)(fn)
        finally:
            numba.config.CACHE_DIR = saved
    return jit


@njit_keyed_on(lr_app)
def lr_gradient(X: np.ndarray, y: np.ndarray, w: np.ndarray, chunks: int) -> np.ndarray:
    """The app's own gradient kernel over ``chunks`` row blocks in parallel, summed:
    [gradient of the log-loss (d + 1), log-loss, rows]: the same arithmetic canary runs."""
    n, d = X.shape
    part = np.zeros((chunks, d + 3))
    step = (n + chunks - 1) // chunks
    for c in prange(chunks):
        lo, hi = min(n, c * step), min(n, (c + 1) * step)
        part[c] = lr_app.gradient_kernel(X[lo:hi], y[lo:hi], w)
    return part.sum(axis=0)


@njit_keyed_on(km_app)
def km_step(X: np.ndarray, labels: np.ndarray, centers: np.ndarray, chunks: int) -> np.ndarray:
    """The app's own assignment kernel over ``chunks`` row blocks in parallel (labels updated
    in place); returns the summed ``partial`` (per-centre sums k*d, counts k, ...)."""
    n = X.shape[0]
    k, d = centers.shape
    outs = np.zeros((chunks, k * d + k + 2 + k * (3 + d)))
    step = (n + chunks - 1) // chunks
    for c in prange(chunks):
        lo, hi = min(n, c * step), min(n, (c + 1) * step)
        meta = np.array([0.0, float(lo)])
        new, out = km_app.assign_kernel(X[lo:hi], meta, labels[lo:hi], centers)
        labels[lo:hi] = new
        outs[c] = out
    return outs.sum(axis=0)


@numba.njit(parallel=True, cache=True)
def pr_step(indptr: np.ndarray, src: np.ndarray, contrib: np.ndarray, out: np.ndarray,
            base: float, damping: float) -> None:
    """Pull PageRank over in-edges in CSR (by destination): out[v] = base + d * sum contrib[u]."""
    for v in prange(indptr.shape[0] - 1):
        s = 0.0
        for e in range(indptr[v], indptr[v + 1]):
            s += contrib[src[e]]
        out[v] = base + damping * s


def timed_iterations(step: Callable[[], Any], iters: int) -> float:
    """Mean seconds of ``step`` over ``iters`` calls, first and last excluded."""
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    return spark_jvm.inner_mean(ts)


def paired_ratio(num: list[float | None], den: list[float | None]) -> float | None:
    """Median over rounds of ``num[r] / den[r]``, rounds where either is missing skipped (None
    if none is left), to 3 decimals. Round ``r``'s two figures were taken back to back, so a
    burst of load on this shared machine slows both; the fastest of each side instead pairs
    moments minutes apart, and one quiet moment of the bound (30% faster, seen) sets it."""
    ratios = [a / b for a, b in zip(num, den) if a and b]
    return round(statistics.median(ratios), 3) if ratios else None


def by_threads(step: Callable[[], Any], iters: int, threads: int) -> dict[str, Any]:
    """Time ``step`` on ``threads`` numba threads and on one; the bound is the faster.

    On a shared machine a parallel region waits for its slowest thread, and a thread that lost
    its core waits a scheduler time slice: one thread can then beat two. Both are reported."""
    out: dict[str, Any] = {}
    for t in dict.fromkeys((threads, 1)):
        numba.set_num_threads(t)
        step()
        out[f"seconds_{t}_threads"] = timed_iterations(step, iters)
    numba.set_num_threads(threads)
    out["seconds"] = min(v for k, v in out.items() if k.startswith("seconds_"))
    return out


def bound_lr(n: int, d: int, threads: int, iters: int) -> dict[str, Any]:
    X, y = lr_data(n, d)
    w = np.zeros(d + 1)
    chunks = 4 * threads
    lr_gradient(X, y, w, chunks)

    def step() -> None:
        nonlocal w
        g = lr_gradient(X, y, w, chunks)
        w = w - 0.1 * g[:d + 1] / n

    return {**by_threads(step, iters, threads), "data_bytes": X.nbytes + y.nbytes}


def bound_kmeans(n: int, d: int, k: int, threads: int, iters: int, path: str) -> dict[str, Any]:
    X = np.load(path)
    centers = X[:k].copy()
    labels = np.full(n, -1, np.int64)
    chunks = 4 * threads
    km_step(X, labels, centers, chunks)

    def step() -> None:
        nonlocal centers
        out = km_step(X, labels, centers, chunks)
        sums, counts = out[:k * d].reshape(k, d), out[k * d:k * d + k]
        nz = counts > 0
        centers = centers.copy()
        centers[nz] = sums[nz] / counts[nz, None]

    return {**by_threads(step, iters, threads), "data_bytes": X.nbytes}


def bound_pagerank(v: int, e: int, threads: int, iters: int) -> dict[str, Any]:
    indptr, src, outdeg = pagerank_csr(v, e)
    damping = 0.85
    rank = np.full(v, 1.0 / v)
    out = np.empty(v)
    dangling = outdeg == 0
    inv = np.where(dangling, 0.0, 1.0 / np.maximum(outdeg, 1.0))

    def step() -> None:
        nonlocal rank, out
        contrib = rank * inv
        base = (1.0 - damping) / v + damping * rank[dangling].sum() / v
        pr_step(indptr, src, contrib, out, base, damping)
        rank, out = out, rank

    step()
    res: dict[str, Any] = {**by_threads(step, iters, threads),
                           "data_bytes": src.nbytes + indptr.nbytes}
    res["numba_seconds"] = res["seconds"]
    try:
        import scipy.sparse as sp

        m = sp.csr_matrix((np.ones(len(src)), src, indptr), shape=(v, v))
        res["scipy_csr_seconds"] = timed_iterations(lambda: m @ (rank * inv), iters)
        res["seconds"] = min(res["seconds"], res["scipy_csr_seconds"])  # the faster is the bound
    except ImportError:  # pragma: no cover - scipy is a test dependency
        pass
    return res


# ------------------------------------------------------------------ canary runs
def run_canary(app: str, data: list[str], workers: int, iters: int, extra: list[str],
               timeout: int, trace: str | None,
               env_extra: dict[str, str] | None = None, root: Path = ROOT,
               mpiexec_flags: list[str] | None = None) -> dict[str, Any]:
    """One canary run; ``data`` is ``["--generate", "N,D"]`` or ``["--input", PATH, ...]``;
    ``env_extra`` is added to the environment of the ranks (e.g. ``CANARY_SPIN_US``); ``root``
    is the checkout whose canary and app run (``benchmarks/ab.py`` compares two);
    ``mpiexec_flags`` go to mpiexec before the program (e.g. ``["-bind-to", "core"]``)."""
    from canary.cli import find_mpiexec, mpiexec_env
    from canary.mpich_shm import remove_orphans

    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        # The iteration times come from the workers' loop tests. Without a trace asked for,
        # only those are recorded (CANARY_TRACE_LEVEL=loop), so the run is timed on the
        # untraced path; a full trace costs every task its record.
        level = "full" if trace else "loop"
        trace = trace or os.path.join(tmp, "trace.json")
        cmd = [find_mpiexec(), "-n", str(workers + 1), *(mpiexec_flags or []),
               sys.executable, "-m", "mpi4py",
               str(root / "benchmarks" / "peak_rss.py"), tmp,
               str(root / "apps" / f"{app}.py"), *data, "--max-iter", str(iters),
               "--print-every", "0", "--metrics", metrics, *extra]
        env = mpiexec_env(timeout, str(root))
        env["CANARY_TRACE"] = trace
        env["CANARY_TRACE_LEVEL"] = level
        env.update(env_extra or {})
        t0, started = time.perf_counter(), time.time()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 30)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            # a rank that failed first may have had the others killed before MPI let go of the
            # shared memory: what nobody maps any more goes, as canary run does
            remove_orphans(started, wait=2.0)
            raise RuntimeError(f"{app} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        rows = [json.loads(line) for line in open(metrics)]
        gaps = iteration_seconds(load_events(trace))
        mem = []
        for r in range(1, workers + 1):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                mem.append(json.load(f))
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"seconds": spark_jvm.inner_mean(gaps) if gaps else None, "iterations": len(rows),
            "wall_s": round(wall, 3), "summary": summary,
            "peak_rss_mb": max(m["peak_rss_mb"] for m in mem),
            "peak_rss_mb_by_worker": [m["peak_rss_mb"] for m in mem],
            "end_rss_mb_by_worker": [m.get("end_rss_mb") for m in mem],
            "partition_mb_by_worker": [m.get("partition_mb") for m in mem]}


# ------------------------------------------------------------------ peers
def checked(name: str, seconds: float, got: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    """A peer's result with its answer checked against numpy's: ``correct`` when the largest
    difference is within ``spark_jvm.RTOL`` of the largest magnitude (``max_rel_err``), as for
    the JVM peers. A peer that times something else than the app must not pass unnoticed."""
    err = spark_jvm.rel_err(got, want)
    return {"peer": name, "seconds": seconds, "correct": bool(err <= spark_jvm.RTOL),
            "max_rel_err": err}


def peer_dask_lr(n: int, d: int, threads: int, iters: int, distributed: bool) -> dict[str, Any]:
    name = "dask_distributed" if distributed else "dask_threaded"
    try:
        import dask
        import dask.array as da
    except ImportError:
        return {"peer": name, "skipped": "dask not installed (pip install -e .[compare])"}
    X, y = lr_data(n, d)
    chunk = (n + 4 * threads - 1) // (4 * threads)

    def run(get_result: Callable[[Any], Any]) -> tuple[float, np.ndarray]:
        Xd = da.from_array(X, chunks=(chunk, d)).persist()
        yd = da.from_array(y, chunks=chunk).persist()
        w = np.zeros(d)

        def step() -> None:
            nonlocal w
            r = 1.0 / (1.0 + da.exp(-(Xd @ w))) - yd
            g = get_result(Xd.T @ r)
            w = w - 0.1 * g / n

        return timed_iterations(step, iters), w

    if not distributed:
        with dask.config.set(scheduler="threads", num_workers=threads):
            secs, w = run(lambda a: a.compute())
        return checked(name, secs, w, spark_jvm.lr_reference(X, y, iters))
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        return {"peer": name, "skipped": "dask.distributed not installed"}
    import logging

    logging.getLogger("distributed").setLevel(logging.ERROR)
    with LocalCluster(n_workers=threads, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        secs, w = run(lambda a: client.compute(a).result())
    return checked(name, secs, w, spark_jvm.lr_reference(X, y, iters))


def peer_spark_lr(n: int, d: int, threads: int, iters: int, functional: bool) -> dict[str, Any]:
    """PySpark ``local[threads]`` logistic regression over ``lr_data(n, d)``'s rows ``[x | y]``
    sent from the driver: ``mapPartitions`` over numpy blocks, or (with ``functional``) per-row
    ``map`` / ``reduce``. The driver sends the blocks: Spark tasks making their own would save
    set-up, but the row compares iterations, and iterations over such blocks ran slower, which
    would flatter canary."""
    name = "pyspark_functional" if functional else "pyspark_mappartitions"
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return {"peer": name, "skipped": "pyspark not installed (pip install -e .[compare])"}
    sc = _spark(threads)
    try:
        parts = 4 * threads
        X, y = lr_data(n, d)
        data = np.hstack([X, y[:, None]])
        if functional:
            rdd = sc.parallelize([row for row in data], parts).cache()
        else:
            rdd = sc.parallelize(np.array_split(data, parts), parts).cache()
        rdd.count()
        del data
        w = np.zeros(d)

        def grad_part(it: Any) -> Any:
            acc = np.zeros(d)
            for blk in it:
                r = 1.0 / (1.0 + np.exp(-(blk[:, :d] @ w))) - blk[:, d]
                acc += blk[:, :d].T @ r
            yield acc

        def step() -> None:
            nonlocal w
            if functional:
                ww = w
                g = rdd.map(lambda row: (1.0 / (1.0 + np.exp(-(row[:d] @ ww))) - row[d]) * row[:d]
                            ).reduce(lambda a, b: a + b)
            else:
                g = rdd.mapPartitions(grad_part).reduce(lambda a, b: a + b)
            w = w - 0.1 * g / n

        secs = timed_iterations(step, iters)
    finally:
        sc.stop()
    return checked(name, secs, w, spark_jvm.lr_reference(X, y, iters))


def _km_block_stats(b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Per-centre [sums (k*d), counts (k)] of a block's nearest-centre assignment (numpy)."""
    k, d = c.shape
    d2 = (b * b).sum(1)[:, None] - 2.0 * (b @ c.T) + (c * c).sum(1)[None, :]
    lab = np.argmin(d2, axis=1)
    counts = np.bincount(lab, minlength=k).astype(np.float64)
    sums = np.zeros((k, d))
    np.add.at(sums, lab, b)
    return np.concatenate([sums.ravel(), counts])


def _km_update(stats: np.ndarray, c: np.ndarray) -> np.ndarray:
    k, d = c.shape
    sums, counts = stats[:k * d].reshape(k, d), stats[k * d:]
    nz = counts > 0
    c = c.copy()
    c[nz] = sums[nz] / counts[nz, None]
    return c


def peer_dask_kmeans(path: str, k: int, threads: int, iters: int,
                     distributed: bool) -> dict[str, Any]:
    name = "dask_distributed" if distributed else "dask_threaded"
    try:
        import dask
        import dask.array as da
    except ImportError:
        return {"peer": name, "skipped": "dask not installed (pip install -e .[compare])"}
    X = np.load(path)
    n, d = X.shape
    chunk = (n + 4 * threads - 1) // (4 * threads)

    def run(get: Callable[[Any], Any]) -> dict[str, Any]:
        Xd = da.from_array(X, chunks=(chunk, d)).persist()
        c = X[:k].copy()

        def step() -> None:
            nonlocal c
            cc = c
            parts = Xd.map_blocks(lambda b: _km_block_stats(b, cc)[None, :],
                                  chunks=((1,) * Xd.numblocks[0], (k * d + k,)), dtype=float)
            c = _km_update(get(parts.sum(axis=0)), c)

        secs = timed_iterations(step, iters)
        return checked(name, secs, c, spark_jvm.kmeans_reference(X, k, iters))

    if not distributed:
        with dask.config.set(scheduler="threads", num_workers=threads):
            return run(lambda a: a.compute())
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=threads, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        return run(lambda a: client.compute(a).result())


def _pr_block(src: np.ndarray, dst: np.ndarray, contrib: np.ndarray, v: int) -> np.ndarray:
    return np.bincount(dst, weights=contrib[src], minlength=v)


def peer_dask_pagerank(v: int, e: int, threads: int, iters: int,
                       distributed: bool) -> dict[str, Any]:
    """PageRank as a Dask user writes it without a graph library: the edge list in persisted
    blocks, one ``bincount`` of contributions per block (dask.delayed), summed; the same
    arithmetic as the bound (dangling mass spread uniformly). The ranks after the run are
    checked against numpy on the whole edge list (:func:`checked`)."""
    name = "dask_distributed" if distributed else "dask_threaded"
    try:
        import dask
        import dask.array as da
    except ImportError:
        return {"peer": name, "skipped": "dask not installed (pip install -e .[compare])"}
    edges = rmat(v, e)
    src, dst = np.ascontiguousarray(edges[:, 0]), np.ascontiguousarray(edges[:, 1])
    outdeg = np.bincount(src, minlength=v).astype(np.float64)
    dangling = outdeg == 0
    inv = np.where(dangling, 0.0, 1.0 / np.maximum(outdeg, 1.0))
    damping = 0.85
    chunk = (len(src) + 4 * threads - 1) // (4 * threads)

    def update(rank: np.ndarray, total: np.ndarray) -> np.ndarray:
        base = (1.0 - damping) / v + damping * rank[dangling].sum() / v
        return base + damping * total

    def run(get: Callable[[Any], Any]) -> tuple[float, np.ndarray, int]:
        # the persisted arrays must outlive the loop: on a distributed client their blocks are
        # released (FutureCancelledError) as soon as the collections are garbage
        kept = [da.from_array(a, chunks=chunk).persist() for a in (src, dst)]
        blocks = list(zip(kept[0].to_delayed(), kept[1].to_delayed()))
        rank = np.full(v, 1.0 / v)
        steps = 0

        def step() -> None:
            nonlocal rank, steps
            contrib = dask.delayed(rank * inv)  # one graph key, not a copy per block
            parts = [dask.delayed(_pr_block)(s, d, contrib, v) for s, d in blocks]
            rank = update(rank, get(dask.delayed(sum)(parts)))
            steps += 1

        return timed_iterations(step, iters), rank, steps

    if not distributed:
        with dask.config.set(scheduler="threads", num_workers=threads):
            secs, rank, steps = run(lambda a: a.compute())
    else:
        import logging

        from dask.distributed import Client, LocalCluster

        logging.getLogger("distributed").setLevel(logging.ERROR)
        with LocalCluster(n_workers=threads, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            secs, rank, steps = run(lambda a: client.compute(a).result())
    want = np.full(v, 1.0 / v)
    for _ in range(steps):
        want = update(want, np.bincount(dst, weights=(want * inv)[src], minlength=v))
    return checked(name, secs, rank, want)


def _spark(threads: int, jar: str | None = None) -> Any:
    """A ``local[threads]`` SparkContext with 4 GB of driver memory; the caller stops it.

    ``jar`` (default: the JVM peers' jar, ``benchmarks/spark_jvm.py``, when it can be built)
    goes on the driver class path. pyspark launches its JVM once per process, with the conf of
    the first context, so every context carries the jar: a JVM peer run after a PySpark peer
    still finds its classes through py4j (``sc._jsc.addJar`` would not make them visible)."""
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster(f"local[{threads}]").setAppName("canary-apps")
            .set("spark.ui.enabled", "false").set("spark.driver.memory", "4g")
            .set("spark.ui.showConsoleProgress", "false"))
    jar = jar or (str(p) if (p := spark_jvm.jar_or_none()) else None)
    if jar:
        conf.set("spark.driver.extraClassPath", jar)
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    return sc


def peer_spark_kmeans(path: str, k: int, threads: int, iters: int) -> dict[str, Any]:
    name = "pyspark_mappartitions"
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return {"peer": name, "skipped": "pyspark not installed (pip install -e .[compare])"}
    X = np.load(path)
    sc = _spark(threads)
    try:
        rdd = sc.parallelize(np.array_split(X, 4 * threads), 4 * threads).cache()
        rdd.count()
        c = X[:k].copy()

        def step() -> None:
            nonlocal c
            cc = c
            stats = rdd.map(lambda b: _km_block_stats(b, cc)).reduce(lambda a, b: a + b)
            c = _km_update(stats, c)

        secs = timed_iterations(step, iters)
    finally:
        sc.stop()
    return checked(name, secs, c, spark_jvm.kmeans_reference(np.asarray(X), k, iters))


def peer_spark_pagerank(v: int, e: int, threads: int, iters: int) -> dict[str, Any]:
    """The classic PySpark RDD PageRank: links.join(ranks) -> contributions -> reduceByKey."""
    name = "pyspark_rdd_join"
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return {"peer": name, "skipped": "pyspark not installed (pip install -e .[compare])"}
    edges = rmat(v, e)
    order = np.argsort(edges[:, 0], kind="stable")
    srcs, dsts = edges[order, 0], edges[order, 1]
    cuts = np.flatnonzero(np.diff(srcs)) + 1
    adj = [(int(s[0]), d.tolist()) for s, d in zip(np.split(srcs, cuts), np.split(dsts, cuts))]
    sc = _spark(threads)
    try:
        parts = 4 * threads
        links = sc.parallelize(adj, parts).partitionBy(parts).cache()
        ranks = links.mapValues(lambda _: 1.0 / v)
        links.count()

        def contribs(item: Any) -> Any:
            _, (nbrs, rank) = item
            share = rank / len(nbrs)
            return [(dst, share) for dst in nbrs]

        def step() -> None:
            nonlocal ranks
            new = (links.join(ranks).flatMap(contribs).reduceByKey(lambda a, b: a + b, parts)
                   .mapValues(lambda r: 0.15 / v + 0.85 * r)).cache()
            new.count()
            ranks = new

        secs = timed_iterations(step, iters)
        got = np.full(v, np.nan)  # a vertex that received no share has no rank
        for vertex, r in ranks.collect():
            got[vertex] = r
    finally:
        sc.stop()
    return checked(name, secs, got, spark_jvm.pagerank_join_reference(v, edges, iters))


# ------------------------------------------------------------------ driver
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (for tests)")
    ap.add_argument("--apps", default="logistic_regression,kmeans,pagerank")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--iters", type=int, default=None, help="iterations per run (default 20)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--full-peers", action="store_true",
                    help="run the slow peers (PySpark functional, the PageRank peers) at "
                         "every size")
    ap.add_argument("--baselines", type=int, default=3,
                    help="runs at the tiny size whose median peak memory is taken as the "
                         "runtime's own footprint per worker (default 3)")
    ap.add_argument("--trace", default=None, help="Chrome trace of the canary runs (JSON)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--repeats", type=int, default=None,
                    help="canary runs and bound timings per size, interleaved (default 2, 1 "
                         "with --quick); the fastest of each is compared (the machine's load "
                         "comes in bursts), the largest peak memory reported")
    args = ap.parse_args(argv)
    if args.baselines < 1:
        ap.error(f"--baselines {args.baselines}: at least one run is needed")
    sizes = QUICK_SIZES if args.quick else SIZES
    # 20: single iterations on this VM move by up to 40%, and a 12-iteration mean still did
    iters = args.iters or (5 if args.quick else 20)
    args.repeats = args.repeats or (1 if args.quick else 2)
    W = args.workers
    started = time.perf_counter()
    print(json.dumps({"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                  "numba": numba.__version__, "workers": W,
                                  "date": time.strftime("%Y-%m-%d")}}), flush=True)
    results: list[dict[str, Any]] = []
    pending: list[tuple[dict[str, Any], list[tuple[str, Callable[[], dict[str, Any]]]]]] = []
    tmpdir = tempfile.TemporaryDirectory()
    for app in args.apps.split(","):
        # The runtime's own footprint per worker: the same app at a tiny size, the median of three
        # runs (--baselines). On a cold numba cache the first one compiles, and compiling takes
        # memory the timed run, which finds the cache warm, does not (that would shrink the
        # ratios); warm runs still differ by a few MB, a large share of what a small PageRank
        # worker holds, so the median and not the smallest. As many iterations as the timed
        # runs: both are traced (the iteration times come from the trace), and a worker's trace
        # grows with its events (fully traced, one per task and message; loop-level, one an
        # iteration).
        bases = [run_canary(app, _data(app, QUICK_SIZES[app][0], tmpdir.name), W, iters,
                            _extra(app), args.timeout, None) for _ in range(args.baselines)]
        base = statistics.median(b["peak_rss_mb"] for b in bases)
        for size in sizes[app]:
            gen = ",".join(str(v) for v in size)
            row: dict[str, Any] = {"app": app, "size": gen, "workers": W}
            t_size = time.perf_counter()
            data = _data(app, size, tmpdir.name)
            trace = f"{args.trace}.{app}.{gen.replace(',', 'x')}.json" if args.trace else None
            bounds, gots = [], []
            for r in range(args.repeats):  # interleaved, so that a burst of load hits both
                if app == "logistic_regression":
                    bounds.append(bound_lr(size[0], size[1], W, iters))
                elif app == "kmeans":
                    bounds.append(bound_kmeans(size[0], size[1], size[2], W, iters, data[1]))
                else:
                    bounds.append(bound_pagerank(size[0], size[1], W, iters))
                gots.append(run_canary(app, data, W, iters, _extra(app), args.timeout,
                                       trace if r == 0 else None))
            bound = min(bounds, key=lambda b: b["seconds"])
            timed = [g for g in gots if g["seconds"]]
            got = min(timed, key=lambda g: g["seconds"]) if timed else gots[0]
            mem = max(gots, key=lambda g: g["peak_rss_mb"] or 0.0)  # memory: the worst run
            row["numba_s_runs"] = [b["seconds"] for b in bounds]
            row["canary_s_runs"] = [g["seconds"] for g in gots]
            row["numba_s"] = bound["seconds"]
            row["numba_s_by_threads"] = {k.split("_")[1]: v for k, v in bound.items()
                                         if k.startswith("seconds_")}
            if "scipy_csr_seconds" in bound:
                row["scipy_csr_s"] = bound["scipy_csr_seconds"]
            row["canary_s"] = got["seconds"]
            row["canary_iterations"] = got["iterations"]
            row["canary_vs_numba"] = (round(got["seconds"] / bound["seconds"], 3)
                                      if got["seconds"] else None)
            row["canary_vs_numba_paired"] = paired_ratio(row["canary_s_runs"],
                                                         row["numba_s_runs"])
            row["peak_rss_mb"] = mem["peak_rss_mb"]
            row["peak_rss_mb_by_worker"] = mem["peak_rss_mb_by_worker"]
            row["baseline_rss_mb"] = base
            row["baseline_iterations"] = [b["iterations"] for b in bases]
            row["end_rss_mb_by_worker"] = mem["end_rss_mb_by_worker"]
            row["partition_mb_by_worker"] = mem["partition_mb_by_worker"]
            row["data_mb_per_worker"] = round(bound["data_bytes"] / W / 2**20, 1)
            if mem["peak_rss_mb"] and base:
                row["memory_vs_partitions"] = round(
                    (mem["peak_rss_mb"] - base) / max(row["data_mb_per_worker"], 1e-9), 2)
                # Each worker's peak above the runtime's footprint over the bytes of the arrays
                # that worker holds in its partitions at the end (benchmarks/peak_rss.py); the
                # worst worker counts. ``memory_vs_partitions`` divides by the bound's data / W.
                ratios = [(pk - base) / held for pk, held in
                          zip(mem["peak_rss_mb_by_worker"], mem["partition_mb_by_worker"]) if held]
                if ratios:
                    row["memory_vs_held"] = round(max(ratios), 2)
            row["canary_summary"] = {k: got["summary"].get(k) for k in
                                     ("iterations", "objective", "inertia", "rank_sum",
                                      "accuracy", "controller_messages") if k in got["summary"]}
            row["peers"] = {}
            first = size == sizes[app][0]
            piters = max(3, iters // 3)
            runs: list[tuple[str, Callable[[], dict[str, Any]]]] = []
            if app == "logistic_regression":
                n, d = size[0], size[1]
                runs = [("dask_threaded", partial(peer_dask_lr, n, d, W, piters, False)),
                        ("dask_distributed", partial(peer_dask_lr, n, d, W, piters, True)),
                        ("pyspark_mappartitions", partial(peer_spark_lr, n, d, W, piters, False))]
                if first or args.full_peers:
                    runs.append(("pyspark_functional",
                                 partial(peer_spark_lr, n, d, W, piters, True)))
                runs.append(("spark_jvm_mappartitions",
                             partial(spark_jvm.peer_lr, n, d, W, iters, _spark)))
            elif app == "kmeans":
                kpath, kk = data[1], size[2]
                runs = [("dask_threaded", partial(peer_dask_kmeans, kpath, kk, W, piters, False)),
                        ("dask_distributed", partial(peer_dask_kmeans, kpath, kk, W, piters, True)),
                        ("pyspark_mappartitions", partial(peer_spark_kmeans, kpath, kk, W, piters)),
                        ("spark_jvm_mappartitions",
                         partial(spark_jvm.peer_kmeans, kpath, kk, W, iters, _spark))]
            elif first or args.full_peers:
                v, e = size[0], size[1]
                runs = [("dask_threaded", partial(peer_dask_pagerank, v, e, W, piters, False)),
                        ("dask_distributed", partial(peer_dask_pagerank, v, e, W, piters, True)),
                        ("pyspark_rdd_join", partial(peer_spark_pagerank, v, e, W, piters)),
                        ("spark_jvm_rdd_join",
                         partial(spark_jvm.peer_pagerank_join, v, e, W, piters, _spark)),
                        ("spark_graphx", partial(spark_jvm.peer_graphx, v, e, W, piters, _spark))]
            row["measure_wall_s"] = round(time.perf_counter() - t_size, 1)  # canary + bound
            pending.append((row, [] if args.no_peers else runs))
            print(f"apps: {app} {gen}: canary {row['canary_s']} s, bound {row['numba_s']} s",
                  file=sys.stderr, flush=True)
    # The peers run after every canary run and bound: pyspark's JVM outlives its context and
    # slows the canary runs and bounds measured beside it.
    for row, runs in pending:
        for peer, run in runs:
            t0 = time.perf_counter()
            try:
                p = run()
            except Exception as exc:  # noqa: BLE001 - a broken peer must not sink the run
                p = {"peer": peer, "skipped": f"failed: {exc!r}"[:300]}
            p["wall_s"] = round(time.perf_counter() - t0, 1)  # setup included: what it costs
            print(json.dumps({"app": row["app"], "size": row["size"], **p}), flush=True)
            if "correct" in p:  # a peer with a wrong answer stays visible in the row
                row.setdefault("peers_correct", {})[p["peer"]] = p["correct"]
                if not p["correct"]:
                    print(f"apps: {row['app']} {row['size']}: {p['peer']}'s answer differs "
                          f"from numpy's (max_rel_err {p.get('max_rel_err')}); its speedup "
                          "compares different computations", file=sys.stderr, flush=True)
            if "seconds" in p and row["canary_s"]:
                row["peers"][p["peer"]] = p["seconds"]
                row[f"speedup_vs_{p['peer']}"] = round(p["seconds"] / row["canary_s"], 2)
        results.append(row)
        print(json.dumps(row), flush=True)
    summary = {"summary": "apps", "workers": W,
               "wall_s": round(time.perf_counter() - started, 1),
               "canary_vs_numba": {f"{r['app']}@{r['size']}": r["canary_vs_numba"] for r in results},
               "canary_vs_numba_paired": {f"{r['app']}@{r['size']}": r["canary_vs_numba_paired"]
                                          for r in results},
               "iteration_ms": {f"{r['app']}@{r['size']}": round(r["canary_s"] * 1e3, 3)
                                for r in results if r["canary_s"]},
               "speedups": {f"{r['app']}@{r['size']}": {k[11:]: v for k, v in r.items()
                                                       if k.startswith("speedup_vs_")}
                            for r in results},
               # speedups over peers whose answer was wrong are kept, but named here
               "peers_wrong": [f"{r['app']}@{r['size']}:{peer}" for r in results
                               for peer, ok in r.get("peers_correct", {}).items() if not ok]}
    print(json.dumps(summary), flush=True)
    return 0


def _data(app: str, size: tuple[int, ...], tmp: str) -> list[str]:
    """The app's data flags. k-means reads uniform random points from a .npy file: generated
    blobs converge in 2-3 Lloyd steps, too few to time, while uniform data keeps it going."""
    if app != "kmeans":
        return ["--generate", ",".join(str(v) for v in size)]
    n, d, k = size
    path = os.path.join(tmp, f"kmeans_{n}_{d}.npy")
    if not os.path.exists(path):
        np.save(path, np.random.default_rng(0).random((n, d)))
    return ["--input", path, "--k", str(k)]


def _extra(app: str) -> list[str]:
    """Flags that keep every app iterating (no early convergence) for a timing run."""
    if app == "kmeans":
        return ["--tol", "0"]  # then only "no label changed" stops it
    return ["--tol", "1e-300"]


if __name__ == "__main__":
    from canary.script import end_script

    end_script(main())
