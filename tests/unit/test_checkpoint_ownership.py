"""A checkpoint folder belongs to one job: two jobs sharing one (both orders), the rules of a new job and of
``resume`` (:func:`hvdsync.core.elastic.jobs.claim`), and a payload that passes its checksum but does not load.

The real 2-rank CLI runs of the same rules are in tests/parallel/test_checkpoint_jobs.py.
"""
import hashlib
import io
import json
import os

import numpy as np
import pytest

from hvdsync.config import Config
from hvdsync.core.elastic._store import CheckpointStore
from hvdsync.core.elastic.checkpoint import CheckpointError, undecodable
from hvdsync.core.elastic.jobs import claim, job_config
from hvdsync.elastic import ElasticState, Position

CONFIG = job_config(Config().flat())


def _store(folder, job_id, lines=None, keep=3, fingerprint="mlp", config=CONFIG):
    return CheckpointStore(folder, keep=keep, fingerprint=fingerprint, job_id=job_id, job_config=config,
                           report=(lines if lines is not None else []).append)


def _snapshot(folder):
    """Every checkpoint folder with the bytes of its files: what must survive another job untouched."""
    return {p.name: {f.name: f.read_bytes() for f in sorted(p.iterdir())} for p in sorted(folder.glob("ckpt-*"))}


@pytest.mark.parametrize("order", ["high steps first", "low steps first"])
def test_two_jobs_writing_one_folder_never_remove_each_others_checkpoints(tmp_path, order):
    folder = tmp_path / "ck"
    a, b = _store(folder, "jobA"), _store(folder, "jobB")
    a_steps, b_steps = [10, 20, 30, 40, 44], [5, 10 + 1, 15, 22]
    first, second = ((a, a_steps), (b, b_steps)) if order == "high steps first" else ((b, b_steps), (a, a_steps))
    for step in first[1]:
        first[0].save(step, {"model.bin": bytes([step % 256]) * 10})
    kept_first = _snapshot(folder)
    assert len(kept_first) == 3  # keep=3 within the first job
    for step in second[1]:
        second[0].save(step, {"model.bin": bytes([step % 256]) * 10})
    after = _snapshot(folder)
    assert {k: after[k] for k in kept_first} == kept_first  # the first job's three, byte for byte
    mine = sorted(p.name for p in folder.glob("ckpt-*") if second[0].owner(p) == second[0].job_id)
    assert mine == [f"ckpt-{s:09d}" for s in second[1][-3:]]  # the second job pruned only its own
    # Each job's newest is its own, whatever the other's steps.
    assert a.latest(job_id="jobA").step == 44 and b.latest(job_id="jobB").step == 22
    assert not list(folder.glob(".tmp-*"))


def test_a_step_of_another_job_is_not_overwritten(tmp_path):
    folder = tmp_path / "ck"
    _store(folder, "jobA").save(30, {"model.bin": b"A"})
    with pytest.raises(CheckpointError) as err:
        _store(folder, "jobB").save(30, {"model.bin": b"B"})
    assert str(err.value) == f"{folder / 'ckpt-000000030'}: written by another job (jobA); not overwritten"
    assert (folder / "ckpt-000000030" / "model.bin").read_bytes() == b"A"


def test_another_model_of_the_same_job_id_is_not_pruned(tmp_path):
    folder = tmp_path / "ck"
    other = _store(folder, "job", fingerprint="resnet")
    for step in (1, 2, 3):
        other.save(step, {"model.bin": b"r"})
    mlp = _store(folder, "job", keep=1, fingerprint="mlp")
    for step in (4, 5):
        mlp.save(step, {"model.bin": b"m"})
    assert sorted(p.name for p in folder.glob("ckpt-*")) == [f"ckpt-{s:09d}" for s in (1, 2, 3, 5)]


# ---- claim: who may write, what resume continues --------------------------------------------------------------------
def _claim(folder, resume, **changes):
    return claim(CheckpointStore(folder), {**CONFIG, **changes}, resume)


