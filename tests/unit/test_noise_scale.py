"""The gradient noise scale estimator (hvdsync.core.noise_scale) on synthetic gradients with known noise."""
import numpy as np
import pytest

from hvdsync.core.noise_scale import NoiseScale, noise_estimates

DIM, WORLD, SMALL = 50, 4, 8          # gradient size, ranks, samples per rank (the global batch is 32)


def _steps(g2: float, trace: float, steps: int, seed: int = 0):
    """Per step: each rank's squared norm over its SMALL samples, and the all-reduced gradient's squared norm.
    True gradient G with |G|^2 = g2; per-sample noise N(0, s^2 I) with tr(Sigma) = DIM s^2 = trace."""
    rng = np.random.default_rng(seed)
    G = np.full(DIM, np.sqrt(g2 / DIM))
    per_sample_var = trace / DIM
    for _ in range(steps):
        ranks = G + rng.normal(0.0, np.sqrt(per_sample_var / SMALL), size=(WORLD, DIM))  # mean of SMALL samples
        yield (ranks ** 2).sum(1), float((ranks.mean(0) ** 2).sum())


@pytest.mark.parametrize("g2,trace", [(1.0, 64.0), (0.5, 100.0), (4.0, 8.0)])
def test_the_estimates_are_unbiased_and_the_average_finds_the_known_noise_scale(g2, trace):
    steps = list(_steps(g2, trace, 4000))
    estimates = np.array([noise_estimates(small, SMALL, big, SMALL * WORLD) for small, big in steps])
    assert estimates[:, 0].mean() == pytest.approx(g2, rel=0.1)        # |G|^2
    assert estimates[:, 1].mean() == pytest.approx(trace, rel=0.1)     # tr(Sigma)
    ns = NoiseScale(decay=0.999)
    for small, big in steps:
        ns.update(small, SMALL, big, SMALL * WORLD)
    assert ns.b_noise == pytest.approx(trace / g2, rel=0.15)            # B_noise = tr(Sigma) / |G|^2


def test_one_step_is_noisy_the_average_is_not():
    steps = list(_steps(1.0, 64.0, 400, seed=1))
    single = [noise_estimates(s, SMALL, b, SMALL * WORLD) for s, b in steps[:50]]
    ratios = [t / g for g, t in single if g > 0]
    assert max(ratios) / min(ratios) > 3                                # single-step ratios scatter widely
    ns = NoiseScale(decay=0.99)
    for s, b in steps:
        ns.update(s, SMALL, b, SMALL * WORLD)
    assert ns.b_noise == pytest.approx(64.0, rel=0.35)


def test_bad_batches_and_decay_fail_naming_them():
    with pytest.raises(ValueError, match="small_batch, big_batch: 8, 8 are not allowed"):
        noise_estimates([1.0], 8, 1.0, 8)
    with pytest.raises(ValueError, match="decay: 1.0 is not allowed"):
        NoiseScale(decay=1.0)
    with pytest.raises(ValueError, match="no step was added yet"):
        _ = NoiseScale().b_noise
