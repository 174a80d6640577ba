"""hvdsync.core.train.scaling.warmup_lr: Goyal et al.'s ramp, the rule the Keras callback (and a PyTorch loop) applies."""
import pytest

from hvdsync.core.train._scaling import warmup_lr


def test_ramp_starts_at_the_one_worker_rate_and_reaches_the_target_at_the_stated_epoch():
    lrs = [warmup_lr(0.8, 4, e / 4, 3) for e in range(17)]  # quarter epochs, 4 workers, 3 epochs of warm-up
    assert lrs[0] == pytest.approx(0.2)
    assert all(a < b for a, b in zip(lrs[:12], lrs[1:13]))
    assert lrs[6] == pytest.approx(0.2 + 0.6 * 1.5 / 3)
    assert lrs[12:] == pytest.approx([0.8] * 5)


@pytest.mark.parametrize("world, warmup", [(1, 3), (8, 0)])
def test_nothing_to_warm_up(world, warmup):
    assert warmup_lr(0.1, world, 0.0, warmup) == pytest.approx(0.1)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="warmup_epochs: -1"):
        warmup_lr(0.1, 2, 0.0, -1)
    with pytest.raises(ValueError, match="world_size: 0"):
        warmup_lr(0.1, 0, 0.0, 1)