def test_a_new_job_is_refused_a_folder_with_another_jobs_checkpoints(tmp_path):
    folder = tmp_path / "ck"
    assert _claim(folder, resume=False).resumed is None           # no folder yet: fine
    _store(folder, "jobA").save(44, {"model.bin": b"a"})
    with pytest.raises(CheckpointError) as err:
        _claim(folder, resume=False)
    assert str(err.value) == (f"elastic.checkpoint_dir: {folder} holds checkpoints of another job (job jobA, step "
                              "44); give this job a new directory, or add --resume to continue that job")


def test_resume_continues_the_job_with_the_same_settings_and_says_which(tmp_path):
    folder = tmp_path / "ck"
    store = _store(folder, "jobA")
    store.save(44, {"model.bin": b"a"}, {"run_id": "run1"})
    chosen = _claim(folder, resume=True, **{"train.epochs": 99, "train.np": 4})  # not job settings: may change
    assert (chosen.job_id, chosen.resumed.step) == ("jobA", 44)
    assert chosen.line() == f"resuming job jobA from step 44 ({folder / 'ckpt-000000044'}, MLflow run run1)"


def test_resume_refuses_a_job_whose_settings_differ_naming_them(tmp_path):
    folder = tmp_path / "ck"
    _store(folder, "jobA").save(44, {"model.bin": b"a"})
    with pytest.raises(CheckpointError) as err:
        _claim(folder, resume=True, **{"train.lr": 0.05})
    assert str(err.value) == (f"elastic.resume: {folder} holds checkpoints of another job (job jobA, step 44; "
                              "train.lr was 0.1, now 0.05); resume with the settings that job was started with, or "
                              "start this job in a new directory")


def test_resume_picks_the_matching_job_of_two_and_an_empty_folder_starts_fresh(tmp_path):
    folder = tmp_path / "ck"
    assert _claim(folder, resume=True).resumed is None
    _store(folder, "jobA").save(10, {"model.bin": b"a"})
    _store(folder, "jobB", config={**CONFIG, "train.lr": 0.05}).save(50, {"model.bin": b"b"})
    assert _claim(folder, resume=True).resumed.id == "jobA"           # B is newer and higher, but not this job
    assert _claim(folder, resume=True, **{"train.lr": 0.05}).resumed.id == "jobB"


def test_checkpoints_without_a_job_record_are_resumed_under_a_new_id_and_kept(tmp_path):
    folder = tmp_path / "ck"
    legacy = CheckpointStore(folder, keep=3, fingerprint="mlp")  # writes no job record, as before jobs existed
    for step in (1, 2):
        legacy.save(step, {"model.bin": b"old"})
    chosen = _claim(folder, resume=True)
    assert chosen.resumed.id == "" and chosen.job_id and chosen.line().startswith(
        f"resuming checkpoints without a job record (now job {chosen.job_id}) from step 2")
    with pytest.raises(CheckpointError, match="another job \\(no job recorded, step 2\\)"):
        _claim(folder, resume=False)
    new = _store(folder, chosen.job_id, keep=1)
    for step in (3, 4):
        new.save(step, {"model.bin": b"new"})
    assert sorted(p.name for p in folder.glob("ckpt-*")) == [f"ckpt-{s:09d}" for s in (1, 2, 4)]


# ---- a payload that passes its checksum but does not decode --------------------------------------------------------
class NpzTensors:
    """A numpy "model" whose checkpoint is an .npz decoded as the Keras adapter does (np.load, no pickle)."""

    fingerprint = "numpy-w"

    def __init__(self):
        self.w = np.zeros(3)
        self.save()

    def save(self):
        self._saved = self.w.copy()

    def restore(self):
        self.w = self._saved.copy()

    def sync(self):
        pass

    def to_files(self):
        buf = io.BytesIO()
        np.savez(buf, w=self._saved)
        return {"w.npz": buf.getvalue()}

    def from_files(self, files):
        try:
            with np.load(io.BytesIO(files["w.npz"]), allow_pickle=False) as z:
                self.w[:2] = 7.0          # a partial load before the failure: it must be undone
                self.w = np.array(z["w"], dtype=float)
        except Exception as exc:  # noqa: BLE001 - as the adapters do
            raise undecodable("w.npz", exc) from None


