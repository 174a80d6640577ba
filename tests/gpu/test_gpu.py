"""hvdsync on CUDA: NCCL collectives, the codecs' kernels, mixed precision, training, one rank per GPU, and
train.device. TensorFlow on the GPU: tests/gpu/test_gpu_tensorflow.py.

Every test here carries the `gpu` marker and is skipped, with the reason, where torch sees no CUDA device
(tests/gpu/conftest.py); under HVDSYNC_REQUIRE_GPU=1 (benchmarks/gpu.sh) such a skip is a failure. Whatever can run
with one GPU runs with one rank; a test that needs two GPUs says so when it skips. A 1-rank job need not touch NCCL
(hvdsync's grouped call returns at once there, Horovod's optimizer skips its hooks), so each training test reads
Horovod's timeline and asserts what ran over NCCL. The workers are in tests/gpu/gpu_workers.py, reusing the CPU
suite's (tests/parallel/) where they fit.

    bash benchmarks/gpu.sh            # builds Horovod with NCCL, then runs this module and the GPU benchmark
    python -m pytest tests/gpu -m gpu -rs
"""
import os

import cloudpickle
import numpy as np
import pytest

from hvdsync import launch
from hvdsync.launch import WorkerError
from tests.gpu import gpu_workers
from tests.gpu.conftest import gpu_count, needs_gpus
from tests.parallel import codecs_workers, torch_workers
from tests.unit import test_codec_kernels as kernels

pytestmark = pytest.mark.gpu
for module in (gpu_workers, torch_workers, codecs_workers):
    cloudpickle.register_pickle_by_value(module)

RANKS = [pytest.param(1, id="1rank"), pytest.param(2, id="2ranks")]


def _run(fn, np, env=None, **kwargs):
    if np > 1:
        needs_gpus(np)
    # DYNAMIC: the timeline off until a worker starts it (gpu_workers.nccl_spans), as hvd.start_timeline requires.
    return launch.run(fn, np=np, env={"HOROVOD_TIMELINE": "DYNAMIC", **(env or {})}, progress=False, timeout=600,
                      **kwargs)


def _ran_nccl(r, op="ALLREDUCE", at_least=1):
    """Rank 0's timeline (what gpu_workers.nccl_spans found): ``op`` ran over NCCL ``at_least`` times."""
    assert r["nccl"].get("ops", {}).get(op, 0) >= at_least, r["nccl"]


@pytest.mark.parametrize("np", RANKS)
def test_nccl_collectives_on_cuda_tensors_give_the_arithmetic(nccl, np):
    results = _run(gpu_workers.collectives, np)
    for rank, r in enumerate(results):
        assert r["device"] == f"cuda:{rank}" and r["size"] == np and r["nccl_built"]
        assert r["result_devices"] == ["cuda"]                  # results stay on the GPU
        for op in ("sum", "average", "in_place", "float16", "grouped", "allgather", "broadcast"):
            assert r[op] == 0.0, (op, r)
    # Rank 0's timeline: every one of those went over NCCL (4 single all-reduces and a group of 3).
    _ran_nccl(results[0], "ALLREDUCE", 7)
    _ran_nccl(results[0], "ALLGATHER", 1)
    _ran_nccl(results[0], "BROADCAST", 1)


def test_the_timeline_shows_nccl_operations(nccl, tmp_path):
    path = tmp_path / "timeline.json"
    (r,) = _run(gpu_workers.timeline, 1, env={"HOROVOD_TIMELINE": str(path)})
    assert r["device"] == "cuda:0"
    text = path.read_text()
    assert "NCCL_ALLREDUCE" in text and "gpu.timeline.0" in text, text[:2000]


