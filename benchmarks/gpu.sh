#!/usr/bin/env bash
# The GPU checks, on a machine with one NVIDIA GPU, a CUDA driver and PyPI (not needed by CI):
#   1. scripts/install.sh with HVDSYNC_HOROVOD_GPU=nccl: the venv with torch from PyPI (a CUDA build) and Horovod
#      0.28.1 built with NCCL (scripts/build_horovod.sh; its wheel cache makes a second run take seconds);
#   2. `horovodrun --check-build`, which must list NCCL (the script stops if it does not);
#   3. benchmarks/gpu_bench.py under `horovodrun -np 1`: a ResNet-18-style CNN on synthetic images, plain torch vs a
#      raw Horovod loop vs hvdsync's adapter (interleaved repetitions, ratio to torch, final parameters compared), and
#      an all-reduce sweep on GPU tensors (1-256 MiB, results checked) with torch.distributed NCCL beside it.
# Everything goes to one folder: check-build.txt, results.json, and the log of this script (gpu.log).
#
#   bash benchmarks/gpu.sh                          # results in benchmarks/results/gpu-<date>/
#   HVDSYNC_GPU_OUT=/some/dir bash benchmarks/gpu.sh -- --reps 3   # arguments after -- go to gpu_bench.py
#
# Time: the cold Horovod build with NCCL (torch + TensorFlow, CUDA kernels for HOROVOD_BUILD_CUDA_CC_LIST, default
# 80,90) is the long part; on 16 cores a torch-only build for one architecture took 2 minutes (see
# benchmarks/results/gpu-h200-2026-11-30.md); the benchmark itself takes about 1.5 minutes on an H200.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out="${HVDSYNC_GPU_OUT:-benchmarks/results/gpu-$(date -u +%Y-%m-%d)}"
mkdir -p "$out"
exec > >(tee -a "$out/gpu.log") 2>&1
say() { printf '[gpu] %s %s\n' "$(date -u +%H:%M:%S)" "$*"; }
[ "${1:-}" = "--" ] && shift

command -v nvidia-smi >/dev/null && nvidia-smi -L || { say "error: no nvidia-smi: this script needs an NVIDIA GPU and its driver"; exit 2; }

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
  "$venv/bin/python" benchmarks/gpu_bench.py --json "$out/results.json" "$@"
say "done in $(( $(date +%s) - start )) s: $out"
