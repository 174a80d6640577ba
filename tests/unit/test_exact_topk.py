"""The torch codecs' top-k selection (candidates above a sampled threshold, then top-k of those) against torch.topk
over the whole vector: the same indices in the same order, wherever the values are distinct, including where the
sample misleads and it falls back."""
import pytest
import torch

from hvdsync.torch.compression import _SAMPLE, _SAMPLE_SEED, exact_topk


def _vectors():
    g = torch.Generator().manual_seed(7)
    n = 1_000_003
    yield "normal", torch.randn(n, generator=g).abs()
    yield "heavy tail", torch.randn(n, generator=g).pow(3).abs()
    # Half the gradient exactly zero (inputs that are always 0, as some digits pixels): the sample sees many zeros.
    yield "half zeros", torch.cat([torch.zeros(n // 2), torch.rand(n - n // 2, generator=g) + 1e-3])
    # Large values exactly where the sample looks (its generator is seeded with a constant): the threshold lands far
    # above the k-th largest, fewer than k candidates pass, and the full torch.topk must take over.
    sampled = torch.randint(0, n, (_SAMPLE,), generator=torch.Generator().manual_seed(_SAMPLE_SEED))
    misleading = torch.rand(n, generator=g) * 1e-3
    misleading[sampled] += 10.0 + torch.rand(_SAMPLE, generator=g)
    yield "misleading sample", misleading


@pytest.mark.parametrize("ratio", [0.01, 0.001, 0.1])
def test_the_same_indices_in_the_same_order_as_torch_topk(ratio):
    for name, x in _vectors():
        k = max(1, int(ratio * x.numel()))
        want = torch.topk(x, k).indices
        got = exact_topk(x, k)
        values_equal = torch.equal(x[got], x[want])
        distinct = torch.unique(x[want]).numel() == k
        assert values_equal, (name, ratio)
        if distinct and name != "half zeros":
            assert torch.equal(got, want), (name, ratio)
        else:
            assert set(got.tolist()) <= set(torch.nonzero(x >= x[want[-1]]).squeeze(1).tolist()), (name, ratio)


def test_small_tensors_and_large_k_take_torch_topk_as_it_is():
    x = torch.randn(4 * _SAMPLE - 1).abs()
    assert torch.equal(exact_topk(x, 10), torch.topk(x, 10).indices)
    y = torch.randn(400_000).abs()
    assert torch.equal(exact_topk(y, 60_000), torch.topk(y, 60_000).indices)


def test_the_choice_does_not_depend_on_the_global_random_state():
    x = torch.randn(500_000).abs()
    torch.manual_seed(1)
    a = exact_topk(x, 5000)
    torch.manual_seed(2)
    torch.rand(100)
    assert torch.equal(a, exact_topk(x, 5000))
