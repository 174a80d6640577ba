#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU, its driver and Python 3.11, with or without a package index
# (not needed by CI). Two steps:
#
#   bash benchmarks/gpu.sh --prepare DIR [--wheels]       # on a machine that reaches PyPI: what to carry, in DIR
#   bash benchmarks/gpu.sh [--from DIR] [--out OUT] [-- gpu.py bench options]   # on the GPU machine
#
# --prepare DIR saves:
#   DIR/horovod-0.28.1.tar.gz  Horovod's sdist, PyPI's file (scripts/build_horovod.sh pins and checks its sha256):
#                              all a GPU machine that already has pip access to the wheels below needs.
#   DIR/wheels/  (--wheels; several GB) every wheel of the GPU environment, for a machine without any index: hvdsync's
#                dependencies with the extras torch,notebooks,dev,build at constraints.txt's pins (torch 2.13.0 as
#                PyPI serves it: the CUDA 13.0 build and its nvidia-* wheels, nvidia-nccl-cu13 among them), the CUDA
#                compiler wheels of scripts/cuda-build-requirements.txt (for a machine without nvcc), and pip,
#                setuptools, wheel. Downloaded for the platform of the machine that prepares (Linux x86_64, CPython
#                3.11, as the GPU machine). A CPU build of torch (a pip set up with PyTorch's CPU index or a CPU pin)
#                is refused there, not found out on the GPU machine.
#   DIR/SHA256SUMS
# No TensorFlow: its 2.21 GPU wheels are built for CUDA 12 and torch 2.13's for CUDA 13, and one environment cannot
# give both a usable CUDA (docker/README.md); the run builds Horovod for PyTorch only (HVDSYNC_HOROVOD_FRAMEWORKS=torch).
#
# The run (under 10 minutes on one GPU with 16 cores, most of it the Horovod build; a cached wheel makes it seconds):
#   1. nvidia-smi must list a GPU (checked before anything is written);
#   2. scripts/install.sh with HVDSYNC_EXTRAS=torch,notebooks,dev,build and, for scripts/build_horovod.sh,
#      HVDSYNC_HOROVOD_FRAMEWORKS=torch, HVDSYNC_HOROVOD_GPU=nccl and HOROVOD_BUILD_CUDA_CC_LIST = this GPU's compute
#      capability (one architecture: a fraction of the default 80,90 build); pip's CUDA compiler wheels where the
#      machine has no nvcc. With --from DIR: HVDSYNC_HOROVOD_SDIST=DIR, and, where DIR/wheels exists, pip without an
#      index (PIP_NO_INDEX=1, PIP_FIND_LINKS=DIR/wheels). The build's decisions first (`build_horovod.sh --plan`);
#   3. `horovodrun --check-build`, which must list NCCL and PyTorch;
#   4. the GPU test module (tests/gpu, marker gpu): its report and JUnit XML;
#   5. `benchmarks/gpu.py bench` under `horovodrun -np 1`: a ResNet-18-style CNN, plain torch vs a raw Horovod loop vs
#      hvdsync's adapter, their all-reduce hooks forced on at one rank (Horovod skips them there) and Horovod's
#      timeline read to prove every step all-reduced every gradient over NCCL, and an all-reduce sweep on GPU tensors.
# Every result goes to one folder: gpu.log (all of this script's output), nvidia-smi.txt, build-plan.txt,
# check-build.txt, tests-gpu.txt, tests-gpu.xml, results.json, timings.txt. By default that folder is a record of the gpu
# suite, benchmarks/results/gpu/<date>-bench-<tag>/ (tag: HVDSYNC_GPU_TAG, default gpu-sh), listed in the index
# (benchmarks/results/README.md) once everything passed; --out OUT (or HVDSYNC_GPU_OUT) writes elsewhere, unrecorded.
# The script ends with a non-zero status if the GPU tests failed, after the benchmark has run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOROVOD_VERSION=0.28.1
EXTRAS="torch,notebooks,dev,build"
say() { printf '[gpu] %s %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[gpu] error: %s\n' "$*" >&2; exit 2; }

