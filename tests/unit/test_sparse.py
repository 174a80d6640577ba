"""sync.sparse in the config (bad values and combinations fail naming the field) and the core's byte formulas."""
import numpy as np
import pytest

from hvdsync.config import Config, ConfigError
from hvdlab import ring
from hvdlab import embedding
from hvdsync.core.comm import sparse


@pytest.mark.parametrize("sync, message", [
    ({"sparse": "coo"}, "sync.sparse: 'coo' is not allowed; choose one of: dense, allgather"),
    ({"sparse": "allgather", "compression": "topk:0.01"},
     "sync.sparse: 'allgather' is not allowed; with sync.compression 'topk:0.01' choose dense"),
    ({"sparse": "allgather", "compression": "bf16"},
     "sync.sparse: 'allgather' is not allowed; with sync.compression 'bf16' choose dense"),
    ({"sparse": "allgather", "op": "adasum"}, "sync.sparse: 'allgather' is not allowed; with sync.op adasum"),
    ({"sparse": "allgather", "mode": "ps"}, "sync.sparse: 'allgather' is not allowed; with sync.mode 'ps'"),
])
def test_bad_sparse_settings_fail_in_the_config_naming_the_field(sync, message):
    with pytest.raises(ConfigError) as err:
        Config.from_dict({"sync": sync})
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("sync", [{}, {"sparse": "allgather"}, {"sparse": "allgather", "compression": "fp16"},
                                  {"sparse": "allgather", "op": "sum"}, {"sparse": "dense", "compression": "topk:0.01"},
                                  {"sparse": "dense", "mode": "ps"}])
def test_workable_sparse_settings_pass(sync):
    assert Config.from_dict({"sync": sync}).sync.sparse == sync.get("sparse", "dense")


def test_the_keyword_of_the_optimizers_is_checked_like_the_config():
    from hvdsync.adapter import sync_settings  # both adapters' distributed_optimizer resolve their keywords here

    with pytest.raises(ConfigError, match=r"^sync.sparse: 'allgather' is not allowed; with sync.compression 'int8'"):
        sync_settings(None, compression="int8", sparse="allgather")


def test_byte_formulas():
    assert sparse.allgather_bytes(300, 16) == 300 * (16 * 4 + 4)
    assert sparse.allgather_bytes(300, 16, value_bytes=2) == 300 * (16 * 2 + 4)
    assert sparse.dense_bytes(100_000, 16) == 6_400_000
    assert sparse.dense_bytes(100_000, 16) / sparse.allgather_bytes(300, 16) > 300
    assert sparse.allgather_link_bytes([10, 20, 30], 1) == 40
    assert ring.ring_bytes_per_rank(2, 1000) == 1000 and ring.ring_bytes_per_rank(4, 1000) == 1500
    # At the crossover both ways move the same bytes over a link.
    r = sparse.crossover_rows(100_000, 16, 4)
    assert (4 - 1) * r * (16 * 4 + 4) == pytest.approx(ring.ring_bytes_per_rank(4, 6_400_000), rel=1e-9)


def test_lookups_are_seeded_and_repeat_popular_rows():
    a = embedding.draw_lookups(100_000, 300, step=2, rank=1, seed=0)
    assert a.shape == (75, embedding.BAG) and a.dtype == np.int64
    assert (a == embedding.draw_lookups(100_000, 300, step=2, rank=1, seed=0)).all()
    assert not (a == embedding.draw_lookups(100_000, 300, step=2, rank=0, seed=0)).all()
    assert 100 < np.unique(a).size < 300   # a few hundred rows touched, popular ones more than once
    f = embedding.exchange_formula([200, 210], 100_000, 16, 17)
    assert f["allgather"] == sparse.allgather_bytes(410, 16) + 2 * 17 * 4
    assert f["dense"] == 2 * 6_400_000 + 2 * 17 * 4
