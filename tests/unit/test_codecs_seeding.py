"""The wire counter (what travels) and seeding (what repeats); the codecs themselves: test_codecs.py."""
import numpy as np
import pytest

from hvdsync.core.train import seeding
from hvdsync.core.comm.codecs import WireCounter


def test_wire_counter_counts_tensors_bytes_dtypes():
    c = WireCounter()
    c.record(10, 2, "float16")
    c.record(5, 2, "float16")
    assert c.snapshot() == {"tensors": 2, "bytes": 30, "dtypes": ["float16"], "codec_seconds": 0.0}
    c.record(8, 4, "int32", gradients=0)           # a second piece of a gradient: bytes, not another gradient
    c.add_gradients(1)
    c.add_codec_time(0.25)
    c.add_codec_time(0.5)
    assert c.snapshot() == {"tensors": 3, "bytes": 62, "dtypes": ["float16", "int32"], "codec_seconds": 0.75}
    c.reset()
    assert c.snapshot() == {"tensors": 0, "bytes": 0, "dtypes": [], "codec_seconds": 0.0}
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


def test_threads_per_worker_counts_the_cpus_this_process_may_use_not_the_machines():
    # A worker confined to one core (a cpuset from Slurm, Kubernetes, docker --cpuset-cpus, taskset) sizes its thread
    # pool to that core: run in a child process whose affinity is one CPU.
    import multiprocessing
    import os

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    one = min(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1, initializer=os.sched_setaffinity, initargs=(0, {one})) as pool:
        assert pool.apply(seeding.threads_per_worker, (1,)) == 1
        assert pool.apply(seeding.usable_cpus) == 1
    assert seeding.usable_cpus() == len(os.sched_getaffinity(0))


def test_test_hosts_split_the_cpus_like_separate_machines():
    from hvdlab.testhosts import _split

    assert _split([0, 1], 2) == [{0}, {1}]
    assert _split([0, 1, 2, 3], 2) == [{0, 1}, {2, 3}]
    assert _split([0, 1, 2, 3, 4], 3) == [{0}, {1, 2}, {3, 4}]
    assert _split([0, 1], 3) == [{0}, {1}, {0}]   # more hosts than CPUs: one each, reused