prepare="" wheels="" from="" out="${HVDSYNC_GPU_OUT:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) [ -n "${2:-}" ] || die "--prepare needs a folder: bash benchmarks/gpu.sh --prepare DIR"
               prepare="$2"; shift ;;
    --wheels) wheels=1 ;;
    --from) [ -n "${2:-}" ] || die "--from needs the folder --prepare filled"; from="$2"; shift ;;
    --out) [ -n "${2:-}" ] || die "--out needs a folder"; out="$2"; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (bash benchmarks/gpu.sh --help); options for gpu.py bench go after --" ;;
  esac
  shift
done
[ -z "$wheels" ] || [ -n "$prepare" ] || die "--wheels goes with --prepare DIR"

# ---- --prepare: on a machine with an index -------------------------------------------------------------------------
if [ -n "$prepare" ]; then
  py="${PYTHON:-python3}"
  mkdir -p "$prepare"
  # The one sha256 the build accepts, read from the build script so that there is one place to change it.
  want="$(sed -n 's/^HOROVOD_SDIST_SHA256=//p' scripts/build_horovod.sh)"
  sdist="$prepare/horovod-$HOROVOD_VERSION.tar.gz"
  say "Horovod $HOROVOD_VERSION's sdist -> $sdist"
  "$py" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$prepare" \
    || die "pip could not download horovod==$HOROVOD_VERSION's sdist with $py (is an index reachable?)"
  got="$(sha256sum "$sdist" | cut -c1-64)"
  [ "$got" = "$want" ] || die "$sdist has sha256 $got, not PyPI's $want: the index pip used serves another file"
  if [ -n "$wheels" ]; then
    say "the GPU environment's wheels -> $prepare/wheels (several GB)"
    "$py" -m pip download --quiet -d "$prepare/wheels" -c constraints.txt ".[$EXTRAS]" \
      -r scripts/cuda-build-requirements.txt pip "setuptools>=77" wheel \
      || die "pip could not download the GPU environment's wheels (its messages above)"
    cpu_torch="$(ls "$prepare"/wheels/torch-*+cpu*.whl 2>/dev/null || true)"
    [ -z "$cpu_torch" ] || die "pip chose torch's CPU build (${cpu_torch##*/}): a GPU machine needs PyPI's torch; run \
--prepare with PIP_INDEX_URL=https://pypi.org/simple and no PyTorch CPU index or CPU pin in pip's settings"
  fi
  (cd "$prepare" && find . -type f ! -name SHA256SUMS | LC_ALL=C sort | xargs sha256sum > SHA256SUMS)
  say "ready: carry $prepare and run: bash benchmarks/gpu.sh --from $prepare"
  exit 0
fi

# ---- the run: on the GPU machine ---------------------------------------------------------------------------------
tag="${HVDSYNC_GPU_TAG:-gpu-sh}"
# The tag ends the record's name (benchmarks/results/README.md lists it): checked now, not after the build.
[[ "$tag" =~ ^[a-z0-9]+(-[a-z0-9]+)*$ ]] || die "HVDSYNC_GPU_TAG=$tag: lower case, digits and dashes"
record="$(date -u +%Y-%m-%d)-bench-$tag"
# Before anything is written: a machine without a GPU leaves no half-made record behind.
if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  found="no nvidia-smi on PATH (no NVIDIA driver)"
  command -v nvidia-smi >/dev/null && found="nvidia-smi lists no GPU"
  # A CUDA compiler is often taken for a GPU (a CUDA container or toolkit on a CPU machine): say it is not one.
  if nvcc_bin="$(command -v nvcc)"; then
    found="$found, though $nvcc_bin (CUDA $("$nvcc_bin" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')) is here: a CUDA compiler is no GPU"
  fi
  die "$found; run this on a machine with an NVIDIA GPU and its driver (nvidia-smi -L lists it); without one: python benchmarks/gpu.py --cpu (the bench part's self-test)"
