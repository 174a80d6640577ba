"""scripts/build_horovod.sh for TensorFlow on GPUs: Horovod's TensorFlow ops with NCCL against CUDA 12 (TensorFlow
2.21's CUDA). PyPI has no CUDA 12 compiler: nvidia-cuda-nvcc-cu12 (12.5.82, 12.9.86) ships ptxas as its only binary
(the wheel's file list; NVIDIA/cuda-python issue #2100), so the build takes a CUDA 12 toolkit's nvcc (PATH or
$CUDA_HOME), and NCCL may still be tensorflow[and-cuda]'s wheel. A made-up environment holds the wheels' real layout
as files, and a system nvcc is a script that answers --version as NVIDIA's does."""
from tests.repo.test_horovod_build import TF_CUDA, _fake_env, _plan

NO_CUDA12_NVCC = (
    "HVDSYNC_HOROVOD_GPU=nccl, but this is missing: a CUDA 12 compiler for TensorFlow's CUDA 12.5.1: no nvcc on PATH "
    "or in $CUDA_HOME, and PyPI has none for CUDA 12 (nvidia-cuda-nvcc-cu12 holds only ptxas): build in "
    "nvidia/cuda:12.9.1-devel-ubuntu24.04 (make docker-gpu-tf where a registry reaches it) or install a CUDA 12 "
    "toolkit (NVIDIA's; Debian 13's nvidia-cuda-toolkit, non-free) and set CUDA_HOME")


def _cu12_wheels(site):
    """nvidia-cuda-nvcc-cu12, nvidia-cuda-runtime-cu12 and nvidia-nccl-cu12 as pip lays them out (files only): the
    compiler wheel's one binary is ptxas, beside its crt headers and nvvm."""
    nvcc = site / "nvidia" / "cuda_nvcc"
    for folder in ("bin", "include/crt", "nvvm/bin"):
        (nvcc / folder).mkdir(parents=True)
    (nvcc / "bin" / "ptxas").write_text("#!/bin/sh\necho 'ptxas: NVIDIA (R) Ptx optimizing assembler'\n")
    (nvcc / "bin" / "ptxas").chmod(0o755)
    (nvcc / "include" / "crt" / "host_config.h").write_text("")
    (site / "nvidia" / "cuda_runtime" / "include").mkdir(parents=True)
    (site / "nvidia" / "cuda_runtime" / "include" / "cuda_runtime.h").write_text("")
    (site / "nvidia" / "cuda_runtime" / "lib").mkdir()
    (site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12").write_text("")
    (site / "nvidia" / "nccl" / "include").mkdir(parents=True)
    (site / "nvidia" / "nccl" / "include" / "nccl.h").write_text(
        "#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 7\n")


def _cuda12_toolkit(root):
    """NVIDIA's CUDA 12.9 toolkit as the script sees it: nvcc's --version and root, the runtime headers."""
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "bin" / "nvcc").write_text(
        '#!/bin/sh\ncase "$*" in *--version*) echo "Cuda compilation tools, release 12.9, V12.9.86";;\n'
        f'  *) echo "#$ TOP={root}" >&2;; esac\n')
    (root / "bin" / "nvcc").chmod(0o755)
    return root.resolve()


def _tf_env(tmp_path):
    env = {**_fake_env(tmp_path, tf=TF_CUDA, nccl=False), "HVDSYNC_HOROVOD_FRAMEWORKS": "tensorflow",
           "HVDSYNC_HOROVOD_GPU": "nccl", "HOROVOD_BUILD_CUDA_CC_LIST": "90"}
    _cu12_wheels(tmp_path / "site")
    return env


def test_cuda_12_wheels_without_a_toolkit_stop_in_one_line_saying_where_nvcc_12_is(tmp_path):
    # What tensorflow[and-cuda] installs really holds no nvcc: the line names what is missing and the two ways to
    # get it, and points at no pip requirements (none can help).
    plan, err, rc = _plan(_tf_env(tmp_path))
    assert rc == 2 and plan == {} and err.count("\n") == 1, err
    assert err == f"[build_horovod] error: {NO_CUDA12_NVCC}\n", err
    assert "pip install" not in err
    # Without the wheels too (no NCCL either): the compiler is named first, the same way.
    env = {**_fake_env(tmp_path / "b", tf=TF_CUDA), "HVDSYNC_HOROVOD_FRAMEWORKS": "tensorflow",
           "HVDSYNC_HOROVOD_GPU": "nccl"}
    _, err, rc = _plan(env)
    assert rc == 2 and err == f"[build_horovod] error: {NO_CUDA12_NVCC}\n", err


def test_a_cuda_12_nvcc_on_path_with_the_nccl_wheel_plans_an_nccl_build_and_names_its_key(tmp_path):
    env = _tf_env(tmp_path)
    cuda = _cuda12_toolkit(tmp_path / "cuda-12.9")
    env["PATH"] = f"{cuda / 'bin'}:{env['PATH']}"
    plan, err, rc = _plan(env)
    assert rc == 0, err
    assert plan["FRAMEWORKS"] == "tensorflow" and plan["HOROVOD_WITHOUT_PYTORCH"] == "1"
    assert plan["HOROVOD_WITH_TENSORFLOW"] == "1" and plan["GPU_OPERATIONS"] == "NCCL"
    assert plan["GPU"] == "cuda12.9-nccl2.27.7-cc90"
    assert plan["CUDA_HOME"] == str(cuda)                                 # the toolkit, not the wheels' folders
    assert plan["NCCL_HOME"] == str(tmp_path / "site" / "nvidia" / "nccl")   # tensorflow[and-cuda]'s NCCL
    key = plan["KEY"]
    assert key.startswith("horovod0.28.1-cp3") and "-tensorflow2.21.0-cuda12.9-nccl2.27.7-cc90-gcc" in key, key
    assert "-torch" not in key
    print("TF-only CUDA 12 key:", key)


def test_a_cuda_12_toolkit_in_cuda_home_is_found_too(tmp_path):
    env = _tf_env(tmp_path)
    env["CUDA_HOME"] = str(_cuda12_toolkit(tmp_path / "cuda-12.9"))
    plan, err, rc = _plan(env)
    assert rc == 0, err
    assert plan["GPU"] == "cuda12.9-nccl2.27.7-cc90" and plan["CUDA_HOME"] == env["CUDA_HOME"]
    assert "-tensorflow2.21.0-cuda12.9-nccl2.27.7-cc90-gcc" in plan["KEY"]
    # Its runtime headers are the toolkit's: the runtime wheel's cuda_runtime.h does not stand in for them.
    (tmp_path / "cuda-12.9" / "include" / "cuda_runtime.h").unlink()
    _, err, rc = _plan(env)
    assert rc == 2 and "missing: CUDA's runtime headers" in err, err


def test_a_cuda_13_compiler_is_not_taken_for_tensorflows_cuda_12(tmp_path):
    env = {**_fake_env(tmp_path, tf=TF_CUDA, nvcc="13.0"), "HVDSYNC_HOROVOD_FRAMEWORKS": "tensorflow",
           "HVDSYNC_HOROVOD_GPU": "nccl"}
    _, err, rc = _plan(env)
    assert rc == 2 and err.count("\n") == 1, err
    assert "a CUDA compiler for TensorFlow's CUDA 12.5.1" in err and "is CUDA 13.0" in err, err
    # pip's CUDA wheels are no way out for CUDA 12: the line does not send there.
    assert "HVDSYNC_CUDA_FROM_WHEELS" not in err and "put a CUDA 12 toolkit's bin/ first on PATH" in err, err
