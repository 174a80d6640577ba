"""hvdlab.torch.passes: what autograd holds for the backward (parameters and activations apart) and the time of each pass."""
import torch

from hvdlab.torch.passes import pass_seconds, saved_bytes
from hvdsync.torch.models import mlp


def _batch(n: int):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_activations_grow_with_the_batch_and_parameters_do_not():
    torch.manual_seed(0)
    model = mlp(64, 256, 10)
    small, big = saved_bytes(model, *_batch(8)), saved_bytes(model, *_batch(32))
    # Per sample: the first Linear's input (64 floats), ReLU's output (256, also the second Linear's input, counted
    # once), the log-softmax's output (10) and the int64 target; the second weight is a parameter.
    assert big["activations"] - small["activations"] == (32 - 8) * ((64 + 256 + 10) * 4 + 8)
    assert big["parameters"] == small["parameters"] > 0
    assert all(p.grad is None for p in model.parameters())   # the gradients it made are dropped again
    x, y = _batch(32)   # a micro-batch sliced from the batch (a view of its storage) counts its own bytes only
    assert saved_bytes(model, x[:8], y[:8])["activations"] == saved_bytes(model, x[:8].clone(), y[:8].clone())["activations"]


def test_bf16_autocast_saves_fewer_activation_bytes_than_fp32():
    torch.manual_seed(0)
    model = mlp(64, 256, 10)
    fp32, bf16 = saved_bytes(model, *_batch(32)), saved_bytes(model, *_batch(32), dtype=torch.bfloat16)
    assert set(fp32["dtypes"]) == {"float32", "int64"} and "bfloat16" in bf16["dtypes"]
    assert bf16["activations"] < fp32["activations"]


def test_the_passes_are_timed_apart_and_leave_no_gradient():
    torch.manual_seed(0)
    model = mlp(64, 256, 10)
    got = pass_seconds(model, *_batch(32), steps=3, warmup=1)
    assert set(got) == {"forward", "backward"} and got["forward"] > 0 and got["backward"] > 0
    assert all(p.grad is None for p in model.parameters())
