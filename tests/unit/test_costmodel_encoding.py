"""The cost model's encoding term (hvdlab.costmodel.step_time) and its measurement (hvdlab.bench.link_encode)."""
import pytest

from hvdlab.bench.link_encode import mlp_shapes, time_codecs
from hvdlab.costmodel import Link, ring_time, step_time

GBIT = Link(alpha=100e-6, beta=8 / 1e9)


def test_step_time_is_compute_plus_encoding_plus_the_ring():
    # 17 MB on 2 ranks over 1 Gbit/s: the ring sends it once each way in 2 messages: 0.136 s + 0.2 ms.
    assert ring_time(17e6, 2, GBIT) == pytest.approx(0.1362, abs=1e-6)
    assert step_time(0.040, 17e6, 2, GBIT) == pytest.approx(0.1762, abs=1e-6)
    assert step_time(0.040, 17e6, 2, GBIT, encode_s=0.010) == pytest.approx(0.1862, abs=1e-6)
    # Top-k 1 %: 50x fewer bytes, but an encoding that costs more than the transfer it saved is what a step is left
    # with (the case the model without the term under-predicted ~3x).
    topk = step_time(0.040, 0.35e6, 2, GBIT, encode_s=0.150)
    assert topk == pytest.approx(0.040 + 0.150 + 2 * 100e-6 + 0.35e6 * 8 / 1e9, abs=1e-9)
    assert topk > step_time(0.040, 17e6, 2, GBIT)


def test_step_time_rejects_negative_seconds_by_name():
    with pytest.raises(ValueError, match="compute_s, encode_s.*expected seconds >= 0"):
        step_time(0.1, 1e6, 2, GBIT, encode_s=-1e-3)
    with pytest.raises(ValueError, match="calls >= 0"):
        step_time(0.1, 1e6, 2, GBIT, calls=-1)


def test_each_round_of_collectives_adds_one_horovod_call():
    from hvdlab.bench.link_report import calls_per_step

    link = Link(alpha=100e-6, beta=8 / 1e9, call=3e-3)
    one = step_time(0.040, 0.1e6, 2, link, calls=1)
    assert step_time(0.040, 0.1e6, 2, link, calls=2) - one == pytest.approx(3e-3)
    assert step_time(0.040, 0.1e6, 2, link) == pytest.approx(one - 3e-3)   # no calls: the textbook step
    cfg = {"sync": {"mode": "allreduce", "compression": "powersgd:2"}}
    assert calls_per_step(cfg) == 2                                       # P's all-reduce, then Q's
    assert calls_per_step({"sync": {"mode": "allreduce", "compression": "topk:0.01"}}) == 1
    assert calls_per_step({"sync": {"mode": "local_sgd", "compression": "none", "period": 4}}) == 0.25


def test_encoding_is_measured_per_codec_and_sparsifying_costs_more_than_casting():
    shapes = mlp_shapes("torch", 256, 512)            # 136 k values: milliseconds per codec
    assert shapes == [(512, 256), (512,), (10, 512), (10,)]
    t = time_codecs("torch", ["none", "fp16", "topk:0.01"], shapes, repeats=3, threads=1)
    assert t["none"] == 0.0                            # Horovod gets the float32 gradient as it is
    assert 0 < t["fp16"] < t["topk:0.01"]              # two casts vs a top-k, a gather, a scatter and the residual


def test_unknown_framework_is_named():
    with pytest.raises(ValueError, match="framework: 'jax' is not allowed; choose one of: torch, tensorflow"):
        time_codecs("jax", ["none"], [(4,)])


@pytest.mark.parametrize("spec", ["topk:0.01", "randk:0.1", "int8", "powersgd:2"])
def test_a_codecs_rounds_are_the_rounds_its_reduction_makes(spec):
    import numpy as np

    from hvdlab.codecs_numpy import NumpyOps
    from hvdsync.core.comm.codecs import reduce_all
    from hvdsync.core.comm.codecs.registry import get_codec
    from hvdsync.core.comm.codecs.state import CodecState
    from hvdsync.core.comm.codecs.base import Allreduce, ReduceContext

    codec, ops, shapes, rounds = get_codec(spec), NumpyOps(), [(64, 32), (32,)], []

    def execute(requests):   # every rank sent the same: an all-reduce returns its input, an all-gather 2 copies
        rounds.append(len(requests))
        return [r.tensor if isinstance(r, Allreduce) else np.concatenate([r.tensor] * 2) for r in requests]

    grads = [np.ones(s, np.float32) for s in shapes]
    reduce_all(codec, ops, grads, CodecState(codec, shapes, ops, 0), ReduceContext(2, True, True, 0, 0), execute)
    assert len(rounds) == codec.rounds, rounds
