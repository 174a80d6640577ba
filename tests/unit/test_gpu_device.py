"""``train.device`` (auto | cpu | cuda): the rule without a GPU, then both runtimes' ``init`` in real Horovod workers.

On this CPU-only suite's machines ``cuda`` must stop at ``init`` with one line naming why there is no GPU (a CPU
build of the framework here), and ``cpu`` must train; tests/gpu/test_gpu.py holds the same field on a real GPU.
"""
import os
import subprocess
import sys

import cloudpickle
import pytest

from hvdsync import launch
from hvdsync.config import Config, ConfigError
from hvdsync.core.train import gpus

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def place(local_rank, local_size, visible, **facts):
    return gpus.gpu_placement(local_rank, local_size, visible, framework="torch 2.13.0", **facts)


def test_the_field_is_checked_once_naming_what_is_allowed():
    assert Config().train.device == "auto"
    assert Config.load(None, ["train.device=cuda"]).train.device == "cuda"
    with pytest.raises(ConfigError, match=r"^train.device: 'gpu' is not allowed; choose one of: auto, cpu, cuda$"):
        Config.load(None, ["train.device=gpu"])
    with pytest.raises(ValueError, match=r"^train.device: 'GPU' is not allowed; choose one of: auto, cpu, cuda$"):
        place(0, 1, 1, cuda_build="13.0", device="GPU")


def test_the_cli_flag_sets_the_field():
    from hvdsync.launch import cli

    ns = cli._parser().parse_args(["train", "--device", "cpu", "--np", "1"])
    assert cli._config(ns).train.device == "cpu"


@pytest.mark.parametrize("facts, why", [
    ({}, "torch 2.13.0 is a CPU build (no CUDA); install torch's CUDA build (PyPI's torch==2.13.0, not a +cpu "
         "wheel)"),
    ({"cuda_build": "13.0", "present": 0}, "torch 2.13.0 (CUDA 13.0) finds no NVIDIA GPU here (no /dev/nvidia* "
                                           "device; nvidia-smi lists none); run on a machine or container with a GPU and its driver"),
    ({"cuda_build": "13.0", "present": gpus.visible_gpus(2, ""), "cuda_visible_devices": ""},
     "CUDA_VISIBLE_DEVICES='' leaves torch 2.13.0 (CUDA 13.0) no GPU; list a GPU there or unset it"),
])
def test_cuda_without_a_usable_gpu_is_one_line_naming_why(facts, why):
    assert place(0, 1, 0, **facts) is None                                   # auto: the CPU, as before
    with pytest.raises(RuntimeError) as caught:
        place(0, 1, 0, device="cuda", **facts)
    message = str(caught.value)
    assert message == f"hvdsync: train.device=cuda but {why}; or set train.device=cpu (or auto) to train on the CPU"


def test_cuda_with_gpus_places_as_auto_does_and_the_advice_names_the_field():
    assert [place(r, 2, 2, cuda_build="13.0", device="cuda") for r in range(2)] == [0, 1]
    # The driver older than torch's CUDA stops "auto" and "cuda" alike; both errors' way out is now a real field.
    for device in ("auto", "cuda"):
        with pytest.raises(RuntimeError, match=r"CUDA 12.4 at most.*; or set train.device=cpu \(or "
                                               r"CUDA_VISIBLE_DEVICES= empty\) to train on the CPU on purpose$"):
            place(0, 1, 0, cuda_build="13.0", present=1, driver_cuda="12.4", device=device)
    with pytest.raises(RuntimeError, match=r"or set train.device=cpu \(or CUDA_VISIBLE_DEVICES= empty\) to train"):
        place(1, 2, 1, cuda_build="13.0", device="cuda")


def test_a_gpu_rank_without_horovods_nccl_stops_at_init_naming_the_rebuild():
    gpus.check_nccl(0, True, "torch 2.13.0")                                   # NCCL built: nothing to say
    with pytest.raises(RuntimeError) as caught:
        gpus.check_nccl(1, False, "TensorFlow 2.21.0")
    assert str(caught.value) == (
        "hvdsync: this rank trains on GPU 1 but the Horovod installed here is built without NCCL (horovodrun "
        "--check-build lists no NCCL), so it cannot all-reduce TensorFlow 2.21.0's GPU tensors; rebuild it: "
        "HVDSYNC_HOROVOD_GPU=nccl bash scripts/build_horovod.sh (docs/install.md), or set train.device=cpu (or "
        "CUDA_VISIBLE_DEVICES= empty) to train on the CPU")


