"""The settings are checked once, at the edge: an adapter takes the checked SyncConfig as it is and builds its codec
once per optimizer; a script's keyword shortcuts go through one helper for both frameworks (hvdsync.adapter)."""
from __future__ import annotations

import pytest

from hvdsync.adapter import sync_settings
from hvdsync.config import Config, ConfigError, SyncConfig


@pytest.fixture
def counted(monkeypatch):
    """How many times a SyncConfig is checked and a codec is built from a string, from here on."""
    from hvdsync.core.comm.codecs import registry
    from hvdsync.config import sections

    calls = {"checks": 0, "codecs": 0}
    check, build = sections.SyncConfig.__post_init__, registry.get_codec

    def counted_check(self):
        calls["checks"] += 1
        check(self)

    def counted_build(spec):
        calls["codecs"] += 1
        return build(spec)

    monkeypatch.setattr(sections.SyncConfig, "__post_init__", counted_check)
    for module in ("hvdsync.torch.optimizer", "hvdsync.tensorflow.optimizer"):
        monkeypatch.setattr(f"{module}.get_codec", counted_build)
    return calls


def test_a_checked_sync_config_is_taken_as_it_is():
    sync = Config.from_dict({"sync": {"compression": "fp16", "accumulate": 4}}).sync
    assert sync_settings(sync) is sync


def test_keywords_win_and_are_checked_like_the_config():
    sync = SyncConfig(compression="fp16")
    assert sync_settings(sync, accumulate=2) == SyncConfig(compression="fp16", accumulate=2)
    assert sync.accumulate == 1  # the caller's settings are not changed
    assert sync_settings(op="sum").op == "sum"
    with pytest.raises(ConfigError, match=r"^sync.accumulate: 0 is not allowed"):
        sync_settings(sync, accumulate=0)
    with pytest.raises(ConfigError, match=r"^sync: a Config is not allowed; expected a SyncConfig"):
        sync_settings(Config())


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_horovods_own_constants_are_accepted_for_both_frameworks(framework):
    import importlib

    hvd = importlib.import_module(f"horovod.{framework}")
    sync = sync_settings(op=hvd.Sum, compression=hvd.Compression.fp16, horovod=hvd)
    assert (sync.op, sync.compression) == ("sum", "fp16")


def test_torch_builds_the_codec_once_and_checks_nothing_again(counted):
    import torch

    import hvdsync.torch as hs

    sync = SyncConfig(compression="fp16", accumulate=2)
    model = torch.nn.Linear(4, 2)
    counted.update(checks=0, codecs=0)
    hs.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, sync)
    assert counted == {"checks": 0, "codecs": 1}


def test_tensorflow_builds_the_codec_once_and_checks_nothing_again(counted):
    import keras

    import hvdsync.tensorflow as hs

    sync = SyncConfig(compression="fp16", accumulate=2)
    counted.update(checks=0, codecs=0)
    opt = hs.distributed_optimizer(keras.optimizers.SGD(0.1), None, sync)
    assert counted == {"checks": 0, "codecs": 1}
    assert opt.sync is sync


def test_keras_averaging_is_applied_in_scale_loss_only():
    import keras

    import hvdsync.tensorflow as hs

    # Keras' fit passes each batch-mean loss through scale_loss: divided by accumulate there, and only there (the
    # optimizer applies the sum of the passes, as PyTorch's does).
    assert float(hs.distributed_optimizer(keras.optimizers.SGD(0.1), accumulate=4).scale_loss(8.0)) == 2.0
    assert float(hs.distributed_optimizer(keras.optimizers.SGD(0.1)).scale_loss(8.0)) == 8.0


def test_a_saved_tensorflow_optimizer_reads_back_its_settings():
    import keras

    import hvdsync.tensorflow as hs
    from hvdsync.tensorflow.optimizer import DistributedOptimizer
    from hvdsync.tensorflow.schemes import LocalSGDOptimizer

    opt = hs.distributed_optimizer(keras.optimizers.SGD(0.1), sync=SyncConfig(compression="fp16", accumulate=3),
                                   seed=4)
    back = DistributedOptimizer.from_config(opt.get_config())
    assert (back.sync, back.seed, back.codec.wire_dtype) == (opt.sync, 4, "float16")
    local = hs.distributed_optimizer(keras.optimizers.SGD(0.1), sync=SyncConfig(mode="local_sgd", period=4))
    assert isinstance(local, LocalSGDOptimizer)
    assert LocalSGDOptimizer.from_config(local.get_config()).period == 4
