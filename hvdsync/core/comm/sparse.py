"""Sparse gradients (embedding tables): what each way of reducing them moves, written once for both frameworks.

An embedding lookup touches a few rows of a large table, so its gradient is zero everywhere else. PyTorch hands
it over as a sparse COO tensor (``nn.Embedding(sparse=True)``), TensorFlow as ``tf.IndexedSlices`` (``tf.gather``,
Keras ``Embedding``). ``sync.sparse`` picks how ranks combine such a gradient:

* ``dense`` (Horovod's ``sparse_as_dense=True``): densify, then all-reduce the whole table like any gradient:
  ``rows * row_elems`` values per rank whatever was touched; works with every codec, op and sync mode.
* ``allgather`` (Horovod's default for sparse gradients): each rank sends only the rows it touched (coalesced:
  one row per distinct index, duplicates summed locally) as int32 row indices + the rows' values; every rank
  gathers all ranks' pieces and adds them into the table. The same sum as the dense all-reduce (rows nobody touched
  are zero in both); far fewer bytes while few rows are touched, but a gathered piece grows with the world size
  while a ring all-reduce does not: :func:`crossover_rows` is where the two meet.

Byte counts here are what one rank hands to Horovod (:class:`~hvdsync.core.comm.codecs.WireCounter`'s convention) and,
for the link, what crosses one rank's link in a ring (``*_link_bytes``).
"""
from __future__ import annotations

MODES = ("dense", "allgather")
INDEX_BYTES = 4  # row indices travel as int32 (tables up to 2**31 rows; the adapters refuse larger ones)


def allgather_bytes(rows_sent: int, row_elems: int, value_bytes: int = 4) -> int:
    """Bytes one rank hands to Horovod for a sparse gradient with ``rows_sent`` distinct rows (indices + values).

    >>> allgather_bytes(300, 16)   # 300 rows of 16 float32 + 300 int32 indices
    20400
    """
    return rows_sent * (row_elems * value_bytes + INDEX_BYTES)


def dense_bytes(table_rows: int, row_elems: int, value_bytes: int = 4) -> int:
    """Bytes one rank hands to Horovod when the same gradient is densified and all-reduced."""
    return table_rows * row_elems * value_bytes


def allgather_link_bytes(piece_bytes: list[int], rank: int) -> int:
    """Bytes that reach ``rank`` in an allgather of the ranks' pieces: every other rank's piece."""
    return sum(piece_bytes) - piece_bytes[rank]


def crossover_rows(table_rows: int, row_elems: int, world: int, value_bytes: int = 4) -> float:
    """Distinct rows per rank above which ``allgather`` moves more bytes over a link than ``dense`` (ring).

    With ``r`` rows on each rank a rank receives ``(W-1) r (e v + 4)`` bytes from the allgather and
    ``2 (W-1)/W N e v`` from the ring, so they meet at ``r = 2 N e v / (W (e v + 4))``.

    >>> round(crossover_rows(100_000, 16, 2))
    94118
    """
    return 2 * table_rows * row_elems * value_bytes / (world * (row_elems * value_bytes + INDEX_BYTES))
