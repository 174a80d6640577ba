"""benchmarks/gpu.py's self-test on a CPU (``--cpu``): every path runs, and the Horovod contenders' training steps
really all-reduce at one rank (Horovod would skip it there; the benchmark forces its hooks on), as DDP's do.

The proof is Horovod's own timeline, read by the benchmark: one ALLREDUCE span per gradient tensor per step, each
over Gloo here (NCCL on a GPU, where benchmarks/gpu.sh runs the same code, and where anything else fails the run)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    pytest.importorskip("horovod.torch")
    out = tmp_path_factory.mktemp("gpu_bench") / "results.json"
    proc = subprocess.run([sys.executable, "benchmarks/gpu.py", "--cpu", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_the_horovod_contenders_all_reduce_every_gradient_in_every_step_at_one_rank(smoke):
    result, stdout = smoke
    assert result["horovod"]["size"] == 1 and result["settings"]["device"] == "cpu"
    proof = result["allreduce_proof"]
    assert set(proof) == {"horovod", "hvdsync"}
    for name, row in proof.items():
        # ResNet-18's shape: 62 parameter tensors (convolutions, batch norms, the classifier), all trained.
        assert row["gradients"] == 62, (name, row)
        # The CPU's transport: Gloo, or MPI where this Horovod has it (a 1-rank run without horovodrun takes MPI's).
        assert len(row["transport"]) == 1 and row["transport"][0] in ("GLOO_ALLREDUCE", "MPI_ALLREDUCE"), (name, row)
        want = row["transport"][0]
        assert row["allreduces"] == row[f"over_{want}"] == row["steps"] * row["gradients"], (name, row)
        assert row["every_gradient_every_step"], (name, row)
    want = proof["horovod"]["transport"][0]
    assert f"horovod  124 all-reduces in 2 steps of 62 gradients, 124 over {want} ({want})" in stdout
    ddp = result["ddp_proof"]   # every gradient element handed to the process group in each step, at world size 1
    assert ddp["backend"] == "gloo" and ddp["bucket_allreduces"] >= 2, ddp
    assert ddp["elements"] == 2 * ddp["gradient_elements"] and ddp["every_gradient_every_step"], ddp
    assert result["wrong"] == [] and result["facts"]["horovod_build_key"].startswith("horovod0.28.1-"), result


def test_every_contender_takes_plain_torchs_steps_and_the_sweeps_are_exact(smoke):
    result, _ = smoke
    rows = result["throughput"]
    assert set(rows) == {"torch", "ddp", "horovod", "hvdsync"}
    assert all(len(row["images_per_s"]) == 3 for row in rows.values()), rows   # the median of 3 repetitions
    # One rank: the average of one gradient is that gradient, so the same steps give the very same parameters; the
    # check's own sensitivity: a gradient off by one rank (halved) moves them by about half of torch's movement.
    check = result["param_check"]
    assert all(row["relative_diff"] == 0.0 and row["correct"] for row in check["contenders"].values()), check
    assert check["off_by_one_rank"] > 100 * check["tolerance"], check
    assert [r["correct"] for r in result["allreduce_horovod"]] == [True]
    assert [r["correct"] for r in result["allreduce_torch_distributed"]] == [True]
    assert result["imported"] == {"mlflow": False, "tensorflow": False, "keras": False}


def test_gpu_sh_on_a_machine_with_nvcc_but_no_gpu_stops_in_one_line_before_writing(tmp_path):
    # A CUDA compiler without a GPU (a CUDA toolkit or container on a CPU machine, as where this suite runs): the
    # script names both facts and the CPU self-test, and leaves no half-made results folder behind.
    if shutil.which("nvidia-smi", path="/usr/bin:/bin"):
        pytest.skip("this machine has nvidia-smi: the case is a machine without a driver")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text('#!/bin/sh\necho "Cuda compilation tools, release 13.0, V13.0.88"\n')
    (bin_dir / "nvcc").chmod(0o755)
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "benchmarks/gpu.sh", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr == (f"[gpu] error: no nvidia-smi on PATH (no NVIDIA driver), though {bin_dir}/nvcc (CUDA 13.0) "
                           "is here: a CUDA compiler is no GPU; run this on a machine with an NVIDIA GPU and its driver "
                           "(nvidia-smi -L lists it); without one: python benchmarks/gpu.py --cpu (the bench part's "
                           "self-test)\n")
    assert not out.exists()
