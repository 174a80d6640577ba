#!/usr/bin/env bash
# The GPU checks, on a machine with one NVIDIA GPU, a CUDA driver and PyPI (not needed by CI):
#   1. scripts/install.sh with HVDSYNC_HOROVOD_GPU=nccl: the venv with torch from PyPI (a CUDA build) and Horovod
#      0.28.1 built with NCCL (scripts/build_horovod.sh; its wheel cache makes a second run take seconds);
#   2. `horovodrun --check-build`, which must list NCCL (the script stops if it does not);
#   3. `benchmarks/gpu.py bench` under `horovodrun -np 1`: a ResNet-18-style CNN on synthetic images, plain torch vs a
#      raw Horovod loop vs hvdsync's adapter (interleaved repetitions, ratio to torch, final parameters compared), and
#      an all-reduce sweep on GPU tensors (1-256 MiB, results checked) with torch.distributed NCCL beside it.
# Everything goes to one folder: check-build.txt, results.json, and the log of this script (gpu.log). By default that
# folder is a record of the gpu suite, benchmarks/results/gpu/<date>-bench-<tag>/ (tag: HVDSYNC_GPU_TAG, default
# gpu-sh), listed in the index (benchmarks/results/README.md) once the run has succeeded.
#
#   bash benchmarks/gpu.sh                          # results in benchmarks/results/gpu/<date>-bench-gpu-sh/
#   HVDSYNC_GPU_TAG=h200 bash benchmarks/gpu.sh     # ... in benchmarks/results/gpu/<date>-bench-h200/
#   HVDSYNC_GPU_OUT=/some/dir bash benchmarks/gpu.sh -- --reps 3   # elsewhere, not recorded; after -- to gpu.py bench
#
# Time: the cold Horovod build with NCCL (torch + TensorFlow, CUDA kernels for HOROVOD_BUILD_CUDA_CC_LIST, default
# 80,90) is the long part; on 16 cores a torch-only build for one architecture took 2 minutes (see
# benchmarks/results/gpu/2026-11-30-bench-h200.md); the benchmark itself takes about 1.5 minutes on an H200.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tag="${HVDSYNC_GPU_TAG:-gpu-sh}"
# The tag ends the record's name (benchmarks/results/README.md lists it): checked now, not after the build.
[[ "$tag" =~ ^[a-z0-9]+(-[a-z0-9]+)*$ ]] \
  || { echo "[gpu] error: HVDSYNC_GPU_TAG=$tag: lower case, digits and dashes" >&2; exit 2; }
record="$(date -u +%Y-%m-%d)-bench-$tag"
# Before anything is written: a machine without a GPU leaves no half-made record behind.
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null \
  || { echo "[gpu] error: no nvidia-smi: this script needs an NVIDIA GPU and its driver" >&2; exit 2; }
out="${HVDSYNC_GPU_OUT:-benchmarks/results/gpu/$record}"
mkdir -p "$out"
exec > >(tee -a "$out/gpu.log") 2>&1
say() { printf '[gpu] %s %s\n' "$(date -u +%H:%M:%S)" "$*"; }
[ "${1:-}" = "--" ] && shift
nvidia-smi -L

# GCC >= 13: scripts/build_horovod.sh adds the includes Horovod 0.28.1 lacks (its comment says which and why).

start=$(date +%s)
say "installing (Horovod with NCCL; a cold build takes minutes, a cached wheel seconds)"
HVDSYNC_HOROVOD_GPU=nccl bash scripts/install.sh
say "install took $(( $(date +%s) - start )) s"

venv="${HVDSYNC_VENV:-.venv}"
"$venv/bin/horovodrun" --check-build | tee "$out/check-build.txt"
grep -q '\[X\] NCCL' "$out/check-build.txt" || { say "error: horovodrun --check-build does not list NCCL"; exit 1; }

say "benchmark"
PYTHONUNBUFFERED=1 "$venv/bin/horovodrun" -np 1 -H localhost:1 \
  "$venv/bin/python" benchmarks/gpu.py bench --json "$out/results.json" "$@"
if [ -z "${HVDSYNC_GPU_OUT:-}" ]; then  # a record of the gpu suite: listed in the index, which is regenerated
  gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  "$venv/bin/python" benchmarks/index.py add "gpu/$record" --command "bash benchmarks/gpu.sh${*:+ -- $*}" \
    --shows "$gpu_name: NCCL in --check-build; img/s of plain torch, raw Horovod, hvdsync; all-reduce sweep"
fi
say "done in $(( $(date +%s) - start )) s: $out"
