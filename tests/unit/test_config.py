"""Every bad config value gets one clear error naming the field and what is allowed, before any worker starts."""
import subprocess
import sys
import time

import pytest

from hvdsync.config import Config, ConfigError


@pytest.mark.parametrize("section,field,value,allowed", [
    ("sync", "compression", "fp8", "choose one of: none, fp16, bf16, topk:<ratio>, randk:<ratio>, int8, powersgd"),
    ("sync", "compression", "topk:0", "the ratio of topk must be a number in (0, 1]"),
    ("sync", "compression", "randk:1.5", "the ratio of randk must be a number in (0, 1]"),
    ("sync", "compression", "powersgd:0", "the rank of powersgd must be an integer >= 1"),
    ("sync", "error_feedback", "yes", "expected true or false"),
    ("train", "precision", "fp8", "choose one of: fp32, fp16, bf16"),
    ("sync", "accumulate", 0, "expected an integer >= 1"),
    ("sync", "accumulate", 2.5, "expected an integer >= 1"),
    ("sync", "op", "max", "choose one of: average, sum, adasum"),
    ("sync", "fusion_threshold_mb", -1, "expected a number >= 0"),
    ("sync", "cycle_time_ms", 0, "expected a number > 0"),
    ("sync", "cache_capacity", -5, "expected an integer >= 0"),
    ("sync", "grouped_mb", -1, "expected a number >= 0"),
    ("sync", "grouped_mb", "25MB", "expected a number >= 0"),
    ("data", "dataset", "imagenet", "choose one of: digits, digits_images, synthetic, synthetic_images"),
    ("data", "batch_size", 0, "expected an integer >= 1"),
    ("data", "test_fraction", 1.0, "expected a number > 0.0 and < 1.0"),
    ("data", "shuffle", "yes", "expected true or false"),
    ("data", "synthetic_spread", 0, "expected a number > 0.0"),
    ("train", "framework", "jax", "choose one of: torch, tensorflow"),
    ("train", "np", 0, "expected an integer from 1 to 64"),
    ("train", "epochs", 0, "expected an integer >= 1"),
    ("train", "lr", 0, "expected a number > 0"),
    ("train", "lr", float("nan"), "expected a number > 0"),
    ("train", "lr_scaling", "sqrt", "choose one of: none, linear"),
    ("train", "optimizer", "lamb", "choose one of: sgd, adam"),
    ("train", "momentum", 1.5, "expected a number >= 0.0 and < 1.0"),
    ("train", "seed", -1, "expected an integer from 0 to"),
    ("train", "device", "gpu", "choose one of: auto, cpu, cuda"),
    ("tracking", "enabled", "no", "expected true or false"),
    ("tracking", "log_model", "yes", "expected true or false"),
    ("tracking", "experiment", "", "expected a non-empty name"),
])
def test_bad_value_names_field_and_allowed_values(section, field, value, allowed):
    with pytest.raises(ConfigError) as err:
        Config.from_dict({section: {field: value}})
    msg = str(err.value)
    assert msg.startswith(f"{section}.{field}: {value!r} is not allowed")
    assert allowed in msg


def test_unknown_sections_and_fields_list_the_known_ones():
    with pytest.raises(ConfigError, match=r"^synch: unknown section; known sections: sync, data, train, tracking"):
        Config.from_dict({"synch": {}})
    with pytest.raises(ConfigError, match=r"^sync.compresion: unknown field; known fields: accumulate, cache_capacity"):
        Config.from_dict({"sync": {"compresion": "fp16"}})


def test_accumulate_cannot_exceed_the_batch():
    with pytest.raises(ConfigError, match="sync.accumulate: 64 is not allowed with data.batch_size 32"):
        Config.from_dict({"sync": {"accumulate": 64}})


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("sync:\n  compression: fp16\ntrain:\n  epochs: 3\n")
    cfg = Config.load(path, ["sync.accumulate=4", "train.framework=tensorflow"])
    assert (cfg.sync.compression, cfg.sync.accumulate, cfg.train.epochs, cfg.train.framework) == \
        ("fp16", 4, 3, "tensorflow")
    assert cfg.flat()["sync.accumulate"] == 4
    assert cfg.sync.horovod_env()["HOROVOD_FUSION_THRESHOLD"] == str(64 * 1024 * 1024)
    with pytest.raises(ConfigError, match="override: 'sync.accumulate' is not allowed; expected section.field=value"):
        Config.load(None, ["sync.accumulate"])
    with pytest.raises(ConfigError, match="does not exist"):
        Config.load(tmp_path / "missing.yaml")


def test_cli_rejects_bad_value_before_starting_any_worker():
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hvdsync.launch.cli", "train", "--compression", "fp8", "--np", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "sync.compression: 'fp8' is not allowed; choose one of: none, fp16, bf16" in proc.stderr
    assert "Traceback" not in proc.stderr
    # No worker was started: no Horovod launcher output, and far quicker than a worker start-up.
    assert "rank" not in (proc.stdout + proc.stderr).replace("powersgd:<rank>", "")
    assert time.perf_counter() - start < 30


def test_user_scripts_read_config_file_and_overrides_and_pin_their_framework(tmp_path):
    from hvdsync.config import from_command_line

    path = tmp_path / "run.yaml"
    path.write_text("train:\n  framework: torch\n  epochs: 2\n")
    cfg = from_command_line(["--config", str(path), "--set", "sync.compression=fp16"], framework="tensorflow")
    assert (cfg.train.framework, cfg.train.epochs, cfg.sync.compression) == ("tensorflow", 2, "fp16")
    with pytest.raises(ConfigError, match="sync.accumulate: 0 is not allowed"):
        from_command_line(["--set", "sync.accumulate=0"])


def _refusal(sync: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        Config.from_dict({"sync": sync})
    return str(caught.value)


def _listed(message: str, before: str, after: str) -> list[str]:
    """The codec names a message offers, between ``before`` and ``after``."""
    return message.split(before, 1)[1].split(after, 1)[0].replace(" or ", ", ").split(", ")


def test_bf16_with_adasum_is_refused_saying_it_is_no_cast_codec_and_every_codec_offered_is_accepted():
    message = _refusal({"compression": "bf16", "op": "adasum"})
    assert message.startswith("sync.compression: 'bf16' is not allowed; with sync.op adasum")
    assert "bf16 is not a cast codec: Horovod cannot all-reduce bfloat16, so its values travel by allgather" in message
    offered = _listed(message, "choose one of: ", ";")
    assert offered == ["none", "fp16"]
    # What the message offers is what the check takes (the docs call exactly these the cast codecs).
    for name in offered:
        assert Config.from_dict({"sync": {"compression": name, "op": "adasum"}}).sync.compression == name
    # A shape-changing codec gets the same list, without the bf16 note.
    other = _refusal({"compression": "topk:0.1", "op": "adasum"})
    assert _listed(other, "choose one of: ", ";") == offered and "bf16 is not" not in other


def test_bf16_with_sparse_allgather_is_refused_with_the_same_cast_codecs():
    message = _refusal({"compression": "bf16", "sparse": "allgather"})
    assert message.startswith("sync.sparse: 'allgather' is not allowed; with sync.compression 'bf16' choose dense")
    offered = _listed(message, "a cast codec: compression ", " (")
    assert offered == ["none", "fp16"] and "bf16 is not a cast codec" in message
    for name in offered:
        assert Config.from_dict({"sync": {"compression": name, "sparse": "allgather"}}).sync.sparse == "allgather"