def test_fp16_codec_works_in_place_on_cuda_gradients():
    # tests/unit/test_fp16_in_place.py's step (compress, a hand-played average with a peer, decompress) on CUDA
    # tensors: float16 on the wire, the result written into the gradients' own GPU storage, and the very numbers the
    # plain cast gives, on the GPU and on the CPU.
    import torch

    from hvdsync.torch.compression import CodecCompressor
    from tests.unit.test_fp16_in_place import _grads, _reduce

    grads, peers = [g.cuda() for g in _grads(0)], [p.cuda() for p in _grads(1)]
    storage = [g.data_ptr() for g in grads]
    _, plain = _reduce(CodecCompressor("fp16"), [g.clone() for g in grads], peers)
    sent, got = _reduce(CodecCompressor("fp16", in_place=True), grads, peers)
    assert [(w.dtype, w.device.type) for w, _ in sent] == [(torch.float16, "cuda")] * 3
    assert [g.data_ptr() for g in got] == storage and all(g.is_cuda and g.dtype == torch.float32 for g in got)
    assert all(torch.equal(a, b) for a, b in zip(got, plain))
    _, on_cpu = _reduce(CodecCompressor("fp16"), _grads(0), _grads(1))
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, on_cpu))


@pytest.fixture(scope="module")
def cuda_ops():
    """PyTorch's codec kernels on the GPU, drawing numpy's noise (as tests/unit/test_codec_kernels.py's do)."""
    from hvdlab.codecs_numpy import NumpyOps
    from hvdsync.torch.compression import TorchOps

    reference = NumpyOps()

    class SharedNoise(TorchOps):
        def uniform(self, n, seed, step):
            return self.from_numpy(reference.uniform(n, seed, int(step)))

    ops = SharedNoise("cuda")
    assert ops.from_numpy(np.zeros(3, np.float32)).is_cuda
    return ops


@pytest.mark.parametrize("spec", kernels.SPECS)
def test_every_codec_on_cuda_gives_the_numpy_maths(cuda_ops, spec):
    kernels.test_framework_kernels_equal_the_core_maths(cuda_ops, spec)


@pytest.mark.parametrize("np", RANKS)
def test_fp16_autocast_on_cuda_skips_an_overflowing_step_on_every_rank(nccl, np):
    results = _run(gpu_workers.overflow_on_gpu, np)
    _ran_nccl(results[0], "BROADCAST")   # the start's broadcast; the steps' all-reduces at 2 ranks
    if np > 1:
        _ran_nccl(results[0], "ALLREDUCE")
    at = 3   # codecs_workers.overflow_checks makes rank 0's gradients non-finite at step 3
    for rank, r in enumerate(results):
        assert r["device"] == f"cuda:{rank}"
        for spec, rows in r["overflow"].items():
            assert [row["skipped_steps"] for row in rows] == [int(i == at) for i in range(len(rows))], (spec, rank)
            assert rows[at]["change"] == 0.0 and rows[at]["scale_after"] == rows[at]["scale_before"] / 2, spec
            assert all(row["change"] > 0 for i, row in enumerate(rows) if i != at), spec
            assert all(row["spread"] == 0.0 for row in rows), spec


@pytest.mark.parametrize("np", RANKS)
def test_the_adapter_on_cuda_takes_plain_sgds_steps(nccl, np):
    # Every gradient all-reduced over NCCL in every step, at 1 rank too (the worker forces Horovod's hooks on).
    results = _run(gpu_workers.adapter_matches_plain_torch, np)
    for rank, r in enumerate(results):
        assert r["device"] == f"cuda:{rank}" and r["parameter_devices"] == [f"cuda:{rank}"]
        assert r["max_diff"] < 1e-4, r     # CUDA's float32 kernels against the CPU's: rounding only
    _ran_nccl(results[0], "ALLREDUCE", results[0]["steps"] * results[0]["gradients"])


def test_fit_trains_on_the_gpu(nccl):
    (r,) = _run(gpu_workers.fit_on_gpu, 1)
    assert r["device"] == "cuda:0" and r["world_size"] == 1
    assert r["test_accuracy"] >= 0.9, r
    _ran_nccl(r, "BROADCAST")   # the model's start from rank 0, over NCCL (one rank's steps all-reduce nothing)


# ---- one rank per GPU (the rule itself: tests/unit/test_gpu_placement.py) ---------------------------------------
def _first_visible() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()


