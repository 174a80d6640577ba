"""Momentum correction for the sparsifiers (DGC, Lin et al. 2018): the core maths on numpy, and how each adapter
moves SGD's momentum out of the optimizer into the codec (``sync.momentum_correction``)."""
import numpy as np
import pytest

from hvdsync.config import Config, ConfigError
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.core.comm.codecs.state import CodecState
from hvdlab.codecs_numpy import NumpyOps, simulate

SHAPES = [(20, 10), (10,)]


def _codec(spec, momentum=0.9, nesterov=False):
    codec = get_codec(spec)
    codec.correct_momentum(momentum, nesterov)
    return codec


@pytest.mark.parametrize("spec,nesterov", [("topk:0.1", False), ("topk:0.1", True), ("randk:0.2", False)])
def test_the_residual_holds_velocity_and_sent_coordinates_restart_their_velocity(spec, nesterov):
    m = 0.9
    codec = _codec(spec, m, nesterov)
    states = [CodecState(codec, SHAPES, NumpyOps()) for _ in range(2)]
    rng = np.random.default_rng(0)
    u = [[np.zeros(s, np.float32) for s in SHAPES] for _ in range(2)]
    res = [[np.zeros(s, np.float32) for s in SHAPES] for _ in range(2)]
    for _step in range(4):
        grads = [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(2)]
        out = simulate(codec, grads, states)
        for i in range(len(SHAPES)):
            sent_sum = np.zeros(SHAPES[i], np.float32)
            for r in range(2):
                velocity = m * u[r][i] + grads[r][i]                                 # u = m u + g, locally
                x = res[r][i] + (grads[r][i] + m * velocity if nesterov else velocity)
                slots = states[r].slots[i]
                sent = slots["residual"] == 0
                assert sent.sum() == codec.k(x.size)
                np.testing.assert_allclose(slots["residual"][~sent], x[~sent], rtol=1e-6)   # kept: velocity
                assert not slots["velocity"][sent].any()                                # masked where sent
                np.testing.assert_allclose(slots["velocity"][~sent], velocity[~sent], rtol=1e-6)
                sent_sum[sent] += x[sent]
                u[r][i], res[r][i] = slots["velocity"].copy(), slots["residual"].copy()
            np.testing.assert_allclose(out[0][i], sent_sum / 2, rtol=1e-5, atol=1e-6)   # the average of what was sent


def test_velocity_is_saved_with_the_state():
    codec = _codec("topk:0.1")
    a = CodecState(codec, SHAPES, NumpyOps())
    simulate(codec, [[np.ones(s, np.float32) for s in SHAPES]] * 2, [a, CodecState(codec, SHAPES, NumpyOps())])
    saved = a.state_dict()
    assert {"0.velocity", "1.velocity"} <= set(saved) and saved["0.velocity"].any()
    b = CodecState(_codec("topk:0.1"), SHAPES, NumpyOps())
    b.load_state_dict(saved)
    np.testing.assert_array_equal(b.state_dict()["0.velocity"], saved["0.velocity"])


def test_only_the_sparsifiers_with_error_feedback_take_momentum():
    assert get_codec("topk:0.01").takes_momentum(True) and get_codec("randk:0.1").takes_momentum(True)
    assert not get_codec("topk:0.01").takes_momentum(False)
    for spec in ("none", "fp16", "bf16", "int8", "powersgd:2"):
        assert not get_codec(spec).takes_momentum(True), spec
    assert "velocity" not in get_codec("topk:0.01").slots((4,), 0, 0)   # no momentum taken: no extra state
    with pytest.raises(ConfigError, match="sync.momentum_correction"):
        Config.from_dict({"sync": {"momentum_correction": "yes"}})


def test_torch_sgd_hands_its_momentum_and_weight_decay_to_the_codec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("horovod.torch")
    from hvdsync.torch.compression import take_sgd_momentum

    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD([{"params": [params[0]], "weight_decay": 1e-4}, {"params": [params[1]]}], lr=0.1,
                          momentum=0.9, nesterov=True)
    codec = get_codec("topk:0.01")
    assert take_sgd_momentum(opt, codec, params) == [1e-4, 0.0]
    assert (codec.momentum, codec.nesterov) == (0.9, True)
    assert all(g["momentum"] == 0 and g["weight_decay"] == 0 and not g["nesterov"] for g in opt.param_groups)
    assert take_sgd_momentum(torch.optim.Adam(params, lr=0.1), get_codec("topk:0.01"), params) is None
    mixed = torch.optim.SGD([{"params": [params[0]], "momentum": 0.5}, {"params": [params[1]]}], lr=0.1,
                            momentum=0.9)
    with pytest.raises(ValueError, match="sync.momentum_correction"):
        take_sgd_momentum(mixed, get_codec("topk:0.01"), params)


def test_keras_sgd_hands_its_momentum_to_the_codec_also_under_loss_scaling():
    keras = pytest.importorskip("keras")
    pytest.importorskip("horovod.tensorflow")
    from hvdsync.tensorflow.compression import take_sgd_momentum

    sgd = keras.optimizers.SGD(0.1, momentum=0.9)
    codec = get_codec("topk:0.01")
    assert take_sgd_momentum(keras.optimizers.LossScaleOptimizer(sgd), codec)
    assert codec.momentum == pytest.approx(0.9) and sgd.momentum == 0
    assert not take_sgd_momentum(keras.optimizers.Adam(0.1), get_codec("topk:0.01"))


def test_powersgd_views_a_convolution_alike_in_either_framework_layout():
    from hvdsync.core.comm.codecs.powersgd import matrix_shape

    assert matrix_shape((64, 32, 3, 3)) == (64, 288)        # PyTorch (out, in, kh, kw): out x (in kh kw)
    assert matrix_shape((3, 3, 32, 64)) == (288, 64)        # Keras (kh, kw, in, out): the same matrix, transposed
    assert matrix_shape((64, 10)) == (64, 10) and matrix_shape((10,)) == (10, 1)
    codec = get_codec("powersgd:2")
    assert codec.wire_bytes((64, 32, 3, 3), 4) == codec.wire_bytes((3, 3, 32, 64), 4) == 2 * (64 + 288) * 4
