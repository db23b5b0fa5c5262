"""Spark's JVM paths as peers of ``benchmarks/apps.py``, written in Java and driven via py4j.

The Java sources under ``benchmarks/jvm/canary/bench`` are compiled with ``javac`` against the
jars pyspark ships (``javac -cp <pyspark>/jars/* --release 17``) and zipped into a jar cached
under ``$XDG_CACHE_HOME/canary/jvm/<hash>/canary-bench.jar`` (``~/.cache`` by default), the hash
covering the sources, the pyspark version and the ``javac`` version, so an edit or an upgrade
rebuilds it and nothing else does.

The jar must be on the class path of the JVM that pyspark starts: py4j resolves
``sc._jvm.canary.bench.*`` with that JVM's class loaders, and ``sc._jsc.addJar`` only reaches the
executors' loader. pyspark starts that JVM once per Python process, with the ``SparkConf`` of
the first ``SparkContext`` (passed to ``spark-submit`` as ``--conf``), so ``apps._spark`` puts the
jar in ``spark.driver.extraClassPath`` of every context it makes; a peer whose JVM was started
without it reports itself skipped rather than failing.

Each peer writes the benchmark's data once with numpy to a raw little-endian file (k-means reads
the ``.npy`` file the other k-means peers read, past its header); every Spark partition reads
only its own byte range, so no row crosses py4j. The JVM times each iteration with
``System.nanoTime`` and returns the times and the answer as one ``byte[]`` of float64. Here the
per-iteration time is the mean with the first and last iteration excluded, as
``apps.timed_iterations`` does, and the answer is checked against a numpy computation of the
same iterations from the same start (``correct``, ``max_rel_err``: the largest absolute
difference over the largest reference magnitude, at most ``RTOL``).

When pyspark, ``java`` or ``javac`` is missing a peer returns ``{"peer": name, "skipped": why}``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import statistics
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.datasets import lr_data, rmat

JVM_DIR = Path(__file__).resolve().parent / "jvm"
JAR_NAME = "canary-bench.jar"
# Different summation orders (per partition, then across partitions) and Java's Math.exp
# against numpy's move the answers by ~1e-13 relative; a wrong formula moves them by far more.
RTOL = 1e-9

SparkFactory = Callable[[int, str | None], Any]
"""``apps._spark``: (threads, jar) -> a started SparkContext whose JVM has the jar."""


# ------------------------------------------------------------------ building the jar
def sources(root: Path | None = None) -> list[Path]:
    """The Java sources under ``root`` (default :data:`JVM_DIR`), sorted."""
    return sorted((root or JVM_DIR).rglob("*.java"))


def source_hash(paths: Iterable[Path], root: Path | None = None, extra: str = "") -> str:
    """Hex digest (16 characters) of the sources' paths relative to ``root`` (default
    :data:`JVM_DIR`), their bytes, and ``extra`` (the toolchain versions): equal inputs give the
    same key, any edit a new one."""
    h = hashlib.sha256(extra.encode())
    for p in sorted(paths):
        h.update(b"\0" + p.relative_to(root or JVM_DIR).as_posix().encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def spark_jars_dir() -> Path | None:
    """The folder of Spark's jars that pyspark runs with (``$SPARK_HOME/jars`` when set, else
    the pyspark package's own ``jars``), or None without pyspark."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    jars = Path(next(iter(spec.submodule_search_locations))) / "jars"
    return jars if jars.is_dir() else None


def unavailable() -> str | None:
    """Why the JVM peers cannot run here (every missing piece, with what to install), or None.

    Looks only at what is installed (``shutil.which``, ``importlib``); starts nothing."""
    why = []
    if importlib.util.find_spec("pyspark") is None:
        why.append("pyspark not installed (pip install -e .[compare])")
    elif spark_jars_dir() is None:
        why.append("pyspark has no jars folder (set SPARK_HOME to a Spark distribution)")
    if shutil.which("java") is None:
        why.append("java not found (PySpark needs Java 17)")
    if shutil.which("javac") is None:
        why.append("javac not found (install a JDK 17, e.g. apt-get install openjdk-17-jdk-headless)")
    return "; ".join(why) or None


