"""The two GPU images (hvdsync:gpu-torch, hvdsync:gpu-tf), checked without building them: what docker/build.py would
run for each (``--plan``), that Dockerfile.gpu gives each its own CUDA and Horovod for its framework alone, and the
Makefile's targets. Building them (an hour of CUDA compiling without a cached wheel) is tests/docker's, opt-in."""
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
    lines = _plan("gpu-tf", "--base", "hvdsync-base:bookworm", "--tag", "mine:tf")
    assert "TAGS=mine:tf" in lines and "BUILD_ARG BUILD_IMAGE=hvdsync-base:bookworm" in lines
    assert "BUILD_ARG BASE_IMAGE=hvdsync-base:bookworm" in lines


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


def test_the_cu12_compiler_wheels_agree_with_tensorflows_cuda_extra():
    # TensorFlow 2.21's and-cuda extra asks for CUDA 12 >= 12.5.82 (its wheel's metadata); the compiler wheels must be
    # CUDA 12 too, or build_horovod.sh refuses the compiler (tests/repo/test_build_script_cuda12.py).
    reqs = [line for line in (ROOT / "scripts" / "cuda-build-requirements-cu12.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert reqs == ["nvidia-cuda-nvcc-cu12>=12.5.82,<13", "nvidia-cuda-runtime-cu12>=12.5.82,<13",
                    "nvidia-cuda-cccl-cu12>=12.5,<13"]


def test_make_has_a_target_per_gpu_image():
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY: (.*)$", text, re.M).group(1).split()
    for target, variant in (("docker-gpu-torch", "gpu-torch"), ("docker-gpu-tf", "gpu-tf")):
        assert target in phony
        assert re.search(rf"^{target}:\n\tpython3 docker/build.py {variant}$", text, re.M), target
