"""The framework kernels run the core's codec maths: PyTorch's and TensorFlow's Ops give what numpy's give.

Each codec runs in a simulated world of 2 ranks (hvdlab.codecs_numpy.simulate) once with numpy's kernels
and once with the framework's, on the same gradients. Random draws are the one part that differs by design (each
framework has its own generator), so here every Ops draws numpy's noise; the seeding itself is tested on real
workers (tests/parallel). Equal to float32 rounding: the same maths, in another library's kernels.
"""
import numpy as np
import pytest

from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.core.comm.codecs.state import CodecState
from hvdlab.codecs_numpy import NumpyOps, simulate

SHAPES = [(32, 24), (24,), (5, 3, 4), (10,)]
# "<spec> momentum|nesterov <m>": the sparsifier with SGD's momentum moved into it (momentum correction).
SPECS = ["fp16", "bf16", "topk:0.1", "randk:0.1", "int8", "powersgd:2", "topk:0.1 nesterov 0.9",
         "randk:0.1 momentum 0.9"]


def _codec(spec):
    name, *momentum = spec.split()
    codec = get_codec(name)
    if momentum:
        codec.correct_momentum(float(momentum[1]), momentum[0] == "nesterov")
    return codec


def _torch_ops():
    pytest.importorskip("horovod.torch")
    from hvdsync.torch.compression import TorchOps

    return TorchOps()


def _tf_ops():
    pytest.importorskip("horovod.tensorflow")
    from hvdsync.tensorflow.compression import TFOps

    return TFOps()


def _numpy_noise(ops):
    """The same ops, drawing numpy's noise (converted to the framework's tensors)."""
    reference = NumpyOps()

    class SharedNoise(type(ops)):
        def uniform(self, n, seed, step):
            return self.from_numpy(reference.uniform(n, seed, int(step)))

    return SharedNoise()


@pytest.fixture(scope="module", params=["torch", "tensorflow"])
def ops(request):
    return _numpy_noise(_torch_ops() if request.param == "torch" else _tf_ops())


@pytest.mark.parametrize("spec", SPECS)
def test_framework_kernels_equal_the_core_maths(ops, spec):
    codec = _codec(spec)
    rng = np.random.default_rng(0)
    reference = NumpyOps()
    states = {name: [CodecState(codec, SHAPES, o, seed=5) for _ in range(2)]
              for name, o in (("numpy", reference), ("framework", ops))}
    for _step in range(3):
        grads = [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(2)]
        if codec.cast:
            for g in grads[0]:
                want = codec.decode(reference, codec.encode(reference, g), "float32")
                got = ops.to_numpy(codec.decode(ops, codec.encode(ops, ops.from_numpy(g)), "float32"))
                assert ops.dtype_name(codec.encode(ops, ops.from_numpy(g))) == codec.wire_dtype
                np.testing.assert_array_equal(got, want)
            continue
        counters = {"numpy": WireCounter(), "framework": WireCounter()}
        want = simulate(codec, grads, states["numpy"], seed=5, counter=counters["numpy"])
        got = simulate(codec, [[ops.from_numpy(g) for g in r] for r in grads], states["framework"], seed=5,
                       ops=ops, counter=counters["framework"])
        for r in range(2):
            for w, g in zip(want[r], got[r]):
                np.testing.assert_allclose(ops.to_numpy(g), w, rtol=1e-4, atol=1e-5)
            sw, sg = states["numpy"][r].state_dict(), states["framework"][r].state_dict()
            assert sw.keys() == sg.keys() and sw["codec"] == sg["codec"] == codec.spec
            for name in set(sw) - {"codec"}:
                np.testing.assert_allclose(sg[name], sw[name], rtol=1e-4, atol=1e-5, err_msg=name)
        assert counters["numpy"].snapshot() == counters["framework"].snapshot()


