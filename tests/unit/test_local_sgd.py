"""Local SGD in the core: the schedule (when to all-reduce gradients, when to average), the rounds it implies,
and the config errors for impossible combinations (before any worker starts)."""
import doctest

import pytest

from hvdsync.config import Config, ConfigError
from hvdsync.core.comm.schemes import local_sgd


def test_docstring_examples():
    assert doctest.testmod(local_sgd).failed == 0


@pytest.mark.parametrize("steps,period,warmup", [(88, 1, 0), (88, 4, 0), (88, 8, 0), (90, 4, 8), (5, 4, 8), (7, 3, 2)])
def test_the_schedule_communicates_once_per_period_after_the_synchronous_start(steps, period, warmup):
    sync = [t for t in range(1, steps + 1) if local_sgd.synchronous(t, warmup)]
    avg = [t for t in range(1, steps + 1) if local_sgd.averages_after(t, period, warmup)]
    assert sync == list(range(1, min(steps, warmup) + 1))
    assert not set(sync) & set(avg)                              # a synchronous step never averages as well
    assert all(b - a == period for a, b in zip(avg, avg[1:]))    # evenly spaced
    assert len(sync) + len(avg) == local_sgd.rounds(steps, period, warmup)
    if warmup == 0:
        assert local_sgd.rounds(steps, period) == steps // period


def test_period_one_without_warmup_communicates_every_step_like_synchronous_sgd():
    assert local_sgd.rounds(88, 1) == 88
    assert all(local_sgd.averages_after(t, 1) for t in range(1, 10))


@pytest.mark.parametrize("sync,message", [
    ({"mode": "local_sgd", "period": 0}, "sync.period: 0 is not allowed; expected an integer >= 1"),
    ({"mode": "local_sgd", "period": -4}, "sync.period: -4 is not allowed"),
    ({"mode": "local_sgd", "warmup_steps": -1}, "sync.warmup_steps: -1 is not allowed"),
    ({"mode": "local_sgd", "compression": "fp16"}, "sync.compression: 'fp16' is not allowed with sync.mode 'local_sgd'"),
    ({"mode": "local_sgd", "compression": "topk:0.01"}, "sync.compression: 'topk:0.01' is not allowed with sync.mode"),
    ({"mode": "local_sgd", "op": "sum"}, "sync.op: 'sum' is not allowed with sync.mode 'local_sgd'; choose one of: average"),
    ({"mode": "allreduce", "warmup_steps": 10}, "sync.warmup_steps: 10 is not allowed with sync.mode 'allreduce'"),
    ({"mode": "gossip", "warmup_steps": 10}, "sync.warmup_steps: 10 is not allowed with sync.mode 'gossip'"),
])
def test_bad_local_sgd_settings_fail_in_the_config_naming_the_field(sync, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        Config.from_dict({"sync": sync})


def test_local_sgd_is_allowed_for_both_frameworks_with_accumulation():
    # Accumulation sums micro-batches inside one step; the period counts steps, so none straddles an averaging.
    for framework in ("torch", "tensorflow"):
        cfg = Config.from_dict({"sync": {"mode": "local_sgd", "period": 4, "warmup_steps": 8, "accumulate": 2},
                                "train": {"framework": framework}})
        assert (cfg.sync.period, cfg.sync.warmup_steps, cfg.sync.accumulate) == (4, 8, 2)
    with pytest.raises(ConfigError, match="^train.precision: 'fp16' is not allowed with sync.mode 'local_sgd'"):
        Config.from_dict({"sync": {"mode": "local_sgd"}, "train": {"precision": "fp16"}})


def test_the_monitor_raises_no_divergence_alarm_for_modes_whose_ranks_differ_by_design():
    import numpy as np

    from hvdsync.core.telemetry.monitor import Alarms
    from hvdsync.core.comm.schemes import MODES
    from hvdsync.core.telemetry.tracking import make_tracker

    assert {name: m.lockstep for name, m in MODES.items()} == {
        "allreduce": True, "ps": True, "gossip": False, "local_sgd": False}
    apart = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    tracker = make_tracker(Config.from_dict({"tracking": {"enabled": False}}).tracking, rank=0)
    quiet = Alarms(tracker, check_divergence=MODES["local_sgd"].lockstep).check(1, apart, [1.0, 1.0])
    assert quiet["monitor/param_spread"] == 1.0 and "alarm/divergence" not in quiet
    with pytest.warns(Warning, match="rank 1's parameters differ"):
        assert Alarms(tracker).check(1, apart, [1.0, 1.0])["alarm/divergence"] == 1.0
