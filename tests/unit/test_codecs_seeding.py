"""Codecs (what travels) and seeding (what repeats)."""
import numpy as np
import pytest

from hvdsync.core import seeding
from hvdsync.core.codecs import CODECS, WireCounter, get_codec


def test_fp16_codec_halves_the_bytes_and_round_trips_within_fp16_precision():
    x = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    codec = get_codec("fp16")
    wire = codec.encode(x)
    assert wire.dtype == np.float16 and wire.nbytes == x.nbytes // 2
    assert codec.wire_bytes(x.size, x.itemsize) == wire.nbytes
    np.testing.assert_allclose(codec.decode(wire, x.dtype), x, rtol=1e-3, atol=1e-4)
    assert not codec.applies_to("int64")           # integer tensors travel unchanged


def test_none_codec_is_identity_and_unknown_names_list_the_choices():
    x = np.arange(4, dtype=np.float32)
    assert get_codec("none").encode(x) is x
    with pytest.raises(ValueError, match="choose one of: " + ", ".join(CODECS)):
        get_codec("fp8")


def test_wire_counter_counts_tensors_bytes_dtypes():
    c = WireCounter()
    c.record(10, 2, "float16")
    c.record(5, 2, "float16")
    assert c.snapshot() == {"tensors": 2, "bytes": 30, "dtypes": ["float16"]}
    c.reset()
    assert c.snapshot()["tensors"] == 0


def test_rank_seeds_are_stable_distinct_and_in_range():
    seeds = [seeding.rank_seed(42, r) for r in range(64)]
    assert len(set(seeds)) == 64
    assert seeds == [seeding.rank_seed(42, r) for r in range(64)]
    assert all(0 <= s < 2**32 for s in seeds)
    assert seeding.rank_seed(42, 0) != seeding.rank_seed(43, 0)


def test_sample_rng_depends_on_the_sample_not_the_reader():
    a = seeding.sample_rng(0, 3, 17).normal(size=4)
    b = seeding.sample_rng(0, 3, 17).normal(size=4)
    c = seeding.sample_rng(0, 4, 17).normal(size=4)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_threads_per_worker_never_oversubscribes():
    assert seeding.threads_per_worker(2, cpu_count=2) == 1
    assert seeding.threads_per_worker(4, cpu_count=16) == 4
    assert seeding.threads_per_worker(8, cpu_count=2) == 1
