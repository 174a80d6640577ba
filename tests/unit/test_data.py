"""The synthetic task's difficulty (data.synthetic_spread) reaches the data the loader makes; the digits are
scikit-learn's, read without importing it."""
import subprocess
import sys

import numpy as np

from hvdsync.config import Config
from hvdsync.core.train.data import digits, load_synthetic, synthetic


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


def test_the_digits_are_scikit_learns_and_loading_them_does_not_import_it():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    ds = digits(test_fraction=0.25, seed=3)
    x = np.concatenate([ds.x_train, ds.x_test])
    y = np.concatenate([ds.y_train, ds.y_test])
    # The same 1,797 samples, scaled as before: each of scikit-learn's rows, with its label, is here once.
    assert x.shape == (1797, 64) and len(ds.x_test) == 449
    ours = sorted(zip(map(bytes, (x * 16).round().astype(np.uint8)), y.tolist()))
    theirs = sorted(zip(map(bytes, bunch.data.astype(np.uint8)), bunch.target.tolist()))
    assert ours == theirs
    # A worker that loads the digits pays neither scikit-learn's nor SciPy's import (1-1.5 s of CPU each time).
    code = ("import sys; from hvdsync.core.train.data import digits; digits(images=True); "
            "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
