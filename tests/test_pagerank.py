"""PageRank app: networkx's answer, from a 2-D vertex-cut, on any number of workers."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from conftest import mpirun

import apps.pagerank as pr
import canary
from canary.generate import rmat_edges
from canary.io import InputFormatError
from tests.app_helpers import strict_loads


def run_pr(argv: list[str], workers: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray,
                                                                        np.ndarray]:
    args = pr.parse_args(argv)
    args.want_ranks = True
    prog, _ = pr.build(args, workers)
    res = canary.run_local(prog, workers=workers, seed=seed)
    ids, ranks = pr.ranks_by_id(res)
    return ids, ranks, res.value("stats")


def nx_ranks(edges: np.ndarray) -> dict[int, float]:
    g = nx.DiGraph()
    g.add_edges_from(edges.tolist())
    return nx.pagerank(g, alpha=0.85, tol=1e-12, weight=None)


def assert_matches(ref: dict[int, float], ids: np.ndarray, ranks: np.ndarray) -> None:
    np.testing.assert_array_equal(ids, np.array(sorted(ref), np.int64))
    want = np.array([ref[int(i)] for i in ids])
    assert np.abs(ranks - want).sum() <= 1e-9
    assert abs(ranks.sum() - 1.0) <= 1e-12


def both_ways(g: nx.Graph, ids: dict | None = None) -> np.ndarray:
    """Each undirected edge as two directed edges, nodes renamed through ``ids``."""
    f = (lambda v: ids[v]) if ids is not None else (lambda v: v)
    e = [(f(u), f(v)) for u, v in g.edges()]
    return np.array(e + [(b, a) for a, b in e], np.int64)


def write_text(path: Path, edges: np.ndarray, header: str = "# test graph\n# src dst\n") -> None:
    path.write_text(header + "".join(f"{a}\t{b}\n" for a, b in edges))


TIGHT = ["--tol", "1e-14", "--max-iter", "500"]


def test_karate_text_matches_networkx(tmp_path: Path) -> None:
    e = both_ways(nx.karate_club_graph())
    write_text(tmp_path / "karate.txt", e)
    ids, ranks, s = run_pr(["--input", str(tmp_path / "karate.txt"), "--partitions", "4", *TIGHT])
    assert_matches(nx_ranks(e), ids, ranks)
    assert s[pr.T_L1] < 1e-14 and s[pr.T_N] == 34


def test_les_miserables_npy_sparse_ids_matches_networkx(tmp_path: Path) -> None:
    g = nx.les_miserables_graph()
    names = sorted(g.nodes())
    ids = {v: 1000003 * i + 17 for i, v in enumerate(names)}  # non-contiguous ids
    e = both_ways(g, ids)
    np.save(tmp_path / "lesmis.npy", e)
    got_ids, ranks, _ = run_pr(["--input", str(tmp_path / "lesmis.npy"), "--partitions", "9",
                                *TIGHT], workers=3)
    assert_matches(nx_ranks(e), got_ids, ranks)


def test_rmat_with_dangling_duplicates_and_sparse_ids_matches_networkx() -> None:
    e = rmat_edges(300, 1500, 4, sparse_ids=True)
    g = nx.DiGraph(e.tolist())
    assert sum(1 for v in g if g.out_degree(v) == 0) > 10  # dangling vertices
    assert len(e) > g.number_of_edges() and nx.number_of_selfloops(g) > 0
    assert max(g) > 2**32
    ids, ranks, s = run_pr(["--generate", "300,1500", "--seed", "4", "--sparse-ids",
                            "--partitions", "4", *TIGHT])
    assert_matches(nx_ranks(e), ids, ranks)
    assert s[pr.T_DANGLING] > 0


def test_independent_of_workers_partitions_and_interleaving() -> None:
    argv = ["--generate", "400,3000", "--seed", "9", "--sparse-ids", *TIGHT]
    ref = None
    for workers, parts, seed in [(1, 1, 0), (1, 4, 1), (2, 4, 2), (2, 9, 3), (3, 9, 4),
                                 (3, 16, 5)]:
        ids, ranks, s = run_pr([*argv, "--partitions", str(parts)], workers, seed)
        if ref is None:
            ref = (ids, ranks, s)
            continue
        np.testing.assert_array_equal(ids, ref[0])
        assert np.abs(ranks - ref[1]).max() <= 1e-15  # floating-point summation order only
        assert abs(s[pr.T_ITER] - ref[2][pr.T_ITER]) <= 1


def test_same_partitions_bitwise_identical_across_workers() -> None:
    argv = ["--generate", "200,1000", "--seed", "2", "--partitions", "9", *TIGHT]
    a = run_pr(argv, 1, 0)
    for w, seed in [(2, 7), (3, 8)]:
        b = run_pr(argv, w, seed)
        np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("fmt", ["generate", "text", "npy"])
def test_chunked_setup_same_answer(tmp_path: Path, fmt: str) -> None:
    """Set-up streams each read partition in chunks (--chunk-edges): any chunk size, ragged
    last chunks and partitions with fewer chunks than others give bitwise the same ranks."""
    e = rmat_edges(250, 1700, 3, sparse_ids=True)
    data = ["--generate", "250,1700", "--seed", "3", "--sparse-ids"]
    if fmt == "text":
        write_text(tmp_path / "g.txt", e)
        data = ["--input", str(tmp_path / "g.txt")]
    elif fmt == "npy":
        np.save(tmp_path / "g.npy", e)
        data = ["--input", str(tmp_path / "g.npy")]
    argv = [*data, "--partitions", "4", *TIGHT]
    ids, ranks, _ = run_pr(argv, 1)
    assert_matches(nx_ranks(e), ids, ranks)
    for chunk, workers in [(1, 2), (37, 2), (100, 3)]:
        ids2, ranks2, _ = run_pr([*argv, "--chunk-edges", str(chunk)], workers)
        np.testing.assert_array_equal(ids2, ids)
        np.testing.assert_array_equal(ranks2, ranks)


def test_max_iter_bounds_the_loop() -> None:
    _, ranks, s = run_pr(["--generate", "200,1000", "--max-iter", "3", "--partitions", "4"])
    assert s[pr.T_ITER] == 3 and s[pr.T_L1] > 1e-10
    assert abs(ranks.sum() - 1.0) <= 1e-12
    # --tol 0: --max-iter iterations, however small the change gets
    _, ranks, s = run_pr(["--generate", "200,1000", "--max-iter", "150", "--tol", "0"])
    assert s[pr.T_ITER] == 150 and s[pr.T_L1] < 1e-10


@pytest.mark.parametrize("body,line,what", [
    ("1 2\n3 x4\n", 4, "not an integer"),
    ("1 2\n\n5\n", 5, "one field"),
    ("1 2\n3 -4\n", 4, ""),
])
def test_bad_line_names_file_and_line(tmp_path: Path, body: str, line: int, what: str) -> None:
    f = tmp_path / "bad.txt"
    f.write_text("# header\n# more\n" + body)
    args = pr.parse_args(["--input", str(f), "--partitions", "4"])
    prog, _ = pr.build(args, 2)
    with pytest.raises(canary.TaskError, match=rf"bad\.txt:{line}: .*{what}"):
        canary.run_local(prog, workers=2)


def test_empty_graph(tmp_path: Path) -> None:
    f = tmp_path / "empty.txt"
    f.write_text("# nothing but comments\n\n# here\n")
    with pytest.raises(InputFormatError, match=r"empty\.txt: no edges"):
        pr.build(pr.parse_args(["--input", str(f)]), 1)
    np.save(tmp_path / "empty.npy", np.zeros((0, 2), np.int64))
    with pytest.raises(InputFormatError, match=r"empty\.npy: no edges"):
        pr.build(pr.parse_args(["--input", str(tmp_path / "empty.npy")]), 1)


def test_partitions_must_be_square() -> None:
    with pytest.raises(SystemExit):
        pr.parse_args(["--partitions", "8"])


@pytest.mark.parametrize("ranks", [2, 3])
def test_mpiexec_output_top_and_summary(tmp_path: Path, ranks: int) -> None:
    e = both_ways(nx.karate_club_graph())
    write_text(tmp_path / "karate.txt", e)
    # text lines, or with a .npz name the arrays (a .npz name used to get text)
    out, met = tmp_path / ("ranks.txt" if ranks == 2 else "ranks.npz"), tmp_path / "m.jsonl"
    cp = mpirun(ranks, "apps/pagerank.py", "--input", str(tmp_path / "karate.txt"),
                "--partitions", "4", *TIGHT, "--output", str(out), "--top", "3",
                "--metrics", str(met), timeout=60)
    assert cp.returncode == 0, cp.stderr
    summary = strict_loads(cp.stdout.strip().splitlines()[-1])
    assert summary["workers"] == ranks - 1 and summary["converged"]
    assert 0 < summary["controller_cpu_percent"] < 100  # only logistic regression's said it
    assert summary["vertices"] == 34 and summary["distinct_edges"] == len(e)
    if ranks == 2:
        lines = out.read_text().splitlines()
        ids = np.array([int(t.split()[0]) for t in lines])
        vals = np.array([float(t.split()[1]) for t in lines])
        assert all(t.split()[1] == f"{v:.17g}" for t, v in zip(lines, vals))  # 17 significant
    else:
        with np.load(out) as z:
            assert set(z.files) == {"vertex", "rank"}
            ids, vals = z["vertex"], z["rank"]
        assert ids.tolist() == sorted(ids.tolist())
    ref = nx_ranks(e)
    assert_matches(ref, ids, vals)
    best = sorted(ref, key=lambda v: -ref[v])[:3]
    assert [t[0] for t in summary["top"]] == best
    rows = [strict_loads(line) for line in met.read_text().splitlines()]
    assert [row["iteration"] for row in rows] == list(range(1, summary["iterations"] + 1))


def test_cli_empty_graph_exit_code(tmp_path: Path) -> None:
    f = tmp_path / "empty.txt"
    f.write_text("# no edges\n")
    cp = mpirun(2, "apps/pagerank.py", "--input", str(f), timeout=60)
    assert cp.returncode == 2
    assert "empty.txt: no edges" in cp.stderr
