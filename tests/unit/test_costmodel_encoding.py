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


def test_encoding_is_measured_per_codec_and_sparsifying_costs_more_than_casting():
    shapes = mlp_shapes("torch", 256, 512)            # 136 k values: milliseconds per codec
    assert shapes == [(512, 256), (512,), (10, 512), (10,)]
    t = time_codecs("torch", ["none", "fp16", "topk:0.01"], shapes, repeats=3, threads=1)
    assert t["none"] == 0.0                            # Horovod gets the float32 gradient as it is
    assert 0 < t["fp16"] < t["topk:0.01"]              # two casts vs a top-k, a gather, a scatter and the residual


def test_unknown_framework_is_named():
    with pytest.raises(ValueError, match="framework: 'jax' is not allowed; choose one of: torch, tensorflow"):
        time_codecs("jax", ["none"], [(4,)])