fi
if [ -n "$from" ]; then
  [ -f "$from/horovod-$HOROVOD_VERSION.tar.gz" ] \
    || die "--from $from: no horovod-$HOROVOD_VERSION.tar.gz there (made by: bash benchmarks/gpu.sh --prepare DIR)"
  from="$(cd "$from" && pwd -P)"
fi
recorded=""
[ -n "$out" ] || { out="benchmarks/results/gpu/$record"; recorded=1; }
mkdir -p "$out"
exec > >(tee -a "$out/gpu.log") 2>&1
nvidia-smi | tee "$out/nvidia-smi.txt"
start=$(date +%s)
phase() { printf '%s %s\n' "$1" "$(( $(date +%s) - start ))" >> "$out/timings.txt"; }

# What scripts/install.sh and scripts/build_horovod.sh read (exported: install.sh runs the build).
export HVDSYNC_EXTRAS="${HVDSYNC_EXTRAS:-$EXTRAS}"
export HVDSYNC_HOROVOD_FRAMEWORKS="${HVDSYNC_HOROVOD_FRAMEWORKS:-torch}" HVDSYNC_HOROVOD_GPU=nccl
if [ -z "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
  # This GPU's architecture only ("9.0" -> 90); a driver too old to say keeps the build script's default.
  cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ' || true)"
  [[ "$cc" =~ ^[0-9]+$ ]] && export HOROVOD_BUILD_CUDA_CC_LIST="$cc"
fi
if [ -n "$from" ]; then
  export HVDSYNC_HOROVOD_SDIST="$from"
  if [ -d "$from/wheels" ]; then
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$from/wheels"
  else
    say "note: $from has no wheels/: pip installs from the index this machine's pip is set up with"
  fi
fi
venv="${HVDSYNC_VENV:-.venv}"

say "installing the environment (torch's CUDA build; no TensorFlow)"
HVDSYNC_INSTALL_HOROVOD=0 bash scripts/install.sh
if [ "${HVDSYNC_CUDA_FROM_WHEELS:-0}" = 1 ] || { ! command -v nvcc >/dev/null \
     && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; }; then
  say "no CUDA compiler here: NVIDIA's compiler wheels (scripts/cuda-build-requirements.txt)"
  "$venv/bin/python" -m pip install --quiet -c constraints.txt -r scripts/cuda-build-requirements.txt
fi
phase install
PYTHON="$venv/bin/python" bash scripts/build_horovod.sh --plan | tee "$out/build-plan.txt"
say "building Horovod with NCCL (a cold build takes minutes, a cached wheel seconds)"
PYTHON="$venv/bin/python" bash scripts/build_horovod.sh
phase horovod

"$venv/bin/horovodrun" --check-build | tee "$out/check-build.txt"
for part in NCCL PyTorch; do
  grep -q "\[X\] $part" "$out/check-build.txt" || { say "error: horovodrun --check-build does not list $part"; exit 1; }
done

say "the GPU tests (tests/gpu)"
tests_ok=1
if ! "$venv/bin/python" -m pytest tests/gpu -m gpu -rs -p no:cacheprovider --junitxml="$out/tests-gpu.xml" 2>&1 \
     | tee "$out/tests-gpu.txt"; then
  tests_ok=""
  say "error: GPU tests failed (tests-gpu.txt); the benchmark runs all the same"
fi
phase tests

say "benchmark"
PYTHONUNBUFFERED=1 "$venv/bin/horovodrun" -np 1 -H localhost:1 \
  "$venv/bin/python" benchmarks/gpu.py bench --json "$out/results.json" "$@"
phase bench
if [ -n "$recorded" ] && [ -n "$tests_ok" ]; then  # a record of the gpu suite: listed in the index (regenerated)
  gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
  "$venv/bin/python" benchmarks/index.py add "gpu/$record" --command "bash benchmarks/gpu.sh${*:+ -- $*}" \
    --shows "$gpu_name: NCCL in --check-build; GPU tests; img/s of plain torch, raw Horovod, hvdsync; all-reduce sweep"
fi
say "done in $(( $(date +%s) - start )) s: $out"
[ -n "$tests_ok" ] || exit 1
