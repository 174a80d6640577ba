"""The in-place fp16 hook of hvdsync's torch optimizer: the same numbers as the plain cast, no new tensors per step.

``hvd.DistributedOptimizer`` calls ``compress(p.grad)``, all-reduces the returned wire tensor in place and then
``p.grad.set_(decompress(wire, ctx))``. Here the all-reduce is played by hand (a sum of two ranks' float16 values,
as Horovod's float16 sum rounds it), so no workers are needed; tests/parallel/test_torch.py trains with it.
"""
import pytest
import torch

pytest.importorskip("horovod.torch")

from hvdsync.core.comm.codecs import WireCounter  # noqa: E402
from hvdsync.torch.compression import CodecCompressor  # noqa: E402


def _grads(seed):
    g = torch.Generator().manual_seed(seed)
    # two tensors of one shape (two biases in flight at once) and one of another
    return [torch.randn(64, 33, generator=g), torch.randn(17, generator=g), torch.randn(17, generator=g)]


def _reduce(hook, grads, peers):
    """One step: compress every gradient, 'all-reduce' (average with a peer's float16 values), decompress."""
    sent = [hook.compress(g) for g in grads]
    for (wire, _), peer in zip(sent, peers):
        wire.copy_(((wire.float() + peer.half().float()) / 2).half())   # what Horovod leaves in the wire tensor
    return sent, [hook.decompress(wire, ctx) for wire, ctx in sent]


def test_in_place_gives_the_plain_casts_numbers_in_the_gradients_own_storage():
    counter = WireCounter()
    in_place, plain = CodecCompressor("fp16", counter, in_place=True), CodecCompressor("fp16")
    peers = _grads(1)
    grads = _grads(0)
    storage = [g.data_ptr() for g in grads]
    _, expected = _reduce(plain, [g.clone() for g in grads], peers)
    sent, got = _reduce(in_place, grads, peers)
    assert [w.dtype for w, _ in sent] == [torch.float16] * 3          # float16 on the wire ...
    assert counter.bytes == 2 * sum(g.numel() for g in grads)          # ... and counted as such
    assert all(torch.equal(a, b) for a, b in zip(got, expected))        # bit for bit the plain cast's result
    assert [g.data_ptr() for g in got] == storage                      # written into the gradients themselves
    assert all(g.dtype == torch.float32 for g in got)
    assert len({w.data_ptr() for w, _ in sent}) == 3                   # two same-shape tensors: two buffers


def test_wire_buffers_are_reused_from_step_to_step():
    hook = CodecCompressor("fp16", in_place=True)
    first, _ = _reduce(hook, _grads(0), _grads(1))
    second, _ = _reduce(hook, _grads(2), _grads(3))                    # new gradient tensors, as after zero_grad
    assert {w.data_ptr() for w, _ in second} == {w.data_ptr() for w, _ in first}


def test_without_a_cast_and_out_of_place_nothing_changes():
    x = torch.randn(8)
    wire, ctx = CodecCompressor("none", in_place=True).compress(x)
    assert wire is x and ctx == "float32"                              # float32 goes as it is, in place already
    hook = CodecCompressor("fp16")                                     # hvd.allreduce(x, compression=hook)
    wire, ctx = hook.compress(x)
    out = hook.decompress(wire, ctx)
    assert out.data_ptr() != x.data_ptr() and torch.equal(out, x.half().float())
