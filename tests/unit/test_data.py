"""The synthetic task's difficulty (data.synthetic_spread) reaches the data the loader makes."""
import numpy as np

from hvdsync.config import Config
from hvdsync.core.train.data import load_synthetic, synthetic


def _centre_gap(ds) -> float:
    """Mean distance between the class means of the training set."""
    means = np.stack([ds.x_train[ds.y_train == c].mean(axis=0) for c in range(ds.n_classes)])
    return float(np.mean([np.linalg.norm(a - b) for i, a in enumerate(means) for b in means[i + 1:]]))


def test_the_spread_sets_how_far_apart_the_classes_lie():
    easy, hard = synthetic(2048, 256, seed=0), synthetic(2048, 256, seed=0, spread=0.12)
    # Centres ~spread * sqrt(2 * features) apart (32 and 2.7 here), plus the noise left in a class mean.
    assert _centre_gap(easy) > 25 > 5 > _centre_gap(hard)
    np.testing.assert_array_equal(easy.y_train, hard.y_train)   # the same labels and samples: only the centres move


def test_the_loader_takes_the_spread_from_the_config():
    cfg = Config.from_dict({"data": {"dataset": "synthetic", "synthetic_samples": 512, "synthetic_features": 32,
                                     "synthetic_spread": 0.2}})
    np.testing.assert_array_equal(load_synthetic(cfg.data).x_train, synthetic(512, 32, spread=0.2).x_train)
    assert Config.from_dict({}).data.synthetic_spread == 1.5   # the default task is the one it always was
