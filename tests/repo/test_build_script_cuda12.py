"""scripts/build_horovod.sh for TensorFlow on GPUs: Horovod's TensorFlow ops with NCCL against CUDA 12 (TensorFlow
2.21's CUDA), its compiler taken from CUDA 12's pip wheels where the machine has no toolkit (the gpu-tf image on a
plain Debian base; docker/README.md). A made-up environment holds the wheels' layout as files: CUDA 12 puts each
component in its own folder under site-packages/nvidia/, unlike CUDA 13's one tree, and the plan must find them."""
from tests.repo.test_horovod_build import TF_CUDA, _fake_env, _plan


def _cu12_wheels(site, release="12.9"):
    """nvidia-cuda-nvcc-cu12, nvidia-cuda-runtime-cu12 and nvidia-nccl-cu12 as pip lays them out (files only)."""
    nvcc = site / "nvidia" / "cuda_nvcc"
    (nvcc / "bin").mkdir(parents=True)
    (nvcc / "bin" / "nvcc").write_text(f'#!/bin/sh\ncase "$*" in *--version*) echo "Cuda compilation tools, release '
                                       f'{release}, V{release}.41";;\n  *) echo "#$ TOP={nvcc}" >&2;; esac\n')
    (nvcc / "bin" / "nvcc").chmod(0o755)
    (site / "nvidia" / "cuda_runtime" / "include").mkdir(parents=True)
    (site / "nvidia" / "cuda_runtime" / "include" / "cuda_runtime.h").write_text("")
    (site / "nvidia" / "nccl" / "include").mkdir(parents=True)
    (site / "nvidia" / "nccl" / "include" / "nccl.h").write_text(
        "#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 7\n")


def test_tensorflow_only_with_cuda_12_wheels_plans_an_nccl_build_and_names_its_key(tmp_path):
    env = {**_fake_env(tmp_path, tf=TF_CUDA, nccl=False), "HVDSYNC_HOROVOD_FRAMEWORKS": "tensorflow",
           "HVDSYNC_HOROVOD_GPU": "nccl", "HOROVOD_BUILD_CUDA_CC_LIST": "90"}
    site = tmp_path / "site"
    _cu12_wheels(site)
    plan, err, rc = _plan(env)
    assert rc == 0, err
    assert plan["FRAMEWORKS"] == "tensorflow" and plan["HOROVOD_WITHOUT_PYTORCH"] == "1"
    assert plan["HOROVOD_WITH_TENSORFLOW"] == "1" and plan["GPU_OPERATIONS"] == "NCCL"
    assert plan["GPU"] == "cuda12.9-nccl2.27.7-cc90"
    assert plan["CUDA_HOME"] == f"{site / 'nvidia' / 'cuda_nvcc'} (joined at build time with {site / 'nvidia'}" \
                                "/cuda_runtime and cuda_cccl)"
    assert plan["NCCL_HOME"] == str(site / "nvidia" / "nccl")
    key = plan["KEY"]
    assert key.startswith("horovod0.28.1-cp3") and "-tensorflow2.21.0-cuda12.9-nccl2.27.7-cc90-gcc" in key, key
    assert "-torch" not in key
    print("TF-only CUDA 12 key:", key)


def test_without_the_cuda_12_compiler_the_line_names_the_cu12_requirements(tmp_path):
    env = {**_fake_env(tmp_path, tf=TF_CUDA), "HVDSYNC_HOROVOD_FRAMEWORKS": "tensorflow", "HVDSYNC_HOROVOD_GPU": "nccl"}
    plan, err, rc = _plan(env)
    assert rc == 2 and plan == {} and err.count("\n") == 1, err
    assert "missing: a CUDA compiler: no nvcc on PATH or in $CUDA_HOME, and no nvidia-cuda-nvcc wheel for CUDA 12.5.1" \
           " in this environment (pip install -r scripts/cuda-build-requirements-cu12.txt)" in err, err
    # The runtime headers are the next piece named when only the compiler's wheel is there.
    env2 = {**_fake_env(tmp_path / "b", tf=TF_CUDA, nccl=False), "HVDSYNC_HOROVOD_FRAMEWORKS": "tensorflow",
            "HVDSYNC_HOROVOD_GPU": "nccl"}
    _cu12_wheels(tmp_path / "b" / "site")
    (tmp_path / "b" / "site" / "nvidia" / "cuda_runtime" / "include" / "cuda_runtime.h").unlink()
    _, err, rc = _plan(env2)
    assert rc == 2 and "missing: CUDA's runtime headers" in err, err


def test_a_cuda_13_compiler_is_not_taken_for_tensorflows_cuda_12(tmp_path):
    env = {**_fake_env(tmp_path, tf=TF_CUDA, nvcc="13.0"), "HVDSYNC_HOROVOD_FRAMEWORKS": "tensorflow",
           "HVDSYNC_HOROVOD_GPU": "nccl"}
    _, err, rc = _plan(env)
    assert rc == 2 and err.count("\n") == 1, err
    assert "a CUDA compiler for TensorFlow's CUDA 12.5.1" in err and "is CUDA 13.0" in err, err