def _toolchain() -> str:
    """pyspark and javac versions: a jar built against other Spark jars is rebuilt."""
    import pyspark

    javac = subprocess.run(["javac", "-version"], capture_output=True, text=True, timeout=60)
    return f"pyspark {pyspark.__version__}; {(javac.stdout + javac.stderr).strip()}"


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/canary/jvm`` (``~/.cache/canary/jvm`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "canary" / "jvm"


def build_jar(cache: Path | None = None) -> Path:
    """The benchmark jar, compiled and zipped on first use for these sources and toolchain.

    Raises RuntimeError when the JVM peers cannot run (:func:`unavailable`) or javac fails
    (its output in the message). Concurrent builders each build in a private folder and
    rename, so a reader never sees a half-written jar."""
    why = unavailable()
    if why:
        raise RuntimeError(why)
    srcs = sources()
    if not srcs:
        raise RuntimeError(f"no Java sources under {JVM_DIR}")
    out = (cache or cache_root()) / source_hash(srcs, extra=_toolchain())
    jar = out / JAR_NAME
    if jar.is_file():
        return jar
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        classes = Path(tmp) / "classes"
        cmd = ["javac", "-nowarn", "--release", "17", "-encoding", "UTF-8",
               "-cp", str(spark_jars_dir()) + os.sep + "*", "-d", str(classes),
               *map(str, srcs)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"javac failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        part = Path(tmp) / JAR_NAME
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            # A jar is a zip; a manifest is optional for a class-path entry but kept standard.
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        os.replace(part, jar)
    return jar


_JAR: list[Path | None] = []


def jar_or_none() -> Path | None:
    """:func:`build_jar`, or None when it cannot be built (the JVM peers then say why); built at
    most once per process. For ``apps._spark``, which must not fail a PySpark peer over it."""
    if not _JAR:
        try:
            _JAR.append(build_jar())
        except (RuntimeError, OSError, subprocess.SubprocessError):
            _JAR.append(None)
    return _JAR[0]


def visible(sc: Any) -> bool:
    """Whether the jar's classes resolve through py4j in ``sc``'s JVM."""
    try:
        return str(sc._jvm.canary.bench.Io.version()).startswith("canary.bench")
    except Exception:  # noqa: BLE001 - py4j raises Py4JError (or a subclass) for a missing class
        return False


def _peer(name: str, threads: int, spark: SparkFactory,
          body: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """``{"peer": name, **body(sc)}`` in a SparkContext with the jar, stopped afterwards, or
    ``{"peer": name, "skipped": why}``. A javac error raises (the driver reports it)."""
    why = unavailable()
    if why:
        return {"peer": name, "skipped": why}
    jar = build_jar()
    sc = spark(threads, str(jar))
    try:
        if not visible(sc):
            return {"peer": name, "skipped": "the Spark JVM of this process was started without "
                    f"{jar} on its class path (it is fixed when the first SparkContext starts)"}
        return {"peer": name, **body(sc)}
    finally:
        sc.stop()


# ------------------------------------------------------------------ results and references
def inner_mean(seconds: Sequence[float]) -> float:
    """Mean of per-iteration seconds, first and last excluded when there are more than two
    (the paper's rule; every per-iteration figure of ``benchmarks/apps.py`` uses this)."""
    inner = list(seconds[1:-1]) if len(seconds) > 2 else list(seconds)
    return statistics.mean(inner)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """Largest absolute difference over the largest magnitude of ``want`` (NaN-aware: a NaN in
    one and not the other, or a shape mismatch, is an infinite error)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape or not np.array_equal(np.isnan(got), np.isnan(want)):
        return float("inf")
    ok = ~np.isnan(want)
    if not ok.any():
        return 0.0
    scale = float(np.abs(want[ok]).max()) or 1.0
    return float(np.abs(got[ok] - want[ok]).max()) / scale


def _answer(seconds: np.ndarray, got: np.ndarray, want: np.ndarray,
            **extra: Any) -> dict[str, Any]:
    err = rel_err(got, want)
    # The JIT still compiles during the first iterations: the fastest one shows the steady
    # state next to the mean the other peers report.
    return {"seconds": inner_mean(seconds.tolist()), "iterations": len(seconds),
            "seconds_min": float(seconds.min()),
            "seconds_by_iteration": [round(s, 6) for s in seconds.tolist()],
            "correct": bool(err <= RTOL), "max_rel_err": err, **extra}


def lr_reference(X: np.ndarray, y: np.ndarray, iters: int) -> np.ndarray:
    """``w`` after ``iters`` steps of ``w -= 0.1 * X.T @ (sigmoid(X @ w) - y) / n`` from 0."""
    w = np.zeros(X.shape[1])
    for _ in range(iters):
        w = w - 0.1 * (X.T @ (1.0 / (1.0 + np.exp(-(X @ w))) - y)) / X.shape[0]
    return w


def kmeans_reference(X: np.ndarray, k: int, iters: int, chunk: int = 1 << 16) -> np.ndarray:
    """Centres after ``iters`` Lloyd steps from ``X[:k]``: nearest centre by squared distance
    (lowest index on a tie), a centre with no point stays. Chunked to bound the memory. The
    per-centre sums are a one-hot matrix product, several times faster than ``np.add.at``, and
    ``apps.py`` checks four k-means peers with it."""
    n, d = X.shape
    c = X[:k].copy()
    for _ in range(iters):
        sums, counts = np.zeros((k, d)), np.zeros(k)
        for lo in range(0, n, chunk):
            b = X[lo:lo + chunk]
            lab = np.argmin((b * b).sum(1)[:, None] - 2.0 * (b @ c.T) + (c * c).sum(1)[None, :],
                            axis=1)
            counts += np.bincount(lab, minlength=k)
            onehot = np.zeros((len(b), k))
            onehot[np.arange(len(b)), lab] = 1.0
            sums += onehot.T @ b
        nz = counts > 0
        c = c.copy()
        c[nz] = sums[nz] / counts[nz, None]
    return c


def pagerank_join_reference(v: int, edges: np.ndarray, iters: int) -> np.ndarray:
    """Ranks after ``iters`` steps of the classic RDD-join PageRank (``peer_spark_pagerank``):
    vertices with out-edges start at 1/v; each step a ranked vertex with out-degree m (duplicate
    edges counted) sends rank/m along each out-edge, and exactly the vertices that receive a
    share get rank ``0.15 / v + 0.85 * sum``; the others have none (NaN)."""
    src, dst = edges[:, 0], edges[:, 1]
    outdeg = np.bincount(src, minlength=v).astype(np.float64)
    rank = np.where(outdeg > 0, 1.0 / v, np.nan)
    for _ in range(iters):
        send = ~np.isnan(rank[src])  # join: the source has links (it has an edge) and a rank
        got = np.bincount(dst[send], minlength=v) > 0
        s = np.bincount(dst[send], weights=rank[src[send]] / outdeg[src[send]], minlength=v)
        rank = np.where(got, 0.15 / v + 0.85 * s, np.nan)
    return rank


def pagerank_graphx_reference(v: int, edges: np.ndarray, iters: int) -> np.ndarray:
    """GraphX ``PageRank.run`` semantics over the vertices of ``edges``: every vertex starts at
    1.0, each step gets ``0.15 + 0.85 * sum(rank[u] / outdeg[u])`` over its in-edges (dangling
    mass is lost); returned normalised to sum 1 over those vertices, NaN for the others (GraphX
    normalises its answer too, to sum to the vertex count, so only the direction compares)."""
    src, dst = edges[:, 0], edges[:, 1]
    outdeg = np.bincount(src, minlength=v).astype(np.float64)
    present = (outdeg + np.bincount(dst, minlength=v)) > 0
    rank: np.ndarray = np.ones(v)
    inv = np.where(outdeg > 0, 1.0 / np.maximum(outdeg, 1.0), 0.0)
    for _ in range(iters):
        rank = 0.15 + 0.85 * np.bincount(dst, weights=(rank * inv)[src], minlength=v)
    return np.where(present, rank / rank[present].sum(), np.nan)


def _doubles(b: Any) -> np.ndarray:
    return np.frombuffer(bytes(b), "<f8")


# ------------------------------------------------------------------ the peers
def peer_lr(n: int, d: int, threads: int, iters: int, spark: SparkFactory) -> dict[str, Any]:
    """``spark_jvm_mappartitions`` for logistic regression: ``canary.bench.LogisticRegression``
    over ``logistic_data(n, d, 0)`` in ``4 * threads`` partitions, ``iters`` timed iterations."""

    def body(sc: Any) -> dict[str, Any]:
        X, y = lr_data(n, d)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "lr.f64")
            with open(path, "wb") as f:  # rows [x_0 .. x_{d-1}, y], in slices: no full copy
                for lo in range(0, n, 1 << 16):
                    np.hstack([X[lo:lo + (1 << 16)], y[lo:lo + (1 << 16), None]]).tofile(f)
            out = _doubles(sc._jvm.canary.bench.LogisticRegression.run(
                sc._jsc, path, n, d, 4 * threads, iters))
        return _answer(out[:iters], out[iters:iters + d], lr_reference(X, y, iters),
                       load_s=round(float(out[-1]), 3))

    return _peer("spark_jvm_mappartitions", threads, spark, body)


def peer_kmeans(path: str, k: int, threads: int, iters: int,
                spark: SparkFactory) -> dict[str, Any]:
    """``spark_jvm_mappartitions`` for k-means: ``canary.bench.KMeans`` over the ``.npy`` file
    the other k-means peers read, ``4 * threads`` partitions, from its first ``k`` rows."""

    def body(sc: Any) -> dict[str, Any]:
        X = np.load(path, mmap_mode="r")
        if X.dtype != np.dtype("<f8") or X.ndim != 2 or not X.flags.c_contiguous:
            raise ValueError(f"{path}: need a C-order little-endian float64 matrix")
        n, d = X.shape
        out = _doubles(sc._jvm.canary.bench.KMeans.run(
            sc._jsc, path, int(X.offset), n, d, k, 4 * threads, iters))
        want = kmeans_reference(np.asarray(X), k, iters)
        return _answer(out[:iters], out[iters:iters + k * d].reshape(k, d), want,
                       load_s=round(float(out[-1]), 3))

    return _peer("spark_jvm_mappartitions", threads, spark, body)


def _edges_file(tmp: str, v: int, e: int) -> tuple[str, np.ndarray]:
    edges = rmat(v, e)
    path = os.path.join(tmp, "edges.i64")
    edges.astype("<i8").tofile(path)
    return path, edges


def peer_pagerank_join(v: int, e: int, threads: int, iters: int,
                       spark: SparkFactory) -> dict[str, Any]:
    """``spark_jvm_rdd_join``: ``canary.bench.PageRankJoin`` (links.join(ranks), contributions,
    reduceByKey) over ``rmat_edges(v, e, 0)`` in ``4 * threads`` partitions."""

    def body(sc: Any) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            path, edges = _edges_file(tmp, v, e)
            out = _doubles(sc._jvm.canary.bench.PageRankJoin.run(
                sc._jsc, path, e, v, 4 * threads, iters))
        return _answer(out[:iters], out[iters:iters + v],
                       pagerank_join_reference(v, edges, iters),
                       setup_s=round(float(out[-1]), 3))

    return _peer("spark_jvm_rdd_join", threads, spark, body)


def peer_graphx(v: int, e: int, threads: int, iters: int, spark: SparkFactory,
                k: int = 2) -> dict[str, Any]:
    """``spark_graphx``: ``org.apache.spark.graphx.lib.PageRank.run`` (reset probability 0.15)
    on ``Graph.fromEdges`` of ``rmat_edges(v, e, 0)`` in ``4 * threads`` edge partitions.

    ``seconds`` is ``(T(k + iters) - T(k)) / iters``, ``T(m)`` the wall time of one ``run``
    call with ``m`` iterations after a warm-up call (graph preparation and the final
    normalisation cancel); ``seconds_total_per_iteration`` is ``T(k + iters) / (k + iters)``.
    The ranks of the longer call, normalised to sum 1, are checked."""

    def body(sc: Any) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            path, edges = _edges_file(tmp, v, e)
            out = _doubles(sc._jvm.canary.bench.GraphXPageRank.run(
                sc._jsc, path, e, v, 4 * threads, k, iters))
        t_k, t_long, setup, warm = (float(x) for x in out[:4])
        ranks = out[4:4 + v]
        total = float(np.nansum(ranks))
        got = ranks / total if total else ranks
        want = pagerank_graphx_reference(v, edges, k + iters)
        err = rel_err(got, want)
        return {"seconds": (t_long - t_k) / iters, "iterations": k + iters,
                "seconds_total_per_iteration": t_long / (k + iters),
                "t_short_s": round(t_k, 4), "t_long_s": round(t_long, 4),
                "iterations_short": k, "warmup_s": round(warm, 4), "setup_s": round(setup, 3),
                "rank_sum": total, "vertices": int(np.count_nonzero(~np.isnan(ranks))),
                "correct": bool(err <= RTOL), "max_rel_err": err}

    return _peer("spark_graphx", threads, spark, body)
