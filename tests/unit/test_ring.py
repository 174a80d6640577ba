"""The ring all-reduce simulation (hvdlab.ring): it sums, every rank ends equal, and it sends what the law
says."""
import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdlab import ring
from hvdlab.ring import (ALL_GATHER, REDUCE_SCATTER, bus_bandwidth, chunk_bounds, parameter_server_allreduce,
                               parameter_server_bytes, ring_allreduce, ring_bytes_per_rank, ring_steps)


def _int_buffers(n, size, seed=0):
    # Integers: the sum is exact whatever order the ring adds in, so equality can be exact.
    rng = np.random.default_rng([seed, n, size])
    return [rng.integers(-1000, 1000, size=size, dtype=np.int64) for _ in range(n)]


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 12), size=st.integers(0, 200), seed=st.integers(0, 2**32 - 1))
def test_every_rank_ends_with_the_exact_sum_for_any_n_and_size(n, size, seed):
    arrays = _int_buffers(n, size, seed)
    trace = ring_allreduce(arrays)
    expected = np.sum(arrays, axis=0)
    assert len(trace.results) == n
    for r in range(n):
        assert np.array_equal(trace.results[r], expected), f"rank {r} of {n}, size {size}"


@pytest.mark.parametrize("n,size", [(2, 1), (3, 7), (4, 10), (5, 3), (7, 100), (8, 1001)])
def test_sizes_not_divisible_by_n_still_sum_and_total_traffic_is_exactly_2_n_minus_1_buffers(n, size):
    assert size % n != 0
    arrays = _int_buffers(n, size)
    trace = ring_allreduce(arrays)
    assert all(np.array_equal(r, np.sum(arrays, axis=0)) for r in trace.results)
    s = arrays[0].nbytes
    # Every chunk travels n-1 hops in each phase, so over all ranks exactly 2(n-1) buffers' worth is sent ...
    assert int(trace.bytes_sent.sum()) == 2 * (n - 1) * s
    # ... and no rank sends more than the law plus one element per message (chunks differ by one element at most).
    slack = ring_steps(n) * arrays[0].itemsize
    assert np.all(np.abs(trace.bytes_sent - ring_bytes_per_rank(n, s)) <= slack)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 12), per_rank=st.integers(0, 30), dtype=st.sampled_from(["int32", "int64", "float32"]))
def test_counted_bytes_equal_the_2_n_minus_1_over_n_law_when_n_divides_the_size(n, per_rank, dtype):
    arrays = [np.ones(n * per_rank, dtype=dtype) * (r + 1) for r in range(n)]
    trace = ring_allreduce(arrays)
    law = ring_bytes_per_rank(n, arrays[0].nbytes)
    assert trace.bytes_sent.tolist() == [law] * n


def test_float_buffers_sum_to_float_precision_and_shapes_are_kept():
    rng = np.random.default_rng(1)
    arrays = [rng.normal(size=(3, 5)).astype(np.float32) for _ in range(4)]
    trace = ring_allreduce(arrays)
    for result in trace.results:
        assert result.shape == (3, 5) and result.dtype == np.float32
        np.testing.assert_allclose(result, np.sum(arrays, axis=0), rtol=1e-5, atol=1e-6)
    # The inputs are not modified in place (each rank's buffer is copied first).
    assert not np.shares_memory(trace.results[0], arrays[0])


def test_log_follows_the_ring_schedule():
    n = 4
    trace = ring_allreduce(_int_buffers(n, 8))
    assert len(trace.log) == n * ring_steps(n)
    assert [t.phase for t in trace.log] == [REDUCE_SCATTER] * n * (n - 1) + [ALL_GATHER] * n * (n - 1)
    for t in trace.log:
        assert t.dst == (t.src + 1) % n                        # only to the right neighbour
        assert t.nbytes == 2 * 8                               # 8 int64 elements / 4 chunks
    for step in range(n - 1):
        rs = [t for t in trace.log if t.phase == REDUCE_SCATTER and t.step == step]
        ag = [t for t in trace.log if t.phase == ALL_GATHER and t.step == step]
        assert [t.chunk for t in rs] == [(r - step) % n for r in range(n)]
        assert [t.chunk for t in ag] == [(r + 1 - step) % n for r in range(n)]
        assert sorted(t.chunk for t in rs) == list(range(n))   # every chunk moves once per step