# ---- in real workers --------------------------------------------------------------------------------------------
def torch_worker() -> dict:
    """init with train.device=cuda (its error), then fit with train.device=cpu: what each did."""
    import os

    import torch

    from hvdsync.torch import fit, init
    from hvdsync.torch.runtime import device

    out = {}
    try:
        init(Config.from_dict({"train": {"device": "cuda"}}))
    except RuntimeError as exc:
        out["cuda_error"] = str(exc)
    cfg = Config.from_dict({"train": {"device": "cpu", "epochs": 3}, "tracking": {"enabled": False}})
    result = fit(cfg).to_dict()
    return {**out, "device": str(device()), "cuda_initialized": torch.cuda.is_initialized(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "accuracy": result["test_accuracy"],
            "steps": result["optimizer_steps"]}


def tensorflow_worker() -> dict:
    import tensorflow as tf

    from hvdsync.tensorflow import init

    out = {"framework": f"TensorFlow {tf.__version__}"}
    try:
        init(Config.from_dict({"train": {"framework": "tensorflow", "device": "cuda"}}))
    except RuntimeError as exc:
        out["cuda_error"] = str(exc)
    init(Config.from_dict({"train": {"framework": "tensorflow", "device": "cpu"}}))
    out["visible_gpus"] = len(tf.config.get_visible_devices("GPU"))
    out["sum_on"] = (tf.reduce_sum(tf.ones(4)) + 0).device
    return out


def test_torch_workers_cuda_stops_at_init_and_cpu_trains():
    import torch

    (r,) = launch.run(torch_worker, np=1, progress=False, timeout=300)
    # This suite's torch is a CPU build: train.device=cuda names that, in one line, instead of training on the CPU.
    assert r["cuda_error"] == (f"hvdsync: train.device=cuda but torch {torch.__version__} is a CPU build (no CUDA); "
                               f"install torch's CUDA build (PyPI's torch=={torch.__version__.split('+')[0]}, not a "
                               "+cpu wheel); or set train.device=cpu (or auto) to train on the CPU"), r
    assert (r["device"], r["cuda_initialized"], r["cuda_visible_devices"]) == ("cpu", False, "")
    assert r["steps"] > 0 and r["accuracy"] >= 0.85, r


def test_tensorflow_workers_cuda_stops_at_init_and_cpu_hides_the_gpus():
    pytest.importorskip("horovod.tensorflow")
    (r,) = launch.run(tensorflow_worker, np=1, progress=False, timeout=300)
    version = r["framework"].split()[-1]
    assert r["cuda_error"] == (f"hvdsync: train.device=cuda but TensorFlow {version} is a CPU build (no CUDA); pip "
                               f"install 'tensorflow[and-cuda]=={version}'; or set train.device=cpu (or auto) to train "
                               "on the CPU"), r
    assert "\n" not in r["cuda_error"]
    assert r["visible_gpus"] == 0 and "CPU" in r["sum_on"], r


def test_the_cli_stops_a_cuda_run_with_one_line():
    """Without a GPU the launcher refuses before any worker starts (exit 2, an input error); on a GPU machine whose
    torch is a CPU build the worker stops at init with its own line (exit 1)."""
    proc = subprocess.run([sys.executable, "-m", "hvdsync.launch.cli", "train", "--device", "cuda", "--np", "1",
                           "--epochs", "1", "--no-track"], capture_output=True, text=True, timeout=300)
    if not any(n.startswith("nvidia") for n in os.listdir("/dev")):
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1].startswith(
            "hvdsync: error: train.device: 'cuda' is not allowed on this machine: it has no NVIDIA GPU"), proc.stderr
        assert "Traceback" not in proc.stderr
    else:
        import torch

        if torch.cuda.is_available():                      # a CUDA torch on a GPU machine: it trains
            assert proc.returncode == 0, proc.stderr[-2000:]
        else:
            assert proc.returncode == 1, proc.stderr[-2000:]
            assert "hvdsync: train.device=cuda but torch " in proc.stderr + proc.stdout, proc.stderr[-2000:]


def tensorflow_pins_before_gathering() -> dict:
    """hvdsync.tensorflow's init on a stand-in GPU: TensorFlow's CPU, with its pinning replaced by a configuration that
    TensorFlow, like set_visible_devices and set_memory_growth on a GPU, refuses once its first op has run (two logical
    CPUs), and the shared-GPU check made to gather at one rank too (it gathers where CUDA_VISIBLE_DEVICES leaves fewer
    GPUs than local ranks): Horovod's allgather_object, a TensorFlow op, which must come after the pinning."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hvdsync.config import Config
    from hvdsync.tensorflow import runtime

    cpu = tf.config.list_physical_devices("CPU")[0]
    runtime.tf.config.list_physical_devices = lambda kind=None: [cpu]
    runtime._cuda_facts = lambda visible: {"visible": visible, "framework": f"TensorFlow {tf.__version__}",
                                           "cuda_build": "12.5", "cuda_visible_devices": None}
    hvd.nccl_built = lambda: 1
    calls = []

    def pin(device):
        tf.config.set_logical_device_configuration(device, [tf.config.LogicalDeviceConfiguration()] * 2)
        calls.append("pin " + device.name)

    def gather(index, info, visible, allgather_object):
        calls.append(f"gathered {allgather_object(('host', str(index), None), name='placement')}")

    runtime._use_only, runtime.check_not_shared = pin, gather
    error = None
    try:
        runtime.init(Config.from_dict({"train": {"framework": "tensorflow"}}))
    except RuntimeError as e:
        error = str(e)
    return {"error": error, "calls": calls, "logical_cpus": len(tf.config.list_logical_devices("CPU"))}


def test_tensorflow_init_pins_its_gpu_before_its_first_collective():
    # On a GPU the gather of each rank's GPU ran first and started TensorFlow's devices, and pinning then raised
    # "Physical devices cannot be modified after being initialized". Here the same order meets the same rule of
    # TensorFlow's ("Virtual devices cannot be modified after being initialized") on its CPU.
    pytest.importorskip("horovod.tensorflow")
    (r,) = launch.run(tensorflow_pins_before_gathering, np=1, progress=False, timeout=300)
    assert r == {"error": None, "calls": ["pin /physical_device:CPU:0", "gathered [('host', '0', None)]"],
                 "logical_cpus": 2}, r