def test_every_ops_has_every_kernel_of_the_protocol(ops):
    from hvdsync.core.comm.codecs.base import Ops

    kernels = {name for name in vars(Ops) if not name.startswith("_")}
    assert kernels <= set(dir(NumpyOps)) and kernels <= set(dir(ops)), kernels - set(dir(ops))


@pytest.mark.parametrize("which", ["numpy", "framework"])
def test_the_in_place_state_kernels(ops, which):
    """add_into, sub_into and zero_at change the slot (in place where the framework can) and nothing else: the
    value add_into returns is the slot's new value; the tensor added is left as it was."""
    o = NumpyOps() if which == "numpy" else ops
    slot = o.slot(np.arange(12, dtype=np.float32).reshape(3, 4))
    x = o.from_numpy(np.full(12, 0.5, np.float32))            # another shape of the same size, as the codecs pass
    value = o.add_into(slot, x)
    np.testing.assert_array_equal(o.to_numpy(value), np.arange(12).reshape(3, 4) + 0.5)
    np.testing.assert_array_equal(o.to_numpy(x), np.full(12, 0.5))
    o.sub_into(slot, o.from_numpy(np.ones((3, 4), np.float32)))
    o.zero_at(slot, o.from_numpy(np.array([0, 5, 11], np.int32)))
    want = np.arange(12, dtype=np.float32) - 0.5
    want[[0, 5, 11]] = 0.0
    np.testing.assert_array_equal(o.to_numpy(o.read(slot)), want.reshape(3, 4))


def test_matmul_into_writes_into_the_gradient_only_where_inputs_are_reused():
    """PowerSGD's decode: with reuse_inputs (CodecOptimizer's own gradients) a @ b lands in the gradient's memory,
    viewed as the matrix; a caller's tensor is never written otherwise, nor one that does not fit."""
    pytest.importorskip("horovod.torch")
    import torch

    from hvdsync.torch.compression import TorchOps

    a, b = torch.randn(6, 2), torch.randn(2, 4)
    for reuse in (False, True):
        grad = torch.zeros(2, 3, 4)               # a 3-D gradient whose matrix view is 6 x 4
        out = TorchOps(reuse_inputs=reuse).matmul_into(grad, a, b)
        torch.testing.assert_close(out, a @ b)
        assert (out.data_ptr() == grad.data_ptr()) is reuse
        assert bool((grad == 0).all()) is not reuse
    wrong = torch.zeros(5, 4)
    out = TorchOps(reuse_inputs=True).matmul_into(wrong, a, b)
    assert out.data_ptr() != wrong.data_ptr() and bool((wrong == 0).all())


def test_powersgd_decodes_into_codec_optimizers_gradients():
    """A rank-2 PowerSGD step of CodecOptimizer (1 rank): the decoded gradient is the parameter's own .grad storage,
    and equals the reducer's result on an untouched copy of the same gradients."""
    hvd = pytest.importorskip("horovod.torch")
    import torch

    from hvdsync.config import Config
    from hvdsync.core.comm.codecs.registry import get_codec
    from hvdsync.torch.compression import CodecOptimizer, CodecReducer

    hvd.init()
    sync = Config.from_dict({"sync": {"compression": "powersgd:2"}}).sync
    layer = torch.nn.Linear(16, 12)
    layer.weight.grad, layer.bias.grad = torch.randn(12, 16), torch.randn(12)
    storage = layer.weight.grad.data_ptr()
    copies = [layer.bias.grad.clone(), layer.weight.grad.clone()]        # by name: bias, weight
    reference = CodecReducer(get_codec("powersgd:2"), [(12,), (12, 16)], sync).reduce(copies)
    opt = CodecOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), layer.named_parameters(), sync,
                         get_codec("powersgd:2"))
    opt.synchronize()
    assert layer.weight.grad.data_ptr() == storage
    torch.testing.assert_close(layer.weight.grad, reference[1])
    torch.testing.assert_close(layer.bias.grad, reference[0])
