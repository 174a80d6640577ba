"""The two GPU images (hvdsync:gpu-torch, hvdsync:gpu-tf), checked without building them: what docker/build.py would
run for each (``--plan``), that Dockerfile.gpu gives each its own CUDA and Horovod for its framework alone, and the
Makefile's targets. Building them (GBs of CUDA wheels and a Horovod compile) is tests/docker's, opt-in."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _plan(*args):
    out = subprocess.run([sys.executable, "docker/build.py", *args, "--plan"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize("variant, framework, cuda, tags, check", [
    ("gpu-torch", "torch", "13.0.1", "hvdsync:gpu-torch hvdsync:gpu", "NCCL PyTorch Gloo"),
    ("gpu", "torch", "13.0.1", "hvdsync:gpu-torch hvdsync:gpu", "NCCL PyTorch Gloo"),     # the old name: an alias
    ("gpu-tf", "tensorflow", "12.9.1", "hvdsync:gpu-tf", "NCCL TensorFlow Gloo"),
])
def test_each_gpu_image_builds_one_framework_with_its_own_cuda(variant, framework, cuda, tags, check):
    assert _plan(variant) == [
        f"VARIANT={'gpu-torch' if variant == 'gpu' else variant}", "DOCKERFILE=docker/Dockerfile.gpu", f"TAGS={tags}",
        f"BUILD_ARG FRAMEWORK={framework}", f"BUILD_ARG BUILD_IMAGE=nvidia/cuda:{cuda}-devel-ubuntu24.04",
        f"BUILD_ARG BASE_IMAGE=nvidia/cuda:{cuda}-runtime-ubuntu24.04",
        f"HOROVOD_BUILD HVDSYNC_HOROVOD_FRAMEWORKS={framework} HVDSYNC_HOROVOD_GPU=nccl", f"CHECK_BUILD {check}"]


def test_a_base_asked_for_replaces_both_and_a_tag_replaces_the_defaults():
    lines = _plan("gpu-torch", "--base", "hvdsync-base:bookworm", "--tag", "mine:torch")
    assert "TAGS=mine:torch" in lines and "BUILD_ARG BUILD_IMAGE=hvdsync-base:bookworm" in lines
    assert "BUILD_ARG BASE_IMAGE=hvdsync-base:bookworm" in lines
    lines = _plan("gpu-tf", "--base", "registry.example/cuda:12.9-devel", "--tag", "mine:tf")
    assert "TAGS=mine:tf" in lines and "BUILD_ARG BUILD_IMAGE=registry.example/cuda:12.9-devel" in lines


GPU_TF_ON_LOCAL_BASE = (
    "docker/build.py: error: gpu-tf cannot be built on hvdsync-base:bookworm, the local Debian 12 base: it has no CUDA "
    "12 compiler (nvcc), and PyPI has none (nvidia-cuda-nvcc-cu12 holds only ptxas); build without --base (where "
    "nvidia/cuda:12.9.1-devel-ubuntu24.04 cannot be pulled, on Debian 13 bases made here, with Debian's CUDA 12.4 "
    "toolkit), or give an image with CUDA 12's nvcc: --base IMAGE (docker build: --build-arg BUILD_IMAGE=IMAGE)\n")


@pytest.mark.parametrize("plan", [True, False], ids=["plan", "build"])
def test_gpu_tf_on_the_local_debian_base_is_refused_in_one_line_before_docker(plan):
    # PyPI has no CUDA 12 nvcc (nvidia-cuda-nvcc-cu12 ships only ptxas), and the Debian base no CUDA: the build would
    # stop after GBs of wheels. --plan says the same line; a build says it before any docker command (a docker that
    # does not exist is never reached).
    out = subprocess.run([sys.executable, "docker/build.py", "gpu-tf", "--base", "hvdsync-base:bookworm"]
                         + (["--plan"] if plan else []), cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "DOCKER": "/nonexistent/docker"})
    assert out.returncode == 1 and out.stdout == "" and out.stderr == GPU_TF_ON_LOCAL_BASE, out.stderr


def test_where_the_public_bases_cannot_be_pulled_each_variant_gets_its_local_debian_bases(monkeypatch):
    # docker/build.py by path, as tests/repo/test_docker.py loads it (`build` is also a PyPI package's name).
    spec = importlib.util.spec_from_file_location("hvdsync_docker_build_variants", ROOT / "docker" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1 if cmd[0] == "docker" else 0)   # nothing exists or can be pulled
    monkeypatch.setattr(build.subprocess, "run", run)
    # gpu-tf: Debian 13 for both stages (one Python), the builder's with Debian's CUDA 12 toolkit, each made once.
    assert build.resolve_bases(["docker"], None, "gpu-tf") == {"BUILD_IMAGE": "hvdsync-base:trixie-cuda12",
                                                               "BASE_IMAGE": "hvdsync-base:trixie"}
    made = [c[2:] for c in calls if c[0] == "bash"]
    assert made == [["hvdsync-base:trixie-cuda12", "trixie", "nvidia-cuda-toolkit"], ["hvdsync-base:trixie", "trixie"]]
    # gpu-torch goes on to the Debian 12 base, as before.
    calls.clear()
    assert build.resolve_bases(["docker"], None, "gpu-torch") == {"BUILD_IMAGE": "hvdsync-base:bookworm",
                                                                  "BASE_IMAGE": "hvdsync-base:bookworm"}
    assert [c[2:] for c in calls if c[0] == "bash"] == [["hvdsync-base:bookworm", "bookworm"]]


def test_an_unknown_variant_is_one_line_listing_the_images():
    out = subprocess.run([sys.executable, "docker/build.py", "gpu-jax", "--plan"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert "invalid choice: 'gpu-jax' (choose from 'cpu', 'gpu-torch', 'gpu-tf', 'gpu')" in out.stderr


def test_the_dockerfile_checks_the_framework_argument_and_the_build_lists_the_images_framework():
    text = (ROOT / "docker" / "Dockerfile.gpu").read_text()
    assert 'echo "FRAMEWORK=$FRAMEWORK is not allowed; choose torch or tensorflow" >&2; exit 2' in text
    assert 'name="$([ "$FRAMEWORK" = torch ] && echo PyTorch || echo TensorFlow)"' in text
    assert 'for part in NCCL "$name" Gloo; do grep -q' in text
    # Declared after the apt step in the builder, so both variants share that layer.
    builder = text.split(" AS builder", 1)[1].split("\nFROM ", 1)[0]
    assert builder.index("apt-get install") < builder.index("ARG FRAMEWORK=torch")
    # The final image trains with its own framework by default, and the smoke test reads the same variable.
    assert "HVDSYNC_IMAGE_FRAMEWORK=${FRAMEWORK}" in text and '--framework \\"$HVDSYNC_IMAGE_FRAMEWORK\\"' in text
    assert "HVDSYNC_IMAGE_FRAMEWORK" in (ROOT / "docker" / "smoke_test.sh").read_text()


def test_the_tensorflow_variant_installs_no_compiler_wheels_and_stops_without_nvcc():
    # PyPI has no CUDA 12 nvcc (nvidia-cuda-nvcc-cu12 ships only ptxas): no requirements file for one, and a builder
    # without nvcc stops at the dependency step, in one line, before its GBs of wheels.
    assert not (ROOT / "scripts" / "cuda-build-requirements-cu12.txt").exists()
    text = (ROOT / "docker" / "Dockerfile.gpu").read_text()
    assert "cu12.txt" not in text and "nvidia-cuda-cccl-cu12" not in text
    tf_case = re.search(r"^ +tensorflow\) extras=\S+ \\\n +&& \{ command -v nvcc >/dev/null \|\| \{ echo (\"[^\"]+\") >&2; "
                        r"exit 2; \}; \} ;;", text, re.M)
    assert tf_case, text
    assert tf_case.group(1) == ('"FRAMEWORK=tensorflow: BUILD_IMAGE has no nvcc on PATH, and PyPI has no CUDA 12 '
                                "compiler (nvidia-cuda-nvcc-cu12 holds only ptxas): build on "
                                "nvidia/cuda:12.9.1-devel-ubuntu24.04 or another BUILD_IMAGE with CUDA 12's nvcc\"")
    # TensorFlow's own nvidia-cuda-nvcc-cu12 (XLA runs its ptxas) is not uninstalled; cmake is.
    assert 'if [ "$FRAMEWORK" = tensorflow ]; then /opt/venv/bin/pip uninstall --quiet -y cmake; \\' in text


def test_make_has_a_target_per_gpu_image():
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY: (.*)$", text, re.M).group(1).split()
    for target, variant in (("docker-gpu-torch", "gpu-torch"), ("docker-gpu-tf", "gpu-tf")):
        assert target in phony
        assert re.search(rf"^{target}:\n\tpython3 docker/build.py {variant}$", text, re.M), target
