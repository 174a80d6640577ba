"""The staleness simulation on the real PyTorch MLP (one process): tau = 0 is plain synchronous SGD over the same
batches, and a stale run differs from it."""
import torch
import torch.nn.functional as F

from hvdsync.config import Config
from hvdsync.datasets import load
from hvdsync.registry import build_model
from hvdlab.torch import staleness


def test_tau_zero_is_a_plain_sgd_loop_over_the_same_batches_and_staleness_changes_the_result():
    cfg = Config.from_dict({"train": {"lr": 0.3, "epochs": 1, "seed": 4}})
    data = load(cfg.data, cfg.train.seed)
    out = staleness.simulate(cfg, taus=(0, 8), dampings=("none", "staleness"), data=data)
    # The same run by hand: the registered MLP from the same seed, torch.optim.SGD over the plan's batches.
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, data, "torch")
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
    x, y = torch.as_tensor(data.x_train, dtype=torch.float32), torch.as_tensor(data.y_train)
    for idx in staleness._batches(data, cfg.data.batch_size, 1, cfg.train.seed):
        idx = torch.as_tensor(idx)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    with torch.no_grad():
        expected = float((model(torch.as_tensor(data.x_test, dtype=torch.float32)).argmax(1)
                          == torch.as_tensor(data.y_test)).float().mean())
    assert out[("none", 0)]["accuracy"] == out[("staleness", 0)]["accuracy"] == expected > 0.3   # chance: 0.1
    assert out[("none", 0)]["steps"] == 43                           # 1348 samples in batches of 32
    assert out[("none", 8)]["staleness"] > 7                         # 8 late, but for the first 8 updates
    assert out[("none", 8)]["accuracy"] != expected
