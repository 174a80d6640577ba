"""A checkpoint folder belongs to one job, on the command line with real 2-worker elastic jobs (issue 54).

One torch job writes its checkpoints; then, in the same folder: a second job (another --lr, more epochs: its steps
would pass the first's) is refused, so is its --resume (its settings differ), and --resume without --elastic; each
in one line with exit 2 before any worker starts, and the first job's checkpoints are left byte for byte. The newest
checkpoint's payload is then replaced by garbage with a manifest that matches it: the first job's --resume names
the file, falls back to the checkpoint before, and trains on to the end; a new job with fewer steps is still refused
afterwards. The same fallback on TensorFlow. The store's own rules (two jobs writing one folder, both orders) are
in tests/unit/test_checkpoint_ownership.py.
"""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel import elastic_workers

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(len(elastic_workers.HOSTS) < 2,
                                reason=f"needs 2 local host names, found {elastic_workers.HOSTS}")


def _train(ckpt: Path, *extra: str, elastic: bool = True) -> subprocess.CompletedProcess:
    argv = [str(BIN / "hvdsync"), "train", *(["--elastic", "--min-np", "1", "--max-np", "2"] if elastic else []),
            "--np", "2", "--checkpoint-dir", str(ckpt), "--no-track", "--json", "--set", "elastic.commit_every=4",
            *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def _files(ckpt: Path) -> dict:
    return {str(p.relative_to(ckpt)): p.read_bytes() for p in sorted(ckpt.rglob("*")) if p.is_file()}


def _job(path: Path) -> str:
    return json.loads((path / "manifest.json").read_text())["job"]["id"]


def _garble(path: Path, name: str) -> None:
    """Garbage for the payload, and a manifest whose size and checksum match the garbage."""
    garbage = bytes(range(256)) * 40
    (path / name).write_bytes(garbage)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": len(garbage), "sha256": hashlib.sha256(garbage).hexdigest()}
    (path / "manifest.json").write_text(json.dumps(manifest))


def _one_error_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and run.stdout == "", run.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def torch_jobs(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("jobs") / "ck"
    first = _train(ckpt, "--epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    names = sorted(p.name for p in ckpt.glob("ckpt-*"))
    job = _job(ckpt / names[-1])
    before = _files(ckpt)
    refused = {"new": _train(ckpt, "--epochs", "3", "--lr", "0.05"),
               "resume": _train(ckpt, "--epochs", "3", "--lr", "0.05", "--resume"),
               "plain": _train(ckpt, "--epochs", "3", "--resume", elastic=False)}
    after_refusals = _files(ckpt)
    _garble(ckpt / names[-1], "torch_state.pt")
    resumed = _train(ckpt, "--epochs", "2", "--resume")
    late = _train(ckpt, "--epochs", "1")
    return {"ckpt": ckpt, "first": first, "names": names, "job": job, "before": before, "refused": refused,
            "after_refusals": after_refusals, "resumed": resumed, "late": late}


def test_a_second_job_is_refused_the_folder_in_one_line_and_nothing_of_the_first_is_touched(torch_jobs):
    ckpt, job = torch_jobs["ckpt"], torch_jobs["job"]
    assert torch_jobs["names"] == ["ckpt-000000016", "ckpt-000000020", "ckpt-000000022"]
    assert _one_error_line(torch_jobs["refused"]["new"]) == (
        f"hvdsync: error: elastic.checkpoint_dir: {ckpt} holds checkpoints of another job (job {job}, step 22); "
        "give this job a new directory, or add --resume to continue that job")
    assert _one_error_line(torch_jobs["refused"]["resume"]) == (
        f"hvdsync: error: elastic.resume: {ckpt} holds checkpoints of another job (job {job}, step 22; train.lr "
        "was 0.1, now 0.05); resume with the settings that job was started with, or start this job in a new "
        "directory")
    assert _one_error_line(torch_jobs["refused"]["plain"]) == (
        "hvdsync: error: --resume: needs --elastic (elastic.enabled): only an elastic job writes and resumes "
        "checkpoints; add --elastic, or leave out --resume to train from scratch")
    assert torch_jobs["after_refusals"] == torch_jobs["before"]


def test_resume_continues_the_same_job_past_a_payload_that_passes_its_checksum_but_does_not_load(torch_jobs):
    ckpt, job, resumed = torch_jobs["ckpt"], torch_jobs["job"], torch_jobs["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("hvdsync: ")]
    assert lines[0] == f"hvdsync: resuming job {job} from step 22 ({ckpt / 'ckpt-000000022'})"
    assert lines[1].startswith(f"hvdsync: checkpoint skipped: {ckpt / 'ckpt-000000022'}/torch_state.pt: does not "
                               "load (")
    assert lines[2] == f"hvdsync: resuming from the previous valid checkpoint {ckpt / 'ckpt-000000020'} (step 20)"
    assert len(lines) == 3
    result = json.loads(resumed.stdout)
    # 20 steps from the checkpoint, then the rest of epoch 0 (2) and epoch 1 (22): the same count as one whole run.
    assert (result["epochs"], result["steps"], result["param_spread"]) == (2, 44, 0.0)
    assert {_job(p) for p in ckpt.glob("ckpt-*")} == {job}


def test_a_new_job_with_fewer_steps_is_refused_after_the_resume_too(torch_jobs):
    ckpt, job = torch_jobs["ckpt"], torch_jobs["job"]
    assert _one_error_line(torch_jobs["late"]) == (
        f"hvdsync: error: elastic.checkpoint_dir: {ckpt} holds checkpoints of another job (job {job}, step 44); "
        "give this job a new directory, or add --resume to continue that job")
    assert sorted(p.name for p in ckpt.glob("ckpt-*")) == ["ckpt-000000036", "ckpt-000000040", "ckpt-000000044"]


def test_tensorflow_falls_back_past_a_payload_that_passes_its_checksum_but_does_not_load(tmp_path):
    ckpt = tmp_path / "ck"
    tf = ("--framework", "tensorflow", "--epochs", "1")
    first = _train(ckpt, *tf)
    assert first.returncode == 0, first.stderr[-3000:]
    newest = sorted(ckpt.glob("ckpt-*"))[-1]
    assert newest.name == "ckpt-000000022"
    _garble(newest, "keras_state.npz")
    resumed = _train(ckpt, *tf, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"hvdsync: checkpoint skipped: {newest}/keras_state.npz: does not load (" in resumed.stderr
    assert (f"hvdsync: resuming from the previous valid checkpoint {ckpt / 'ckpt-000000020'} (step 20)"
            in resumed.stderr)
    result = json.loads(resumed.stdout)
    assert (result["epochs"], result["steps"], result["param_spread"]) == (1, 22, 0.0)