def _garble_keeping_the_checksum(path, name):
    garbage = os.urandom(300)
    (path / name).write_bytes(garbage)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": len(garbage), "sha256": hashlib.sha256(garbage).hexdigest()}
    (path / "manifest.json").write_text(json.dumps(manifest))


def _elastic(folder, lines):
    store = CheckpointStore(folder, keep=3, fingerprint="numpy-w", report=lines.append, job_id="jobA")
    return ElasticState(NpzTensors(), lambda obj: obj, lambda: 0, lambda: 1, store=store, commit_every=1)


def test_a_payload_that_passes_its_checksum_but_does_not_load_falls_back_to_the_previous_checkpoint(tmp_path):
    folder, lines = tmp_path / "ck", []
    state = _elastic(folder, lines)
    for _ in range(3):
        state.tensors.w += 1
        state.step_done(8)                      # a checkpoint at every step: 1, 2, 3
    newest = folder / "ckpt-000000003"
    _garble_keeping_the_checksum(newest, "w.npz")
    assert state.store.verify(newest).step == 3  # the checksum still matches: only decoding finds it
    fresh = _elastic(folder, lines)
    assert fresh.load_checkpoint(job_id="jobA")
    assert fresh.position == Position(epoch=0, consumed=16, step=2) and fresh.tensors.w.tolist() == [2, 2, 2]
    assert len(lines) == 2
    assert lines[0].startswith(f"checkpoint skipped: {newest}/w.npz: does not load (")
    assert lines[1] == f"resuming from the previous valid checkpoint {folder / 'ckpt-000000002'} (step 2)"


def test_when_no_payload_loads_the_job_starts_fresh_from_its_own_values(tmp_path):
    folder, lines = tmp_path / "ck", []
    state = _elastic(folder, lines)
    state.tensors.w += 5
    state.step_done(8)
    _garble_keeping_the_checksum(folder / "ckpt-000000001", "w.npz")
    fresh = _elastic(folder, lines)
    assert not fresh.load_checkpoint(job_id="jobA")
    assert fresh.tensors.w.tolist() == [0, 0, 0] and fresh.position == Position()  # the partial load undone
    assert lines[-1] == f"no valid checkpoint (1 skipped) in {folder}; starting fresh"


def test_resume_without_elastic_is_refused_before_any_worker_starts():
    from hvdsync.config import ConfigError
    from hvdsync.launch import choose

    cfg = Config.from_dict({"elastic": {"checkpoint_dir": "ck", "resume": True}})
    with pytest.raises(ConfigError) as err:
        choose(cfg, environ={})
    assert str(err.value) == ("--resume: needs --elastic (elastic.enabled): only an elastic job writes and resumes "
                              "checkpoints; add --elastic, or leave out --resume to train from scratch")
    assert choose(cfg.replace(elastic={"enabled": True}), environ={}).launcher == "elastic"


def test_a_checkpoint_folder_without_elastic_is_refused_before_any_worker_starts():
    from hvdsync.config import ConfigError
    from hvdsync.launch import choose

    cfg = Config.from_dict({"elastic": {"checkpoint_dir": "ck"}})
    with pytest.raises(ConfigError) as err:
        choose(cfg, environ={})
    assert str(err.value) == ("--checkpoint-dir: needs --elastic (elastic.enabled): only an elastic job writes "
                              "checkpoints, so ck would stay empty; add --elastic, or leave out --checkpoint-dir")
    assert choose(cfg.replace(elastic={"enabled": True}), environ={}).launcher == "elastic"
