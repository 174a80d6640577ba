"""Registries (models, data sets, callbacks by name, user plugins) and Horovod's knobs applied by the one core rule."""
import io

import numpy as np
import pytest

from hvdsync.config import Config, ConfigError, SyncConfig
from hvdsync.datasets import load
from hvdsync.core.train.runtime import applied_params, apply_horovod_env, report_knobs
from hvdsync.registry import DATASETS, MODELS, make_callbacks


def test_builtin_names_are_registered_without_importing_a_framework():
    assert {"mlp", "cnn"} <= set(MODELS.names("torch"))
    assert "mlp" in MODELS.names("tensorflow")
    assert {"digits", "digits_images", "synthetic", "synthetic_images"} <= set(DATASETS.names())


def test_a_user_plugin_registers_a_model_and_a_data_set_by_name(tmp_path, monkeypatch):
    (tmp_path / "my_plugin.py").write_text(
        "import numpy as np\n"
        "from hvdsync.core.train.data import Dataset\n"
        "from hvdsync.registry import register_dataset, register_model\n"
        "@register_dataset('stripes')\n"
        "def stripes(data_cfg, seed):\n"
        "    x = np.eye(4, dtype=np.float32).repeat(5, 0); y = np.arange(20) % 4\n"
        "    return Dataset(x, y, x, y, 4)\n"
        "@register_model('tiny', framework='torch')\n"
        "def tiny(cfg, data):\n"
        "    return ('tiny', data.input_shape, data.n_classes)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = Config.from_dict({"data": {"dataset": "stripes"}, "train": {"model": "tiny", "plugins": ["my_plugin"]}})
    data = load(cfg.data)
    assert data.input_shape == (4,) and data.n_classes == 4
    assert MODELS.get("tiny", "torch")(cfg, data) == ("tiny", (4,), 4)
    with pytest.raises(ConfigError, match="train.model: 'tiny' is not allowed for tensorflow; choose one of"):
        Config.from_dict({"train": {"framework": "tensorflow", "model": "tiny", "plugins": ["my_plugin"]}})


def test_a_user_plugin_registers_a_callback_that_the_loop_is_handed(tmp_path, monkeypatch):
    (tmp_path / "my_callbacks.py").write_text(
        "from hvdsync.core.train.callbacks import Callback\n"
        "from hvdsync.registry import register_callback\n"
        "@register_callback('counter')\n"
        "class Counter(Callback):\n"
        "    def __init__(self, cfg): self.epochs = cfg.train.epochs; self.seen = []\n"
        "    def on_step_begin(self, ctx): self.seen.append(ctx.job_step)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = Config.from_dict({"train": {"epochs": 3, "plugins": ["my_callbacks"], "callbacks": ["counter"]}})
    (made,) = make_callbacks(cfg)
    assert type(made).__name__ == "Counter" and made.epochs == 3   # one per name, made for this config
    assert make_callbacks(Config()) == []


def test_the_job_step_counts_the_steps_before_a_resume():
    from hvdsync.core.train._context import TrainContext

    ctx = TrainContext(None, None, None, None, None, 0, 1, global_step=4, steps_before=10)
    assert ctx.job_step == 14 and TrainContext(None, None, None, None, None, 0, 1, global_step=4).job_step == 4


@pytest.mark.parametrize("raw, message", [
    ({"train": {"callbacks": ["no_such_callback"]}}, "train.callbacks: 'no_such_callback' is not allowed; choose one"),
    ({"train": {"callbacks": "faults"}}, "train.callbacks: 'faults' is not allowed; expected a list of registered"),
    ({"train": {"model": "resnet"}}, "train.model: 'resnet' is not allowed for torch; choose one of: cnn, mlp"),
    ({"data": {"dataset": "cifar"}}, "data.dataset: 'cifar' is not allowed; choose one of: digits, digits_images"),
    ({"train": {"plugins": ["no_such_module"]}}, "train.plugins: 'no_such_module' is not allowed; it cannot be"),
    ({"train": {"plugins": "mod"}}, "train.plugins: 'mod' is not allowed; expected a list"),
])
def test_unknown_names_fail_in_the_config_naming_the_field(raw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        Config.from_dict(raw)


def test_image_data_sets_have_image_shapes_and_are_reproducible():
    cfg = Config.from_dict({"data": {"dataset": "synthetic_images", "synthetic_samples": 64, "image_size": 12,
                                     "image_channels": 2}})
    a, b = load(cfg.data, seed=1), load(cfg.data, seed=1)
    assert a.input_shape == (12, 12, 2) and np.array_equal(a.x_train, b.x_train)
    assert load(Config.from_dict({"data": {"dataset": "digits_images"}}).data).input_shape == (8, 8, 1)


def test_knobs_come_from_the_config_unless_the_environment_sets_them():
    sync = SyncConfig(fusion_threshold_mb=8, cycle_time_ms=2.0)
    env = {"HOROVOD_CYCLE_TIME": "5"}
    decisions = {d.name: d for d in apply_horovod_env(sync, env)}
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(8 * 1024 * 1024)             # set from the config
    assert env["HOROVOD_CYCLE_TIME"] == "5"                                     # the user's value is never overridden
    assert decisions["HOROVOD_CYCLE_TIME"].source == "environment"
    out = io.StringIO()
    message = report_knobs(list(decisions.values()), rank=0, stream=out)
    assert "HOROVOD_CYCLE_TIME=5 from the environment wins over sync.cycle_time_ms (config: 2)" in message
    assert report_knobs(list(decisions.values()), rank=0, stream=out) is None  # said once
    assert report_knobs(list(decisions.values()), rank=1) is None               # and only on rank 0
    cfg = Config.from_dict({"sync": {"fusion_threshold_mb": 8, "cycle_time_ms": 2.0}})
    params = applied_params(cfg, env)
    assert params["sync.fusion_threshold_mb"] == 8 and params["sync.cycle_time_ms"] == 5.0   # what applied
    assert params["horovod.HOROVOD_FUSION_THRESHOLD"] == str(8 * 1024 * 1024)


def test_a_knob_that_could_not_apply_is_never_claimed():
    sync = SyncConfig(fusion_threshold_mb=8)
    # An elastic worker (Horovod sets HOROVOD_ELASTIC=1) keeps Horovod's fusion and cycle defaults: Horovod 0.28.1
    # corrupts its heap re-initialising with them fixed (hvdsync/launch/elastic.py).
    env = {"HOROVOD_ELASTIC": "1"}
    sources = {d.name: d.source for d in apply_horovod_env(sync, env)}
    assert sources == {"HOROVOD_FUSION_THRESHOLD": "elastic", "HOROVOD_CYCLE_TIME": "elastic",
                       "HOROVOD_CACHE_CAPACITY": "config"}
    assert "HOROVOD_FUSION_THRESHOLD" not in env and env["HOROVOD_CACHE_CAPACITY"] == "1024"
    # Horovod initialised before: nothing is written, and what was not set is recorded as Horovod's default.
    late = {}
    assert {d.source for d in apply_horovod_env(sync, late, initialized=True)} == {"already initialized"}
    params = applied_params(Config.from_dict({"sync": {"fusion_threshold_mb": 8}}), late)
    assert late == {} and params["sync.fusion_threshold_mb"] == "Horovod's default (HOROVOD_FUSION_THRESHOLD not set)"
