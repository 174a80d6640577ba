"""The wire counter (what travels) and seeding (what repeats); the codecs themselves: test_codecs.py."""
import numpy as np

from hvdsync.core.train import seeding
from hvdsync.core.comm.codecs import WireCounter


def test_wire_counter_counts_tensors_bytes_dtypes():
    c = WireCounter()
    c.record(10, 2, "float16")
    c.record(5, 2, "float16")
    assert c.snapshot() == {"tensors": 2, "bytes": 30, "dtypes": ["float16"]}
    c.record(8, 4, "int32", gradients=0)           # a second piece of a gradient: bytes, not another gradient
    c.add_gradients(1)
    assert c.snapshot() == {"tensors": 3, "bytes": 62, "dtypes": ["float16", "int32"]}
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
