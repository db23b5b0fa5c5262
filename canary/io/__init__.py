"""Input formats for canary apps, read so that each worker touches only its own part.

Tabular data (logistic regression, k-means): :func:`count_rows`,
:func:`read_rows`, :func:`read_svmlight_range`.  Graphs (PageRank):
:func:`count_edges`, :func:`read_edges_range`, :func:`read_edges_rows`.
Partitioning: :func:`partition_rows`, :func:`split_byte_ranges`.  A checked
memory map of a ``.npy`` file: :func:`map_npy`.
See docs/formats.md for the formats and examples.
"""

from __future__ import annotations

from canary.io._common import InputFormatError, map_npy, partition_rows, split_byte_ranges
from canary.io._edges import count_edges, read_edges, read_edges_range, read_edges_rows
from canary.io._tabular import count_rows, read_rows, read_svmlight_range

__all__ = [
    "InputFormatError",
    "count_edges",
    "count_rows",
    "map_npy",
    "partition_rows",
    "read_edges",
    "read_edges_range",
    "read_edges_rows",
    "read_rows",
    "read_svmlight_range",
    "split_byte_ranges",
]
