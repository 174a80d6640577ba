"""The GPU tests (marker `gpu`): where no CUDA device is visible they are skipped with the reason in one line, so the
suite stays green on CPU machines; benchmarks/gpu.sh runs them on a machine with a GPU.

On that machine a skip would hide a broken node (no CUDA torch, Horovod without NCCL): with HVDSYNC_REQUIRE_GPU=1
(gpu.sh sets it) every skip of a test in this folder is reported as a failure, naming its reason, except a test that
says it needs more GPUs than the node has ("needs 2 GPUs ..."): that is the node's size, not a fault."""
import os
import re

import pytest

# The one kind of skip a GPU node may report under HVDSYNC_REQUIRE_GPU=1 (needs_gpus below words it).
ALLOWED_SKIP = re.compile(r"needs \d+ GPUs\b")


def gpu_required() -> bool:
    return os.environ.get("HVDSYNC_REQUIRE_GPU", "") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and gpu_required()) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if not ALLOWED_SKIP.search(reason):
        report.outcome = "failed"
        report.longrepr = (f"HVDSYNC_REQUIRE_GPU=1: this GPU test would have been skipped ({reason}); on a GPU node "
                           f"that is a failure")


def no_gpu_reason() -> str | None:
    """Why these tests cannot run here, or None when torch sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return "no CUDA device visible: torch is not installed"
    if torch.version.cuda is None:
        return f"no CUDA device visible: torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return (f"no CUDA device visible to torch {torch.__version__} (CUDA {torch.version.cuda}; "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(not set)')})")
    return None


def pytest_collection_modifyitems(config, items):
    # The TensorFlow GPU tests ask TensorFlow, not torch (the tf_gpu fixture): the TensorFlow image has no torch.
    gpu_items = [item for item in items if item.get_closest_marker("gpu")
                 and "tf_gpu" not in getattr(item, "fixturenames", ())]
    reason = no_gpu_reason() if gpu_items else None   # torch is asked only when a GPU test was collected
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


def gpu_count() -> int:
    """Visible NVIDIA GPUs: torch's count where torch is installed, else the driver's device files less what
    CUDA_VISIBLE_DEVICES hides (the TensorFlow image has no torch)."""
    try:
        import torch
    except ImportError:
        from hvdsync.core.train.gpus import present_gpus, visible_gpus

        return visible_gpus(present_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    return torch.cuda.device_count()


def needs_gpus(n: int) -> None:
    """Skip the calling test, naming the count, on a machine with fewer than ``n`` visible GPUs."""
    if gpu_count() < n:
        pytest.skip(f"needs {n} GPUs (one per rank); {gpu_count()} visible")


@pytest.fixture(scope="session")
def nccl():
    """The NCCL tests' precondition: Horovod built with it (benchmarks/gpu.sh checks this before it runs them)."""
    import horovod.torch as hvd

    if not hvd.nccl_built():
        pytest.skip("Horovod here is built without NCCL: HVDSYNC_HOROVOD_GPU=nccl bash scripts/build_horovod.sh")


@pytest.fixture(scope="session")
def tf_gpu():
    """The TensorFlow GPU tests' precondition, asked of a separate process (TensorFlow would otherwise reserve the
    GPU in the test process): a CUDA build of TensorFlow that sees a GPU, and Horovod's TensorFlow ops with NCCL."""
    import subprocess
    import sys

    probe = ("import importlib.util as u, tensorflow as tf; b = tf.sysconfig.get_build_info(); "
             "print(b.get('is_cuda_build', False), len(tf.config.list_physical_devices('GPU')), "
             "bool(u.find_spec('horovod.tensorflow')) and __import__('horovod.tensorflow').tensorflow.nccl_built())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if out.returncode != 0:
        pytest.skip(f"TensorFlow cannot be imported here: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    cuda_build, gpus, nccl = out.stdout.split()[-3:]
    if cuda_build != "True":
        pytest.skip("TensorFlow here is a CPU build (tensorflow-cpu): the TensorFlow GPU tests need "
                    "tensorflow[and-cuda] (the hvdsync:gpu-tf image)")
    if gpus == "0":
        pytest.skip("TensorFlow sees no GPU (its CUDA 12 libraries missing, or a driver too old for CUDA 12)")
    if nccl != "True":
        pytest.skip("Horovod's TensorFlow ops are built without NCCL here: HVDSYNC_HOROVOD_FRAMEWORKS=tensorflow "
                    "HVDSYNC_HOROVOD_GPU=nccl bash scripts/build_horovod.sh")
