"""One rank per GPU: the placement rule of ``hvdsync.torch.init`` and ``hvdsync.tensorflow.init``, without a GPU.

The rule is a pure function of what a worker finds (its local rank and size, the GPUs its framework can use, the
CUDA its framework is built for, the driver's CUDA, CUDA_VISIBLE_DEVICES), so every case is a table row here; the
same cases on a real GPU are in tests/gpu/test_gpu.py. Both adapters hand their facts to this one rule
(``hvdsync.core.train.gpus``).
"""
import pytest

@pytest.fixture(scope="module")
def rt():
    from hvdsync.core.train import gpus

    return gpus


def place(rt, local_rank, local_size, visible, **facts):
    return rt.gpu_placement(local_rank, local_size, visible, framework="torch 2.13.0", **facts)


def test_each_local_rank_takes_its_own_gpu(rt):
    assert [place(rt, r, 4, 4, cuda_build="13.0") for r in range(4)] == [0, 1, 2, 3]
    assert [place(rt, r, 2, 8, cuda_build="13.0") for r in range(2)] == [0, 1]     # spare GPUs stay free


def test_no_gpu_means_the_cpu_without_a_word(rt):
    assert place(rt, 0, 2, 0) is None                                           # a CPU build
    assert place(rt, 1, 2, 0, cuda_build="13.0") is None                        # a CUDA build on a machine without GPUs
    # GPUs hidden on purpose: CUDA_VISIBLE_DEVICES= leaves none present to this process.
    assert place(rt, 0, 2, 0, cuda_build="13.0", present=rt.visible_gpus(2, ""), driver_cuda="13.0",
                 cuda_visible_devices="") is None


def test_more_ranks_than_gpus_stops_at_init_naming_the_counts_and_the_fixes(rt):
    with pytest.raises(RuntimeError) as caught:
        place(rt, 1, 2, 1, cuda_build="13.0")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("hvdsync: 2 ranks on this host but 1 GPU(s) for them (1 visible, CUDA_VISIBLE_DEVICES "
                              "not set): one rank per GPU, as NCCL refuses two ranks on one GPU")
    assert "start at most 1 rank(s) per host, make 2 GPUs visible, or set train.device=cpu (or " \
           "CUDA_VISIBLE_DEVICES= empty) to train on the CPU" in message
    with pytest.raises(RuntimeError, match=r"^hvdsync: 9 ranks on this host but 8 GPU\(s\)"):
        place(rt, 0, 9, 8, cuda_build="12.8")


def test_a_cuda_build_that_cannot_use_the_gpus_says_why_instead_of_training_on_the_cpu(rt):
    # torch built for CUDA 13.0, a driver for CUDA 12.4: the driver is named as the cause, with both ways out.
    with pytest.raises(RuntimeError) as caught:
        place(rt, 0, 1, 0, cuda_build="13.0", present=1, driver_cuda="12.4")
    message = str(caught.value)
    assert "\n" not in message
    assert message == ("hvdsync: torch 2.13.0 is built for CUDA 13.0 but the NVIDIA driver supports CUDA 12.4 at most, "
                       "so it cannot use the 1 NVIDIA GPU(s) here; install a driver for CUDA 13, or torch's build for "
                       "CUDA 12; or set train.device=cpu (or CUDA_VISIBLE_DEVICES= empty) to train on the CPU on "
                       "purpose")
    # A driver that does not answer at all.
    with pytest.raises(RuntimeError, match=r"cannot use the 2 NVIDIA GPU\(s\) here: the NVIDIA driver's library "
                                           r"\(libcuda.so.1\) does not answer; check the driver with nvidia-smi"):
        place(rt, 0, 1, 0, cuda_build="13.0", present=2)
    # The driver is new enough: the framework's own likely reason.
    with pytest.raises(RuntimeError, match=r"supports CUDA 13.1, yet it cannot use the 1 NVIDIA GPU\(s\) here: "
                                           r"its CUDA 12 libraries are missing; or set train.device=cpu"):
        place(rt, 0, 1, 0, cuda_build="12.5.1", present=1, driver_cuda="13.1",
              hint="its CUDA 12 libraries are missing")


@pytest.mark.parametrize("value, present, visible", [
    (None, 4, 4), ("", 4, 0), ("-1", 4, 0), ("0", 4, 1), ("2,3", 4, 2), ("1, 0", 2, 2),
    ("0,7,1", 4, 1),            # CUDA stops at the first entry that names no GPU
    ("0,0", 4, 1),              # ... or repeats one
    ("GPU-8a1c2f3e,GPU-77d0", 4, 2), ("MIG-3f0e", 1, 1), ("0", 0, 0),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(rt, value, present, visible):
    assert rt.visible_gpus(present, value) == visible


def test_a_launcher_that_gives_each_rank_its_own_gpu_is_accepted_and_one_shared_gpu_is_not(rt):
    # Slurm's per-task binding: each of 4 local ranks sees one GPU, a different one. The count alone cannot tell this
    # from 4 ranks on one GPU, so the index is 0 and the ranks compare what they took.
    assert [place(rt, r, 4, 1, cuda_build="13.0", cuda_visible_devices=str(r)) for r in range(4)] == [0] * 4
    own = [("node1", rt.gpu_id(str(r), 0), str(r)) for r in range(4)]
    assert rt.shared_gpu_error(own) is None
    # The same CUDA_VISIBLE_DEVICES=0 exported for every rank of a host: rank 1 is the first to share GPU 0.
    shared = [("node1", rt.gpu_id("0", 0), "0") for _ in range(2)] + [("node2", rt.gpu_id("0", 0), "0")]
    message = rt.shared_gpu_error(shared)
    assert message.startswith("hvdsync: 2 ranks on this host but 1 GPU(s) for them (ranks 0 and 1 on node1 both use "
                              "GPU 0; CUDA_VISIBLE_DEVICES='0'): one rank per GPU"), message
    # Two GPUs listed for four ranks: indices 0, 1, 0, 1 name GPUs 2, 3, 2, 3.
    took = [place(rt, r, 4, 2, cuda_build="13.0", cuda_visible_devices="2,3") for r in range(4)]
    assert [rt.gpu_id("2,3", i) for i in took] == ["2", "3", "2", "3"]
    assert "4 ranks on this host but 2 GPU(s) for them (ranks 0 and 2 on node1 both use GPU 2" in rt.shared_gpu_error(
        [("node1", rt.gpu_id("2,3", i), "2,3") for i in took])


def test_the_driver_probes_answer_without_a_gpu(rt):
    # On any machine: a count (0 without NVIDIA's device files) and a version or None (no libcuda), never an error.
    assert rt.present_gpus() >= 0
    version = rt.driver_cuda()
    assert version is None or all(part.isdigit() for part in version.split("."))
