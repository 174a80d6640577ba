"""Every codec's maths in the core, on numpy, in a simulated world of ranks (hvdlab.codecs_numpy).

Shapes and dtypes, ranks agreeing, error feedback keeping exactly what was not sent, unbiased stochastic rounding,
PowerSGD recovering a low-rank gradient, wire bytes equal to the formula, state saved and restored.
"""
import numpy as np
import pytest

from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.core.comm.codecs.state import CodecState
from hvdlab.codecs_numpy import NumpyOps, simulate
from hvdsync.core.comm.codecs.quantize import LEVELS, dequantize, quantize

SHAPES = [(32, 24), (24,), (5, 3, 4), (10,)]
REDUCING = ["bf16", "topk:0.1", "randk:0.1", "int8", "powersgd:2"]


def _grads(rng, size=2, shapes=SHAPES):
    return [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(size)]


def _states(codec, size=2, shapes=SHAPES, seed=0):
    return [CodecState(codec, shapes, NumpyOps(), seed) for _ in range(size)]


@pytest.mark.parametrize("spec", REDUCING)
def test_output_has_the_gradient_shape_and_dtype_and_is_identical_on_every_rank(spec):
    codec = get_codec(spec)
    grads = _grads(np.random.default_rng(0))
    out = simulate(codec, grads, _states(codec))
    for r in range(2):
        for g, o in zip(grads[r], out[r]):
            assert o.shape == g.shape and o.dtype == np.float32
    for a, b in zip(out[0], out[1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("spec", REDUCING)
def test_counted_wire_bytes_equal_the_codec_formula(spec):
    codec = get_codec(spec)
    counter = WireCounter()
    simulate(codec, _grads(np.random.default_rng(1)), _states(codec), counter=counter)
    assert counter.bytes == sum(codec.wire_bytes(s, 4) for s in SHAPES)


def test_wire_formulas():
    n = 1_000_000
    assert get_codec("none").wire_bytes((n,), 4) == 4 * n
    assert get_codec("fp16").wire_bytes((n,), 4) == get_codec("bf16").wire_bytes((n,), 4) == 2 * n
    assert get_codec("topk:0.01").wire_bytes((n,), 4) == 10_000 * (4 + 4)   # values + int32 indices
    assert get_codec("randk:0.01").wire_bytes((n,), 4) == 10_000 * 4        # shared positions: values only
    assert get_codec("int8").wire_bytes((n,), 4) == n + 4                   # int8 levels + a float32 scale
    assert get_codec("powersgd:2").wire_bytes((1000, 1000), 4) == 2 * 2000 * 4
    assert get_codec("powersgd:2").wire_bytes((1000,), 4) == 4000           # vectors travel as they are
    assert get_codec("topk:0.01").k(50) == 1                                 # at least one entry per tensor


@pytest.mark.parametrize("spec", ["topk:0.1", "randk:0.1"])
def test_sparse_error_feedback_keeps_exactly_what_was_not_sent(spec):
    codec = get_codec(spec)
    rng = np.random.default_rng(2)
    states = _states(codec)
    for _step in range(3):
        before = [[s["residual"].copy() for s in st.slots] for st in states]
        grads = _grads(rng)
        out = simulate(codec, grads, states)
        sent_total = [np.zeros(s, np.float32) for s in SHAPES]
        for r in range(2):
            for i, _s in enumerate(SHAPES):
                x = grads[r][i] + before[r][i]
                residual = states[r].slots[i]["residual"]
                sent = x - residual
                # Where something was sent, the residual is exactly 0; elsewhere it is exactly x.
                mask = residual == 0
                assert mask.sum() == codec.k(x.size)
                np.testing.assert_array_equal(residual[~mask], x[~mask])
                np.testing.assert_array_equal(sent[mask], x[mask])
                sent_total[i] += sent
        for i in range(len(SHAPES)):   # the combined gradient is the average of what the ranks sent
            np.testing.assert_allclose(out[0][i], sent_total[i] / 2, rtol=1e-6, atol=1e-7)
    assert all(int(st.slots[0]["step"]) == 3 for st in states)


def test_randk_ranks_pick_the_same_positions_and_new_ones_each_step():
    codec = get_codec("randk:0.1")
    states = _states(codec)
    rng = np.random.default_rng(3)
    masks = []
    for _ in range(2):
        simulate(codec, _grads(rng), states, error_feedback=True)
        m0 = [s["residual"] == 0 for s in states[0].slots]
        m1 = [s["residual"] == 0 for s in states[1].slots]
        assert all(np.array_equal(a, b) for a, b in zip(m0, m1))
        masks.append(m0[0].copy())
    assert not np.array_equal(masks[0], masks[1])


def test_topk_sends_the_largest_entries():
    codec = get_codec("topk:0.1")
    g = np.arange(100, dtype=np.float32) - 49.25      # |x| largest at both ends, no ties, no zero
    states = _states(codec, 2, [(100,)])
    simulate(codec, [[g], [g]], states)
    sent = np.flatnonzero(states[0].slots[0]["residual"] == 0)
    assert sorted(sent.tolist()) == [0, 1, 2, 3, 4, 95, 96, 97, 98, 99]


def test_without_error_feedback_nothing_is_kept():
    for spec in REDUCING:
        codec = get_codec(spec)
        states = _states(codec)
        simulate(codec, _grads(np.random.default_rng(4)), states, error_feedback=False)
        for st in states:
            for slots in st.slots:
                if "residual" in slots:
                    assert not slots["residual"].any(), spec


def test_int8_levels_fit_in_int8_and_the_rounding_is_unbiased():
    ops = NumpyOps()
    rng = np.random.default_rng(5)
    x = rng.normal(size=64).astype(np.float32)
    x[7] = -np.abs(x).max() * 1.5                   # the scale is max |x|: one entry hits the lowest level
    draws = 4000
    total = np.zeros_like(x, dtype=np.float64)
    for d in range(draws):
        q, scale = quantize(ops, x, ops.uniform(x.size, 11, d))
        assert q.min() >= -LEVELS and q.max() <= LEVELS and np.array_equal(q, np.floor(q))
        total += dequantize(ops, q, scale)
    mean = total / draws
    # One draw errs by at most one level (scale / 127); the mean of 4000 draws is within a few standard errors.
    level = np.abs(x).max() / LEVELS
    assert np.abs(dequantize(ops, q, scale) - x).max() <= level * (1 + 1e-5)
    assert np.abs(mean - x).max() < 5 * level / (2 * np.sqrt(draws))
    assert q[7] == -LEVELS


def test_int8_decoded_average_is_unbiased_over_steps():
    codec = get_codec("int8")
    states = _states(codec, 2, [(50,)])
    rng = np.random.default_rng(6)
    g = [[rng.normal(size=50).astype(np.float32)] for _ in range(2)]
    mean = np.zeros(50)
    for _ in range(1000):
        mean += simulate(codec, g, states, error_feedback=False)[0][0] / 1000
    truth = (g[0][0] + g[1][0]) / 2
    level = max(np.abs(g[0][0]).max(), np.abs(g[1][0]).max()) / LEVELS
    assert np.abs(mean - truth).max() < 5 * level / np.sqrt(1000)


def test_powersgd_recovers_a_rank_two_average_in_one_step_and_keeps_the_rest():
    codec = get_codec("powersgd:2")
    rng = np.random.default_rng(7)
    u, v = rng.normal(size=(40, 2)), rng.normal(size=(2, 30))
    low = [(u @ v).astype(np.float32) * s for s in (1.0, 3.0)]   # both ranks: rank 2, same column space
    states = _states(codec, 2, [(40, 30)])
    out = simulate(codec, [[low[0]], [low[1]]], states)
    np.testing.assert_allclose(out[0][0], (low[0] + low[1]) / 2, rtol=1e-4, atol=1e-4)
    # A full-rank gradient is approximated; the residual is exactly the part that was not represented.
    full = [[rng.normal(size=(40, 30)).astype(np.float32)] for _ in range(2)]
    states = _states(codec, 2, [(40, 30)])
    out = simulate(codec, full, states)
    for r in range(2):
        np.testing.assert_allclose(states[r].slots[0]["residual"], full[r][0] - out[r][0], atol=1e-5)
    assert np.linalg.matrix_rank(out[0][0], tol=1e-4) == 2


def test_powersgd_first_q_is_seeded_alike_on_every_rank_and_differs_by_seed():
    codec = get_codec("powersgd:2")
    a, b, c = (CodecState(codec, [(40, 30)], NumpyOps(), seed) for seed in (1, 1, 2))
    np.testing.assert_array_equal(a.slots[0]["q"], b.slots[0]["q"])
    assert not np.allclose(a.slots[0]["q"], c.slots[0]["q"])


@pytest.mark.parametrize("spec", REDUCING)
def test_state_dict_round_trip_continues_the_same_run(spec):
    codec = get_codec(spec)
    rng = np.random.default_rng(8)
    steps = [_grads(rng) for _ in range(3)]
    a = _states(codec)
    for g in steps[:2]:
        simulate(codec, g, a)
    saved = [st.state_dict() for st in a]
    b = _states(codec)
    for st, s in zip(b, saved):
        st.load_state_dict(s)
    out_a, out_b = simulate(codec, steps[2], a), simulate(codec, steps[2], b)
    for x, y in zip(out_a[0], out_b[0]):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="saved for 'fp16'"):
        b[0].load_state_dict({**saved[0], "codec": "fp16"})
    # The flat dict goes through np.savez / np.load (what checkpoints and elastic commits do) unchanged.
    import io

    buf = io.BytesIO()
    np.savez(buf, **saved[0])
    with np.load(io.BytesIO(buf.getvalue()), allow_pickle=False) as z:
        c = _states(codec, 1)[0]
        c.load_state_dict({k: z[k] for k in z.files})
    for k, v in c.state_dict().items():
        np.testing.assert_array_equal(v, saved[0][k])


def test_cast_codecs_halve_the_bytes_and_round_like_the_format():
    ops = NumpyOps()
    x = np.random.default_rng(9).normal(size=1000).astype(np.float32)
    codec = get_codec("fp16")
    wire = codec.encode(ops, x)
    assert wire.dtype.name == "float16" and wire.nbytes == x.nbytes // 2 == codec.wire_bytes(x.shape, 4)
    back = codec.decode(ops, wire, "float32")
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, x, rtol=2 ** -11, atol=1e-7)
    # bf16: each rank's values rounded once to bfloat16 (8 significant bits), then summed in float32.
    import ml_dtypes

    y = np.random.default_rng(10).normal(size=1000).astype(np.float32)
    bf16 = get_codec("bf16")
    counter = WireCounter()
    out = simulate(bf16, [[x], [y]], _states(bf16, 2, [x.shape]), counter=counter)[0][0]
    rounded = [v.astype(ml_dtypes.bfloat16).astype(np.float32) for v in (x, y)]
    np.testing.assert_array_equal(out, (rounded[0] + rounded[1]) / np.float32(2))
    np.testing.assert_allclose(out, (x + y) / 2, rtol=0, atol=2 ** -8 * np.abs([x, y]).max())
    assert counter.bytes == x.nbytes // 2 and counter.snapshot()["dtypes"] == ["int16"]
    assert get_codec("none").encode(ops, x) is x
    assert not get_codec("fp16").applies_to("int64")


def test_codec_state_of_finds_the_state_behind_an_optimizer():
    from types import SimpleNamespace

    from hvdsync.core.comm.codecs import codec_state_of

    state = _states(get_codec("topk:0.1"), 1)[0]
    assert codec_state_of(SimpleNamespace(reducer=SimpleNamespace(state=state))) is state
    assert codec_state_of(SimpleNamespace(reducer=SimpleNamespace(state=None))) is None   # a cast codec
    assert codec_state_of(object()) is None                                               # Horovod's own optimizer