@pytest.mark.parametrize("n,size", [(2, 5), (5, 13), (6, 6)])
def test_after_reduce_scatter_rank_r_owns_the_summed_chunk_r_plus_1(n, size):
    arrays = _int_buffers(n, size)
    trace = ring_allreduce(arrays, keep_states=True)
    assert len(trace.states) == ring_steps(n) + 1
    assert all(np.array_equal(trace.states[0][r], arrays[r]) for r in range(n))
    assert all(np.array_equal(trace.states[-1][r], trace.results[r]) for r in range(n))
    total, bounds = np.sum(arrays, axis=0), chunk_bounds(size, n)
    middle = trace.states[n - 1]                     # after the n-1 reduce-scatter steps
    for r in range(n):
        lo, hi = bounds[(r + 1) % n]
        assert np.array_equal(middle[r][lo:hi], total[lo:hi])
        if n > 2:                                    # ... and not yet any other summed chunk
            lo, hi = bounds[(r + 2) % n]
            assert not np.array_equal(middle[r][lo:hi], total[lo:hi])
    assert ring_allreduce(arrays).states == []       # states are kept only when asked


def test_one_rank_sends_nothing():
    trace = ring_allreduce([np.arange(5)])
    assert trace.log == [] and trace.bytes_sent.tolist() == [0] and trace.results[0].tolist() == [0, 1, 2, 3, 4]
    assert ring_bytes_per_rank(1, 1000) == 0.0


def test_chunk_bounds_match_numpy_array_split():
    for size in range(0, 30):
        for n in range(1, 9):
            got = [hi - lo for lo, hi in chunk_bounds(size, n)]
            assert got == [len(c) for c in np.array_split(np.arange(size), n)]


def test_mismatched_buffers_are_rejected_with_the_rank_named():
    with pytest.raises(ValueError, match=r"rank_arrays\[1\]"):
        ring_allreduce([np.zeros(4), np.zeros(5)])
    with pytest.raises(ValueError, match=r"rank_arrays\[2\]"):
        ring_allreduce([np.zeros(4), np.zeros(4), np.zeros(4, dtype=np.float32)])
    with pytest.raises(ValueError, match="at least one rank"):
        ring_allreduce([])


@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
def test_parameter_server_counts_match_its_formula_and_its_link_grows_with_n(n):
    arrays = _int_buffers(n, 24)
    trace = parameter_server_allreduce(arrays)
    s = arrays[0].nbytes
    assert all(np.array_equal(r, np.sum(arrays, axis=0)) for r in trace.results)
    law = parameter_server_bytes(n, s)
    assert trace.worker_bytes_sent.tolist() == [law.worker_sent] * n
    assert trace.server_bytes_sent == law.server_sent == n * s
    assert trace.server_bytes_received == law.server_received == n * s


def test_ring_per_rank_traffic_stays_below_2s_while_the_server_link_grows_linearly():
    s = 1_000_000
    ring_bytes = [ring_bytes_per_rank(n, s) for n in (2, 4, 8, 16, 64)]
    server = [parameter_server_bytes(n, s).server_sent for n in (2, 4, 8, 16, 64)]
    assert ring_bytes == [1.0e6, 1.5e6, 1.75e6, 1.875e6, 1.96875e6]
    assert all(b < 2 * s for b in ring_bytes)
    assert server == [2e6, 4e6, 8e6, 16e6, 64e6]


def test_bus_bandwidth_is_the_per_rank_wire_bytes_over_time():
    assert bus_bandwidth(4_000_000, 0.01, 2) == pytest.approx(4e8)     # 2 ranks: S per rank on the wire
    assert bus_bandwidth(4_000_000, 0.01, 4) == pytest.approx(6e8)     # 4 ranks: 1.5 S per rank
    with pytest.raises(ValueError, match="seconds"):
        bus_bandwidth(1, 0.0, 2)


def test_module_docstring_examples_hold():
    failures, tried = doctest.testmod(ring)
    assert tried > 0 and failures == 0
