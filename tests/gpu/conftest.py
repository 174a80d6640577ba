"""The GPU tests (marker `gpu`): where no CUDA device is visible they are skipped with the reason in one line, so the
suite stays green on CPU machines; benchmarks/gpu.sh runs them on a machine with a GPU."""
import os

import pytest


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
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    reason = no_gpu_reason() if gpu_items else None   # torch is asked only when a GPU test was collected
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


def gpu_count() -> int:
    import torch

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
