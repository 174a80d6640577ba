"""The checkpoint store and the framework-free elastic state, in one process (the parallel tests run real workers).

The elastic state is driven with the callables a 1-worker job would hand it (broadcast = identity, rank 0, size 1)
and a numpy "model", so commit / restore / position / durable round trip are checked without a framework.
"""
import io
import json

import numpy as np
import pytest

from hvdsync.config import Config, ConfigError
from hvdsync.core.elastic._store import CheckpointStore
from hvdsync.core.elastic.checkpoint import CheckpointError
from hvdsync.elastic import ElasticState, Position


# ---- the store --------------------------------------------------------------------------------------------------
def _store(tmp_path, lines, keep=3, fingerprint="mlp"):
    return CheckpointStore(tmp_path / "ckpt", keep=keep, fingerprint=fingerprint, report=lines.append)


def test_save_is_atomic_keeps_the_last_n_and_the_newest_wins(tmp_path):
    lines = []
    store = _store(tmp_path, lines)
    for step in (10, 20, 30, 40):
        store.save(step, {"model.bin": bytes([step]) * 100}, {"epoch": step // 20})
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == ["ckpt-000000020", "ckpt-000000030", "ckpt-000000040"]  # keep=3; no temporary folders left
    ckpt = store.latest()
    assert (ckpt.step, ckpt.meta, ckpt.files["model.bin"]) == (40, {"epoch": 2}, bytes([40]) * 100)
    assert lines == []
    manifest = json.loads((ckpt.path / "manifest.json").read_text())
    assert manifest["files"]["model.bin"]["bytes"] == 100 and len(manifest["files"]["model.bin"]["sha256"]) == 64


@pytest.mark.parametrize("damage,expected", [
    ("truncate", "model.bin: 50 bytes, the manifest says 100 (truncated"),
    ("flip", "model.bin: checksum mismatch (the content was altered)"),
    ("manifest", "manifest.json: missing (an unfinished or damaged checkpoint)"),
    ("other_model", "manifest.json: from another model (fingerprint 'resnet', this model 'mlp')"),
])
def test_a_damaged_newest_checkpoint_is_named_in_one_line_and_the_previous_one_is_used(tmp_path, damage, expected):
    lines = []
    store = _store(tmp_path, lines)
    store.save(1, {"model.bin": b"a" * 100})
    newest = store.save(2, {"model.bin": b"b" * 100})
    model = newest / "model.bin"
    if damage == "truncate":
        model.write_bytes(model.read_bytes()[:50])
    elif damage == "flip":
        blob = bytearray(model.read_bytes())
        blob[37] ^= 0x01
        model.write_bytes(bytes(blob))
    elif damage == "manifest":
        (newest / "manifest.json").unlink()
    else:
        manifest = json.loads((newest / "manifest.json").read_text())
        manifest["fingerprint"] = "resnet"
        (newest / "manifest.json").write_text(json.dumps(manifest))
    ckpt = store.latest()
    assert ckpt.step == 1 and ckpt.files["model.bin"] == b"a" * 100
    assert len(lines) == 2
    assert lines[0].startswith("checkpoint skipped: ") and expected in lines[0] and str(newest) in lines[0]
    assert "\n" not in lines[0]
    assert lines[1] == f"resuming from the previous valid checkpoint {store.candidates()[1]} (step 1)"


def test_with_no_valid_checkpoint_training_starts_fresh_and_says_so(tmp_path):
    lines = []
    store = _store(tmp_path, lines)
    assert store.latest() is None
    assert lines == [f"no checkpoint in {tmp_path / 'ckpt'}; starting fresh"]
    only = store.save(5, {"model.bin": b"x" * 10})
    (only / "model.bin").write_bytes(b"y" * 10)
    lines.clear()
    assert store.latest() is None
    assert "checksum mismatch" in lines[0]
    assert lines[1] == f"no valid checkpoint (1 skipped) in {tmp_path / 'ckpt'}; starting fresh"
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        store.verify(only)


def test_a_killed_writer_leaves_no_checkpoint_only_a_temporary_folder_that_is_ignored(tmp_path):
    lines = []
    store = _store(tmp_path, lines)
    store.save(1, {"model.bin": b"a"})
    half = tmp_path / "ckpt" / ".tmp-ckpt-000000002-99999"   # what a SIGKILL during save leaves
    half.mkdir()
    (half / "model.bin").write_bytes(b"partial")
    assert store.latest().step == 1 and lines == []
    store.save(3, {"model.bin": b"c"})
    assert not half.exists()                                   # the next writer cleans it up


def test_saving_the_same_step_again_replaces_it(tmp_path):
    store = _store(tmp_path, [])
    store.save(7, {"model.bin": b"first"})
    store.save(7, {"model.bin": b"second"})
    assert store.latest().files["model.bin"] == b"second" and len(store.candidates()) == 1


# ---- the elastic state ------------------------------------------------------------------------------------------
class NumpyTensors:
    """The adapter side for a 'model' that is one numpy array (what the torch and TF adapters do with tensors)."""

    fingerprint = "numpy-w"

    def __init__(self):
        self.w = np.zeros(3)
        self.saved = self.w.copy()
        self.syncs = 0

    def save(self):
        self.saved = self.w.copy()

    def restore(self):
        self.w = self.saved.copy()

    def sync(self):
        self.syncs += 1

    def to_files(self):
        buf = io.BytesIO()
        np.save(buf, self.saved, allow_pickle=False)
        return {"w.npy": buf.getvalue()}

    def from_files(self, files):
        self.w = np.load(io.BytesIO(files["w.npy"]), allow_pickle=False)


class Residuals:
    def __init__(self):
        self.r = np.zeros(2)

    def state_dict(self):
        return {"r": self.r.copy()}

    def load_state_dict(self, d):
        self.r = np.array(d["r"])


def _state(tmp_path=None, **kw):
    store = CheckpointStore(tmp_path / "ck", keep=2, fingerprint="numpy-w", report=kw.pop("report", print)) \
        if tmp_path else None
    return ElasticState(NumpyTensors(), lambda obj: obj, lambda: 0, lambda: 1, store=store, **kw)


def test_restore_undoes_the_steps_after_the_last_commit_and_keeps_the_committed_ones():
    state = _state(commit_every=3, codec=Residuals(), seen=[])
    for _ in range(4):              # steps 1..3 committed at 3; step 4 not
        state.tensors.w += 1
        state.codec.r += 0.5
        state.user["seen"].append(state.position.step)
        state.step_done(global_samples=8)
    assert state.position == Position(epoch=0, consumed=32, step=4)
    state.restore()
    assert state.position == Position(epoch=0, consumed=24, step=3)
    assert state.tensors.w.tolist() == [3, 3, 3] and state.codec.r.tolist() == [1.5, 1.5]
    assert state.user["seen"] == [0, 1, 2]
    state.epoch_done()
    assert state.position == Position(epoch=1, consumed=0, step=3)


def test_a_reset_is_recorded_with_reason_sizes_and_recovery_time_at_the_first_step_after_it():
    events = []
    state = _state(commit_every=1, on_event=events.append)
    state.step_done(4)
    state.interrupted("worker lost")
    state.on_reset()
    state.sync()
    assert events == []             # not recovered until a step completes
    state.step_done(4)
    assert len(events) == 1 and state.events == events
    e = events[0]
    assert (e["reason"], e["size_before"], e["size_after"], e["step"]) == ("worker lost", 1, 1, 2)
    assert e["recovery_seconds"] >= 0.0


def test_durable_checkpoint_round_trip_and_resume(tmp_path):
    lines = []
    state = _state(tmp_path, commit_every=2, checkpoint_every=2, codec=Residuals(), report=lines.append,
                   note="hello", arr=np.arange(3))
    for _ in range(4):
        state.tensors.w += 1
        state.codec.r += 1
        state.step_done(10)         # commits at 2 and 4; durable checkpoint at the 2nd commit (step 4)
    assert [p.name for p in state.store.candidates()] == ["ckpt-000000004"]
    fresh = _state(tmp_path, codec=Residuals(), report=lines.append, note="", arr=None)
    assert fresh.load_checkpoint()
    assert fresh.position == Position(epoch=0, consumed=40, step=4)
    assert fresh.tensors.w.tolist() == [4, 4, 4] and fresh.codec.r.tolist() == [4, 4]
    assert fresh.user == {"note": "hello", "arr": [0, 1, 2]}
    assert lines == []
    empty = ElasticState(NumpyTensors(), lambda o: o, lambda: 0, lambda: 1,
                         store=CheckpointStore(tmp_path / "none", report=lines.append))
    assert not empty.load_checkpoint() and "starting fresh" in lines[-1]


# ---- config -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,message", [
    ({"elastic": {"min_np": 0}}, "elastic.min_np: 0 is not allowed; expected an integer from 1 to 64"),
    ({"elastic": {"min_np": 3, "max_np": 2}}, "elastic.max_np: 2 is not allowed; expected at least elastic.min_np (3)"),
    ({"elastic": {"resume": True}}, "elastic.resume: True is not allowed; resuming needs elastic.checkpoint_dir"),
    ({"elastic": {"commit_every": 0}}, "elastic.commit_every: 0 is not allowed"),
    ({"elastic": {"enabled": True, "min_np": 2, "max_np": 3}, "train": {"np": 1}},
     "train.np: 1 is not allowed with elastic training; expected from elastic.min_np (2) to elastic.max_np (3)"),
])
def test_elastic_config_errors_name_the_field(raw, message):
    with pytest.raises(ConfigError) as err:
        Config.from_dict(raw)
    assert str(err.value).startswith(message)


def test_an_elastic_worker_leaves_fusion_and_cycle_time_to_horovod():
    # Horovod 0.28.1 segfaults re-initialising after a reset when both were set (hvdsync/core/train/runtime.py).
    from hvdsync.core.train.runtime import apply_horovod_env

    env = {"HOROVOD_ELASTIC": "1"}
    apply_horovod_env(Config().sync, env)
    assert set(env) == {"HOROVOD_ELASTIC", "HOROVOD_CACHE_CAPACITY"}
    plain = {}
    apply_horovod_env(Config().sync, plain)
    assert {"HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"} <= set(plain)