def test_two_ranks_given_one_gpu_stop_at_init_naming_the_counts(nccl):
    with pytest.raises(WorkerError) as caught:
        launch.run(gpu_workers.placement, np=2, env={"CUDA_VISIBLE_DEVICES": _first_visible()}, progress=False,
                   timeout=300)
    assert "2 ranks on this host but 1 GPU(s) for them (ranks 0 and 1 on " in str(caught.value), str(caught.value)
    assert "set train.device=cpu (or CUDA_VISIBLE_DEVICES= empty) to train on the CPU" in str(caught.value)


def test_more_ranks_than_the_hosts_gpus_stop_at_init():
    n = gpu_count()
    with pytest.raises(WorkerError) as caught:
        launch.run(gpu_workers.placement, np=n + 1, progress=False, timeout=300)
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        assert f"{n + 1} ranks on this host but {n} GPU(s) for them ({n} visible, CUDA_VISIBLE_DEVICES not set)" \
            in str(caught.value), str(caught.value)
    else:  # a scheduler's list (Slurm sets one): the ranks find that two of them took one GPU
        assert f"{n + 1} ranks on this host but {n} GPU(s) for them (ranks 0 and {n} on " in str(caught.value), \
            str(caught.value)


def test_cuda_visible_devices_is_honoured(nccl):
    # Empty: the CPU, on purpose, with no complaint; one GPU named: that one, as device 0.
    (cpu,) = launch.run(gpu_workers.placement, np=1, env={"CUDA_VISIBLE_DEVICES": ""}, progress=False, timeout=300)
    assert cpu["device"] == "cpu"
    (one,) = launch.run(gpu_workers.placement, np=1, env={"CUDA_VISIBLE_DEVICES": _first_visible()}, progress=False,
                        timeout=300)
    assert one["device"] == "cuda:0" and one["uuid"]


def test_each_local_rank_gets_a_gpu_of_its_own(nccl):
    needs_gpus(2)
    results = _run(gpu_workers.placement, 2)
    assert [r["device"] for r in results] == [f"cuda:{r['local_rank']}" for r in results]
    assert len({r["uuid"] for r in results}) == 2


# ---- train.device, and Horovod without NCCL on a GPU (the rules: tests/unit/test_gpu_device.py) -----------------
def test_train_device_cpu_never_opens_the_gpu_and_cuda_takes_it(nccl):
    (cpu,) = _run(gpu_workers.device_choice, 1, kwargs={"device": "cpu"})
    assert cpu == {"device": "cpu", "cuda_initialized": False}, cpu
    (gpu,) = _run(gpu_workers.device_choice, 1, kwargs={"device": "cuda"})
    assert gpu == {"device": "cuda:0", "cuda_initialized": True}, gpu


def test_the_placement_errors_advice_train_device_cpu_is_a_way_out():
    # Two ranks given one GPU stop at init (above) and name train.device=cpu: with it, the same job trains on the CPU.
    results = launch.run(gpu_workers.device_choice, kwargs={"device": "cpu"}, np=2, progress=False, timeout=300,
                         env={"CUDA_VISIBLE_DEVICES": _first_visible()})
    assert results == [{"device": "cpu", "cuda_initialized": False}] * 2, results


def test_a_gpu_rank_without_nccl_stops_at_init_with_the_rebuild():
    # A Gloo-only Horovod as it is, or, where this one has NCCL (benchmarks/gpu.sh's), the worker's Horovod saying it
    # has none (hvd.nccl_built, the fact init reads): the GPU rank stops at init either way.
    import horovod.torch as hvd

    worker = gpu_workers.placement_as_without_nccl if hvd.nccl_built() else gpu_workers.placement
    with pytest.raises(WorkerError) as caught:
        launch.run(worker, np=1, progress=False, timeout=300)
    assert "but the Horovod installed here is built without NCCL" in str(caught.value), str(caught.value)
    assert "HVDSYNC_HOROVOD_GPU=nccl bash scripts/build_horovod.sh" in str(caught.value)

