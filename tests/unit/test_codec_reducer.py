"""The codec reducer written once (hvdsync.core.comm.reducer) with its collectives handed in: here 2 ranks in 2
threads on numpy kernels, whose rounds meet in numpy collectives (a sum or mean, a concatenation in rank order, as
Horovod returns them). Each rank's result is the one the simulated world of hvdlab.codecs_numpy gives; rounds are
numbered from 0 in every reduction; every tensor handed over and every gradient is counted."""
import threading

import numpy as np
import pytest

from hvdlab.codecs_numpy import NumpyOps, simulate
from hvdsync.config import SyncConfig
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.core.comm.codecs.state import CodecState
from hvdsync.core.comm.reducer import CodecReducer, Collectives

SHAPES = [(32, 24), (24,), (5, 3, 4)]


class ThreadWorld:
    """The meeting point of ``size`` ranks' rounds in one process."""

    def __init__(self, size):
        self.size, self.barrier, self.posted, self.rounds = size, threading.Barrier(size, timeout=60), {}, []

    def meet(self, rank, index, reduce, gather, average):
        self.posted[rank] = (index, reduce, gather)
        self.barrier.wait()
        indices = {p[0] for p in self.posted.values()}
        assert len(indices) == 1, f"ranks in different rounds: {indices}"
        summed = [np.sum([self.posted[r][1][j] for r in range(self.size)], axis=0) for j in range(len(reduce))]
        reduced = [s / np.asarray(self.size, s.dtype) if average else s for s in summed]
        gathered = [np.concatenate([self.posted[r][2][j] for r in range(self.size)]) for j in range(len(gather))]
        if rank == 0:
            self.rounds.append((index, len(reduce), len(gather)))
        self.barrier.wait()   # every rank has read the others' tensors before any posts its next round
        return reduced, gathered


class NumpyCollectives(Collectives):
    def __init__(self, world, rank):
        self.world, self.size, self.rank = world, world.size, rank

    def round(self, index, reduce, gather, average):
        return self.world.meet(self.rank, index, reduce, gather, average)

    def record(self, counter, tensors):
        for t in tensors:
            counter.record(t.size, t.dtype.itemsize, t.dtype.name, gradients=0)

    def count_gradients(self, counter, n):
        counter.add_gradients(n)


def _run(spec, grads_by_rank, steps=1):
    world = ThreadWorld(len(grads_by_rank))
    reducers = [CodecReducer(spec, SHAPES, SyncConfig(compression=spec), NumpyOps(), NumpyCollectives(world, r))
                for r in range(world.size)]
    out = [None] * world.size

    def rank(r):
        for _ in range(steps):
            out[r] = reducers[r].reduce(grads_by_rank[r])

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(world.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out, reducers, world


@pytest.mark.parametrize("spec", ["topk:0.1", "int8", "powersgd:2"])
def test_the_core_reducer_gives_each_rank_what_the_simulated_world_gives(spec):
    rng = np.random.default_rng(0)
    grads = [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(2)]
    out, reducers, world = _run(spec, grads)
    codec = get_codec(spec)
    expected = simulate(codec, grads, [CodecState(codec, SHAPES, NumpyOps(), 0) for _ in range(2)])
    for r in range(2):
        for got, want in zip(out[r], expected[r]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    counter = reducers[0].counter
    assert counter.bytes == sum(codec.wire_bytes(s, 4) for s in SHAPES)
    assert counter.tensors == len(SHAPES)   # gradients: their pieces are counted with gradients=0
    assert [i for i, _, _ in world.rounds] == list(range(len(world.rounds)))


def test_rounds_are_numbered_from_zero_in_every_reduction_and_sorted_by_kind():
    rng = np.random.default_rng(1)
    grads = [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(2)]
    _, reducers, world = _run("powersgd:2", grads, steps=2)
    # PowerSGD: P's round (the matrices' P and the vector all-reduced as it is), then Q's; again at the next step.
    assert [i for i, _, _ in world.rounds] == [0, 1, 0, 1]
    assert all(gathers == 0 and reduces > 0 for _, reduces, gathers in world.rounds)
    assert reducers[0].counter.tensors == 2 * len(SHAPES)   # 2 reductions of 3 gradients
    _, _, world = _run("topk:0.1", grads)
    assert world.rounds == [(0, 0, 2 * len(SHAPES))]   # values and indices of each tensor, gathered in one round
