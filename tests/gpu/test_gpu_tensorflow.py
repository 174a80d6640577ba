"""TensorFlow on CUDA (the hvdsync:gpu-tf image: tensorflow[and-cuda] with its CUDA 12 wheels, Horovod's TensorFlow
ops built with NCCL against CUDA 12): NCCL collectives on GPU tensors and ``fit`` on the GPU.

Marker `gpu`; skipped, saying which piece is missing, unless TensorFlow's CUDA build sees a GPU and Horovod's
TensorFlow ops have NCCL (the ``tf_gpu`` fixture, tests/gpu/conftest.py). Imports no torch: that image has none.

    python -m pytest tests/gpu/test_gpu_tensorflow.py -m gpu -rs
"""
import cloudpickle
import pytest

from hvdsync import launch
from tests.gpu import tf_gpu_workers
from tests.gpu.conftest import needs_gpus

pytestmark = pytest.mark.gpu
cloudpickle.register_pickle_by_value(tf_gpu_workers)

RANKS = [pytest.param(1, id="1rank"), pytest.param(2, id="2ranks")]


def _run(fn, np, **kwargs):
    if np > 1:
        needs_gpus(np)
    return launch.run(fn, np=np, progress=False, timeout=600, **kwargs)


@pytest.mark.parametrize("np", RANKS)
def test_tensorflow_nccl_collectives_on_gpu_tensors_give_the_arithmetic(tf_gpu, np):
    for r in _run(tf_gpu_workers.tf_collectives, np):
        assert r["size"] == np and r["nccl_built"] and r["visible_gpus"] == 1, r     # one GPU per rank
        assert r["result_devices"] == ["GPU"], r
        for op in ("sum", "average", "grouped", "allgather", "broadcast"):
            assert r[op] == 0.0, (op, r)


def test_tensorflow_fit_trains_on_the_gpu(tf_gpu):
    (r,) = _run(tf_gpu_workers.tf_fit_on_gpu, 1)
    assert r["visible_gpus"] == 1 and r["world_size"] == 1, r
    assert r["test_accuracy"] >= 0.9, r
