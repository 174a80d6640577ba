"""The embedding experiment of notebook 17 (and the co-design benchmarks): both frameworks draw the same lookups,
and the bytes each ``sync.sparse`` mode should hand to Horovod over the run, from the product's formulas
(:mod:`hvdsync.core.comm.sparse`)."""
from __future__ import annotations

import numpy as np

from hvdsync.core.comm.sparse import allgather_bytes, dense_bytes

BAG = 4  # ids per sample: a sample's embedding is the mean of 4 rows


def draw_lookups(table_rows: int, lookups: int, step: int, rank: int, seed: int = 0, hot: int = 50):
    """The ids one rank looks up at one step, shaped ``(lookups // BAG, BAG)``: half of them among ``hot`` popular
    rows (so ids repeat, as in real traffic), half anywhere in the table. Seeded by ``(seed, step, rank)``."""
    rng = np.random.default_rng([seed, step, rank])
    ids = np.where(rng.random(lookups) < 0.5, rng.integers(0, hot, lookups), rng.integers(0, table_rows, lookups))
    return ids[: lookups - lookups % BAG].reshape(-1, BAG).astype(np.int64)


def exchange_formula(distinct_rows: list[int], table_rows: int, row_elems: int, dense_elems: int,
                     value_bytes: int = 4) -> dict:
    """Bytes one rank hands to Horovod over the steps of the experiment, per ``sync.sparse`` mode: the table's
    gradient (``distinct_rows`` per step, or the whole table) plus ``dense_elems`` other parameters per step."""
    other = len(distinct_rows) * dense_elems * value_bytes
    return {"allgather": sum(allgather_bytes(r, row_elems, value_bytes) for r in distinct_rows) + other,
            "dense": len(distinct_rows) * dense_bytes(table_rows, row_elems, value_bytes) + other,
            "table_allgather": sum(allgather_bytes(r, row_elems, value_bytes) for r in distinct_rows),
            "table_dense": len(distinct_rows) * dense_bytes(table_rows, row_elems, value_bytes)}
