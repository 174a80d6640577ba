#!/usr/bin/env bash
# Build (or reuse) Horovod 0.28.1 for the Python environment that runs this script, with Gloo and the frameworks of
# that environment (PyTorch, TensorFlow or both), on today's stack. Used by scripts/install.sh, the Makefile, the
# Dockerfiles and benchmarks/gpu.sh.
#
# Why a script and not `pip install horovod`: 0.28.1 (the last release) does not build as shipped against
# torch >= 2.1 (C++17), TensorFlow >= 2.16 (XLA headers) or CMake 4 (gloo's cmake_minimum_required). The fixes
# are the patch files in scripts/horovod-patches/, each of which says why and which upstream change it mirrors.
#
# The built wheel is cached under $HVDSYNC_CACHE (default ~/.cache/hvdsync), keyed by everything it was built
# against: Horovod version, the frameworks built (torch, TensorFlow), Python ABI, CUDA/NCCL (or cpu), the MPI (where
# one is built in), the compiler, and the diffs of the patches with this script's RECIPE number. A second run with the same key installs the cached
# wheel in seconds; any change to the key rebuilds from a clean source tree (a reused tree breaks CMake:
# third_party/compatible17_gloo is left).
#
# Environment knobs:
#   PYTHON                    the interpreter of the target environment (default: python on PATH)
#   HVDSYNC_CACHE             cache folder (default ${XDG_CACHE_HOME:-~/.cache}/hvdsync)
#   HVDSYNC_HOROVOD_REBUILD=1 ignore the cache
#   HVDSYNC_HOROVOD_FRAMEWORKS  auto (default: those installed) | torch | tensorflow | torch,tensorflow
#   HVDSYNC_HOROVOD_GPU       auto (default) | cpu | nccl: see "Gloo only, or with NCCL" below
#   HVDSYNC_HOROVOD_MPI       auto (default: with MPI where mpicxx and mpirun are on PATH) | on | off: "MPI beside Gloo"
#   HVDSYNC_HOROVOD_SDIST     a local horovod-0.28.1.tar.gz (or a folder holding it) instead of PyPI's, for machines
#                             without a package index (benchmarks/gpu.sh --prepare DIR saves one)
#   HVDSYNC_CUDA_FROM_WHEELS=1  NCCL builds for CUDA >= 13: take nvcc and CUDA's headers from pip's wheels even if a
#                             system CUDA exists (CUDA 12 has no such wheels: see "Gloo only, or with NCCL")
#   HOROVOD_BUILD_CUDA_CC_LIST  GPU builds only: compute capabilities (default 80,90: A100, H100/H200)
# Arguments (nothing is built with either):
#   --print-key  the cache key and the cache folder, two lines
#   --plan       every decision as KEY=VALUE lines (FRAMEWORKS, HOROVOD_WITH[OUT]_*, GPU_OPERATIONS, GPU, MPI, SDIST, KEY,
#                KEY_DIR; CUDA_HOME and NCCL_HOME for NCCL builds), or the one error line a build would stop with
set -euo pipefail

HOROVOD_VERSION=0.28.1
# PyPI's sha256 of horovod-0.28.1.tar.gz. The patches and the cache key describe that file: a carried sdist (or a
# download from a mirror) that differs would build something else under the same key.
HOROVOD_SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
# Bump when the build recipe below changes in a way that changes the wheel (flags, steps): it is part of the key.
RECIPE=1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
patch_dir="$here/horovod-patches"
PY="${PYTHON:-python}"
cache_root="${HVDSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdsync}/horovod"

say() { printf '[build_horovod] %s\n' "$*" >&2; }
# Until the GPU decision below, only shell builtins, sed, cut, paste, cat, ls, head and sha256sum are used: the
# tests run this part with a PATH of those tools only (a bare machine without a CUDA toolkit).
die() { say "error: $*"; exit 2; }

action=build
case "${1:-}" in
  "") ;;
  --print-key) action=print-key ;;
  --plan) action=plan ;;
  *) die "unknown argument '$1'; use --print-key, --plan or no argument" ;;
esac

mode="${HVDSYNC_HOROVOD_GPU:-auto}"
case "$mode" in
  auto|cpu|nccl) ;;
  *) die "HVDSYNC_HOROVOD_GPU: '$mode' is not allowed; choose one of: auto, cpu, nccl" ;;
esac

# ---- what the environment holds ------------------------------------------------------------------------------
# From files and package metadata, without importing torch or TensorFlow (that would cost seconds): each framework's
# version and whether it is a CUDA build (torch/version.py; TensorFlow's build_info.py), pip's CUDA toolkit (the
# nvidia-cuda-* wheels of CUDA >= 13 share one tree, nvidia/cu<major>) and the NCCL wheel.
facts="$("$PY" - <<'PYEOF'
import importlib.util, os, re, shlex, sys, sysconfig
from importlib import metadata

def where(name):
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        return ""
    return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else ""

def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""

def text(*parts):
    try:
        with open(os.path.join(*parts)) as f:
            return f.read()
    except OSError:
        return ""

facts = {"pyabi": f"cp{sys.version_info.major}{sys.version_info.minor}-{sysconfig.get_platform()}"}
torch = where("torch")
facts["torch_found"] = "1" if torch else ""
facts["torch_version"] = version("torch")
m = re.search(r"^cuda(?:: [^=]+)? = '([0-9.]+)'", text(torch, "version.py"), re.M) if torch else None
facts["torch_cuda"] = m.group(1) if m else ""
tf = where("tensorflow")
facts["tf_found"] = "1" if tf else ""
# `tensorflow-cpu` first: it is the name existing caches are keyed by (below).
facts["tf_dist"] = next((name for name in ("tensorflow-cpu", "tensorflow") if version(name)), "")
facts["tf_version"] = version(facts["tf_dist"]) if facts["tf_dist"] else ""
info = text(tf, "python", "platform", "build_info.py") if tf else ""
m = re.search(r"'cuda_version', '([0-9.]+)'", info)
facts["tf_cuda"] = m.group(1) if m and "('is_cuda_build', True)" in info else ""
nvidia = where("nvidia")
facts["nvidia_dir"] = nvidia
nccl = where("nvidia.nccl") if nvidia else ""
facts["wheel_nccl"] = nccl if nccl and os.path.exists(os.path.join(nccl, "include", "nccl.h")) else ""
print(" ".join(f"{k}={shlex.quote(v)}" for k, v in facts.items()))
PYEOF
)" || die "could not run $PY to look at its environment (PYTHON names the target environment's interpreter)"
eval "$facts"

# ---- which frameworks ------------------------------------------------------------------------------------------
# auto: every framework importable in the environment (today's default, both in the `all` extra). A framework left
# out is built with HOROVOD_WITHOUT_<it>, so a torch-only venv builds (and a CUDA torch is not held back by a
# tensorflow-cpu it does not need).
asked="${HVDSYNC_HOROVOD_FRAMEWORKS:-auto}"
with_torch="" with_tf=""
if [ "$asked" = auto ]; then
  with_torch="$torch_found" with_tf="$tf_found"
  [ -n "$with_torch$with_tf" ] \
    || die "neither torch nor tensorflow is installed in $PY's environment; install the frameworks before building Horovod (scripts/install.sh does)"
else
  IFS=, read -r -a wanted <<< "$asked"
  [ "${#wanted[@]}" -gt 0 ] || die "HVDSYNC_HOROVOD_FRAMEWORKS is empty; choose one of: auto, torch, tensorflow, torch,tensorflow"
  for fw in "${wanted[@]}"; do
    case "$fw" in
      torch) [ -n "$torch_found" ] || die "HVDSYNC_HOROVOD_FRAMEWORKS=$asked: torch is not installed in $PY's environment; install it first or leave it out"
             with_torch=1 ;;
      tensorflow) [ -n "$tf_found" ] || die "HVDSYNC_HOROVOD_FRAMEWORKS=$asked: tensorflow is not installed in $PY's environment; install it first (tensorflow-cpu, or tensorflow for NCCL builds) or leave it out"
                  with_tf=1 ;;
      *) die "HVDSYNC_HOROVOD_FRAMEWORKS: '$fw' is not allowed; choose one of: auto, torch, tensorflow, torch,tensorflow" ;;
    esac
  done
fi
[ -z "$with_torch" ] || [ -n "$torch_version" ] \
  || die "torch is importable but pip knows no torch distribution (no package metadata); install the frameworks with pip before building Horovod"
[ -z "$with_tf" ] || [ -n "$tf_version" ] \
  || die "tensorflow is importable but pip knows neither tensorflow-cpu nor tensorflow; install the frameworks with pip before building Horovod"
frameworks="${with_torch:+torch}${with_torch:+${with_tf:+,}}${with_tf:+tensorflow}"
# Each framework in words, for the lines below.
torch_is="torch $torch_version (a CPU build)" tf_is="$tf_dist $tf_version (a CPU build)"
[ -z "$torch_cuda" ] || torch_is="torch $torch_version (a CUDA $torch_cuda build)"
[ -z "$tf_cuda" ] || tf_is="$tf_dist $tf_version (a CUDA $tf_cuda build)"

# ---- Gloo only, or with NCCL ---------------------------------------------------------------------------------
# HVDSYNC_HOROVOD_GPU=auto (default): NCCL only where a framework to build is a CUDA build AND a CUDA compiler and
# NCCL are found; otherwise Gloo only. A machine with nvcc but CPU frameworks (a CPU venv on a box that has CUDA)
# therefore stays CPU, and says so once: a CUDA Horovod next to CPU torch would only fail at run time.
# HVDSYNC_HOROVOD_GPU=cpu: Gloo only, whatever is installed. HVDSYNC_HOROVOD_GPU=nccl: NCCL or a clear error naming
# the missing piece. The CUDA toolkit comes from nvcc on PATH / $CUDA_HOME, or, when there is none (or
# HVDSYNC_CUDA_FROM_WHEELS=1), from pip's CUDA 13 wheels in the environment (scripts/cuda-build-requirements.txt; one
# tree, nvidia/cu13); NCCL from $HOROVOD_NCCL_HOME, the nvidia-nccl wheel the framework pulls in, or /usr. CUDA 12
# (TensorFlow's) has no compiler on PyPI: nvidia-cuda-nvcc-cu12 ships ptxas but no nvcc (the wheel's file list;
# NVIDIA/cuda-python issue #2100), so it takes a CUDA 12 toolkit; NCCL can still be tensorflow[and-cuda]'s wheel.
# NCCL is never built for a CPU-only framework next to a CUDA one (CUDA torch with tensorflow-cpu): Horovod compiles
# GPU ops for every framework it builds, and the TensorFlow ones link to GPU kernels tensorflow-cpu does not have
# (the build then fails its own import check, docker/README.md). Which to change is the user's choice, so the build
# stops and names both ways: the CUDA build of the other framework, or HVDSYNC_HOROVOD_FRAMEWORKS without it.
gpu="cpu" cuda_home="" cuda_version="" nccl_home=""
if [ "$mode" != cpu ]; then
  cuda_fws="" cpu_fws="" cuda_names="" want_cuda="" want_from=""
  if [ -n "$with_torch" ] && [ -n "$torch_cuda" ]; then
    cuda_fws="$torch_is" cuda_names="torch" want_cuda="$torch_cuda" want_from="torch's"
  elif [ -n "$with_torch" ]; then
    cpu_fws="$torch_is" cpu_fix="pip install torch==${torch_version%%+*} from PyPI, not from a CPU index"
  fi
  if [ -n "$with_tf" ] && [ -n "$tf_cuda" ]; then
    cuda_fws="${cuda_fws:+$cuda_fws and }$tf_is" cuda_names="${cuda_names:+$cuda_names,}tensorflow"
    [ -n "$want_cuda" ] || { want_cuda="$tf_cuda"; want_from="TensorFlow's"; }
  elif [ -n "$with_tf" ]; then
    cpu_fws="${cpu_fws:+$cpu_fws and }$tf_is"
    cpu_fix="${cpu_fix:+$cpu_fix; }pip uninstall tensorflow-cpu && pip install tensorflow==$tf_version (scripts/install.sh: HVDSYNC_EXTRAS=gpu)"
  fi
  wheel_cuda=""
  if [ -n "$want_cuda" ] && [ -n "$nvidia_dir" ] && [ -x "$nvidia_dir/cu${want_cuda%%.*}/bin/nvcc" ]; then
    wheel_cuda="$nvidia_dir/cu${want_cuda%%.*}"
  fi
  nvcc_bin=""
  if [ "${HVDSYNC_CUDA_FROM_WHEELS:-0}" != 1 ]; then
    nvcc_bin="$(command -v nvcc || true)"
    if [ -z "$nvcc_bin" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then nvcc_bin="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"; fi
  fi
  if [ -z "$nvcc_bin" ] && [ -n "$wheel_cuda" ]; then nvcc_bin="$wheel_cuda/bin/nvcc"; fi
  nccl_home="${HOROVOD_NCCL_HOME:-$wheel_nccl}"
  if [ -z "$nccl_home" ] && [ -f /usr/include/nccl.h ]; then nccl_home=/usr; fi
  if [ -n "$nvcc_bin" ]; then
    cuda_version="$("$nvcc_bin" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    # The toolkit's root as nvcc itself sees it (nvcc on PATH may be a wrapper or a symlink).
    top="$( ("$nvcc_bin" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 || true) | sed -n 's/^#\$ TOP=//p' | head -n 1)"
    cuda_home="$(cd "${top:-${nvcc_bin%/*}/..}" 2>/dev/null && pwd -P)" || cuda_home="${nvcc_bin%/*}/.."
  fi

  if [ -z "$cuda_fws" ]; then
    # No framework to build can use a GPU.
    if [ "$mode" = nccl ] && [ -n "$with_torch" ]; then
      die "HVDSYNC_HOROVOD_GPU=nccl, but this is missing: the CUDA build of torch (this environment has $cpu_fws; $cpu_fix)"
    elif [ "$mode" = nccl ]; then
      die "HVDSYNC_HOROVOD_GPU=nccl, but this is missing: TensorFlow's CUDA build (this environment has $cpu_fws; $cpu_fix)"
    elif [ -n "$nvcc_bin" ] && [ "$action" != print-key ]; then
      say "note: $nvcc_bin (CUDA $cuda_version) is here, but no GPU build is possible: this environment has $cpu_fws; building Gloo only (for NCCL: $cpu_fix; HVDSYNC_HOROVOD_GPU=cpu asks for Gloo only without this note)"
    fi
  else
    missing=""
    hint="set HVDSYNC_CUDA_FROM_WHEELS=1 to use pip's CUDA wheels instead"
    [ "${want_cuda%%.*}" != 12 ] || hint="put a CUDA 12 toolkit's bin/ first on PATH"
    if [ -z "$nvcc_bin" ] && [ "${want_cuda%%.*}" = 12 ]; then
      missing="a CUDA 12 compiler for $want_from CUDA $want_cuda: no nvcc on PATH or in \$CUDA_HOME, and PyPI has none for CUDA 12 (nvidia-cuda-nvcc-cu12 holds only ptxas): build in nvidia/cuda:12.9.1-devel-ubuntu24.04 (make docker-gpu-tf where a registry reaches it) or install a CUDA 12 toolkit (NVIDIA's; Debian 13's nvidia-cuda-toolkit, non-free) and set CUDA_HOME"
    elif [ -z "$nvcc_bin" ]; then
      missing="a CUDA compiler: no nvcc on PATH or in \$CUDA_HOME, and no nvidia-cuda-nvcc wheel for CUDA $want_cuda in this environment (pip install -r scripts/cuda-build-requirements.txt)"
    elif [ "${cuda_version%%.*}" != "${want_cuda%%.*}" ]; then
      missing="a CUDA compiler for $want_from CUDA $want_cuda: $nvcc_bin is CUDA $cuda_version ($hint)"
    elif [ -z "$(ls "$cuda_home"/include/cuda_runtime.h "$cuda_home"/targets/*/include/cuda_runtime.h 2>/dev/null)" ]; then
      missing="CUDA's runtime headers: no include/cuda_runtime.h beside $nvcc_bin (the nvidia-cuda-runtime wheel, or a CUDA toolkit)"
    elif [ -z "$nccl_home" ]; then
      missing="NCCL: no \$HOROVOD_NCCL_HOME, no nvidia-nccl-cu${want_cuda%%.*} wheel in this environment, no /usr/include/nccl.h"
    fi
    mismatch=""
    if [ -n "$cpu_fws" ]; then
      mismatch="Horovod with NCCL cannot be built for a CPU-only framework: this environment has $cuda_fws but $cpu_fws; install the CUDA build of the CPU one ($cpu_fix) or build without it: HVDSYNC_HOROVOD_FRAMEWORKS=$cuda_names (Gloo only: HVDSYNC_HOROVOD_GPU=cpu)"
    fi
    # --print-key names the key of the build asked for (tests and tools ask it of made-up environments); whether that
    # build may be made is for --plan and the build itself.
    blocking="$mismatch"
    [ "$action" != print-key ] || blocking=""
    if [ -z "$missing" ] && [ -z "$blocking" ]; then
      [ -z "$mismatch" ] || say "note: the key of a build that --plan and the build refuse: $mismatch"
      nccl_version="$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$nccl_home/include/nccl.h" | paste -sd.)"
      gpu="cuda${cuda_version}-nccl${nccl_version}-cc${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}"
      if [ -n "$with_torch" ] && [ -n "$torch_cuda" ] && [ -n "$with_tf" ] && [ -n "$tf_cuda" ] \
         && [ "${torch_cuda%%.*}" != "${tf_cuda%%.*}" ]; then
        # Built and usable by torch; TensorFlow's extension links, but TensorFlow finds no CUDA ${tf_cuda%%.*} runtime
        # here and runs on the CPU (docker/README.md). Said, not refused: the GPU image is built this way.
        say "note: torch is built for CUDA $torch_cuda and TensorFlow for CUDA $tf_cuda: NCCL is built for CUDA $cuda_version; TensorFlow will not use the GPUs in this environment (one environment per framework: HVDSYNC_HOROVOD_FRAMEWORKS=torch, or tensorflow with CUDA ${tf_cuda%%.*})"
      fi
    elif [ "$mode" = nccl ] && [ -n "$missing" ]; then
      die "HVDSYNC_HOROVOD_GPU=nccl, but this is missing: $missing${blocking:+; and }$blocking"
    elif [ -z "$missing" ]; then
      die "HVDSYNC_HOROVOD_GPU=$mode, CUDA $cuda_version and NCCL found: $blocking"
    else
      # A framework can use GPUs but Horovod will not: say so once rather than leave a silent Gloo-only build.
      say "note: building without NCCL (Gloo only), missing: $missing"
    fi
  fi
fi

# ---- MPI beside Gloo --------------------------------------------------------------------------------------------
# HVDSYNC_HOROVOD_MPI=auto (default): Horovod's MPI controller is built as well as Gloo wherever an MPI's C++ wrapper
# and launcher are on PATH (Debian: openmpi-bin libopenmpi-dev), so one wheel serves horovodrun --gloo (what
# hvdsync's launchers use), mpirun, horovodrun --mpi and srun --mpi=pmix. off: Gloo only, as on a machine without an
# MPI. on: MPI, or one line naming what is missing. The MPI's name and version enter the key (the extensions link its
# libmpi); a build without MPI keeps the key it always had.
mpi_mode="${HVDSYNC_HOROVOD_MPI:-auto}"
case "$mpi_mode" in
  auto|on|off) ;;
  *) die "HVDSYNC_HOROVOD_MPI: '$mpi_mode' is not allowed; choose one of: auto, on, off" ;;
esac
mpi=""
if [ "$mpi_mode" != off ]; then
  mpicxx_bin="$(command -v mpicxx || command -v mpic++ || true)"
  mpirun_bin="$(command -v mpirun || true)"
  mpi_missing=""
  if [ -z "$mpicxx_bin" ] || [ -z "$mpirun_bin" ]; then
    mpi_missing="no mpicxx and mpirun on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)"
  else
    banner="$("$mpirun_bin" --version 2>&1 || true)"
    # Open MPI: "mpirun (Open MPI) 4.1.4"; MPICH's Hydra: "HYDRA build details:" then "Version: 4.0.2".
    mpi="$(printf '%s\n' "$banner" | sed -n 's/.*(Open MPI) \([0-9][0-9.a-z]*\).*/openmpi\1/p' | head -n 1)"
    if [ -z "$mpi" ] && printf '%s\n' "$banner" | grep -q HYDRA; then
      mpi="$(printf '%s\n' "$banner" | sed -n 's/^ *Version: *\([0-9][0-9.a-z]*\).*/mpich\1/p' | head -n 1)"
    fi
    [ -n "$mpi" ] || mpi_missing="$mpirun_bin --version names neither Open MPI nor MPICH"
  fi
  if [ -n "$mpi_missing" ] && [ "$mpi_mode" = on ]; then
    die "HVDSYNC_HOROVOD_MPI=on, but this is missing: an MPI: $mpi_missing"
  fi
fi

# ---- the sdist -----------------------------------------------------------------------------------------------------
sdist="pypi"
if [ -n "${HVDSYNC_HOROVOD_SDIST:-}" ]; then
  sdist="$HVDSYNC_HOROVOD_SDIST"
  [ ! -d "$sdist" ] || sdist="$sdist/horovod-$HOROVOD_VERSION.tar.gz"
  [ -f "$sdist" ] || die "HVDSYNC_HOROVOD_SDIST=$HVDSYNC_HOROVOD_SDIST: no such file; give the horovod-$HOROVOD_VERSION.tar.gz that \`bash benchmarks/gpu.sh --prepare DIR\` or \`pip download --no-deps --no-binary :all: horovod==$HOROVOD_VERSION\` saves"
  sdist="$(cd "$(dirname "$sdist")" && pwd -P)/${sdist##*/}"
  sum="$(sha256sum "$sdist" | cut -c1-64)"
  [ "$sum" = "$HOROVOD_SDIST_SHA256" ] \
    || die "HVDSYNC_HOROVOD_SDIST=$sdist: its sha256 is $sum, not that of PyPI's horovod-$HOROVOD_VERSION.tar.gz ($HOROVOD_SDIST_SHA256); the patches are written for that file"
fi

# ---- the cache key ----------------------------------------------------------------------------------------------
# The frameworks built are the versions named: a build of both (the default) keeps the key it always had, and a
# torch-only or TensorFlow-only build names only its own framework.
versions="$pyabi"
[ -z "$with_torch" ] || versions+="-torch$torch_version"
if [ -n "$with_tf" ]; then
  # `tensorflow-cpu` keeps the short name (the keys of existing caches stay valid). The full `tensorflow` wheel ships
  # more headers (its GPU kernels', CUDA's) and the GPU symbols an NCCL build links to: a different build.
  if [ "$tf_dist" = tensorflow-cpu ]; then versions+="-tf$tf_version"; else versions+="-tensorflow$tf_version"; fi
fi
cxx="$(${CXX:-c++} -dumpfullversion 2>/dev/null || echo unknown)"
# Patches under gpu/ change only code inside Horovod's `#if HAVE_GPU`: applied to, and part of the key of, NCCL builds
# only, so adding one leaves Gloo-only wheels (and their cache) as they are.
patches=("$patch_dir"/*.patch)
[ "$gpu" != cpu ] && patches+=("$patch_dir"/gpu/*.patch)
# GCC >= 13's standard headers no longer include <string>, <stdexcept> and <cstdint> from one another, and 0.28.1
# relies on that ("'string' in namespace 'std' does not name a type" in horovod/common/group_table.h, "'logic_error'
# is not a member of 'std'" in common.h). Forcing the three headers into every C++ file is what built 0.28.1 with
# GCC 13.3 (benchmarks/results/gpu/2026-11-30-bench-h200.md); a patch adding the includes file by file could not be
# checked against GCC 13 where it was written. Only GCC >= 13 gets the flags, and only its key names them: a GCC 12
# build (whose key holds its compiler version) keeps its key and its cached wheel.
gcc13_includes=""
if [ "${cxx%%.*}" -ge 13 ] 2>/dev/null && ${CXX:-c++} --version 2>/dev/null | grep -qiE "gcc|g\+\+"; then
  gcc13_includes="-include cstdint -include string -include stdexcept"
fi
# Only what `patch` applies is part of the key: each patch's name and its diff, not the header above the first
# "--- " / "diff --git" line that says why, so rewording a header does not cost a 12-minute rebuild.
patch_bodies() { for p in "$@"; do echo "== ${p##*/}"; awk '/^(--- |diff --git )/ { on = 1 } on' "$p"; done; }
fix_sum="$( (patch_bodies "${patches[@]}"; echo "recipe $RECIPE"; [ -z "$gcc13_includes" ] || echo "$gcc13_includes") \
           | sha256sum | cut -c1-12)"
key="horovod${HOROVOD_VERSION}-${versions}-${gpu}${mpi:+-$mpi}-gcc${cxx}-fixes${fix_sum}"
key_dir="$cache_root/$(printf '%s' "$key" | sha256sum | cut -c1-16)"
case "$action" in
  print-key) printf '%s\n%s\n' "$key" "$key_dir"; exit 0 ;;
  plan)
    echo "FRAMEWORKS=$frameworks"
    if [ -n "$with_torch" ]; then echo HOROVOD_WITH_PYTORCH=1; else echo HOROVOD_WITHOUT_PYTORCH=1; fi
    if [ -n "$with_tf" ]; then echo HOROVOD_WITH_TENSORFLOW=1; else echo HOROVOD_WITHOUT_TENSORFLOW=1; fi
    if [ "$gpu" = cpu ]; then echo GPU_OPERATIONS=none; else echo GPU_OPERATIONS=NCCL; fi
    echo "GPU=$gpu"
    if [ -n "$mpi" ]; then echo HOROVOD_WITH_MPI=1; else echo HOROVOD_WITHOUT_MPI=1; fi
    echo "MPI=${mpi:-none}"
    if [ "$gpu" != cpu ]; then
      echo "CUDA_HOME=$cuda_home"
      echo "NCCL_HOME=$nccl_home"
    fi
    echo "SDIST=$sdist"
    echo "KEY=$key"
    echo "KEY_DIR=$key_dir"
    exit 0 ;;
esac

# The key of the Horovod installed in this environment is kept beside it, in the environment's prefix.
prefix="$("$PY" -c 'import sys; print(sys.prefix)')"   # the environment's root (a venv's folder)
marker="$prefix/hvdsync-horovod-build-key"
installed_key="$(cat "$marker" 2>/dev/null || true)"
"$PY" -c 'import horovod' 2>/dev/null || installed_key=""
if [ "${HVDSYNC_HOROVOD_REBUILD:-0}" != 1 ] && [ "$installed_key" = "$key" ]; then
  say "Horovod $HOROVOD_VERSION already installed for this key ($key)"
  exit 0
fi

wheel="$(ls "$key_dir"/horovod-*.whl 2>/dev/null | head -n1 || true)"
if [ "${HVDSYNC_HOROVOD_REBUILD:-0}" = 1 ] || [ -z "$wheel" ]; then
  say "no cached wheel for $key: building Horovod $HOROVOD_VERSION from source (about 12 minutes on 2 cores)"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  log="$work/build.log"
  if [ "$sdist" = pypi ]; then
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" >>"$log" 2>&1 \
      || { cat "$log" >&2; say "error: could not download the horovod==$HOROVOD_VERSION sdist from PyPI (without an index: HVDSYNC_HOROVOD_SDIST=path)"; exit 1; }
    sdist="$work/horovod-$HOROVOD_VERSION.tar.gz"
    sum="$(sha256sum "$sdist" | cut -c1-64)"
    [ "$sum" = "$HOROVOD_SDIST_SHA256" ] \
      || { say "error: the horovod==$HOROVOD_VERSION sdist pip downloaded has sha256 $sum, not PyPI's $HOROVOD_SDIST_SHA256 (a mirror serving another file?)"; exit 1; }
  else
    say "using the sdist $sdist (sha256 checked)"
  fi
  tar xzf "$sdist" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  for p in "${patches[@]}"; do
    say "applying $(basename "$p")"
    patch --quiet -p1 -d "$src" < "$p"
  done
  # Offline: setup.py hands its run-time requirements to setuptools as setup_requires for build actions, and
  # setuptools then fetches any it finds missing from an index, which a machine without one does not have. They are
  # checked to be installed instead (each by the module it provides), and setup_requires is emptied. install_requires,
  # which the wheel's metadata is made from, stays as it is: the wheel is the same, so the key is too.
  # No cffi: setup.py lists it for torch builds, but only in setup_requires/install_requires; the torch extension is
  # built by torch.utils.cpp_extension and nothing in horovod.torch imports cffi (a torch-only node lacks it).
  needs="cloudpickle:cloudpickle psutil:psutil yaml:pyyaml packaging:packaging setuptools:setuptools wheel:wheel"
  absent="$("$PY" - $needs <<'PYEOF'
import importlib.util, sys
print(" ".join(dist for mod, dist in (a.split(":") for a in sys.argv[1:]) if importlib.util.find_spec(mod) is None))
PYEOF
)"
  [ -z "$absent" ] || { say "error: building Horovod needs these packages in $PY's environment: $absent (pip install $absent; scripts/install.sh's extras have them)"; exit 2; }
  "$PY" - "$src/setup.py" <<'PYEOF' || { say "error: could not drop setup_requires from Horovod's setup.py (the offline fix)"; exit 1; }
import sys
path = sys.argv[1]
text = open(path).read()
old = "setup_requires=require_list if is_build_action() else [],"
if text.count(old) != 1:
    sys.exit(f"{path}: expected one {old!r}")
open(path, "w").write(text.replace(old, "setup_requires=[],"))
PYEOF
  # Exactly the frameworks planned above: Horovod's setup.py otherwise builds whatever it can import.
  unset HOROVOD_WITH_PYTORCH HOROVOD_WITHOUT_PYTORCH HOROVOD_WITH_TENSORFLOW HOROVOD_WITHOUT_TENSORFLOW
  if [ -n "$with_torch" ]; then export HOROVOD_WITH_PYTORCH=1; else export HOROVOD_WITHOUT_PYTORCH=1; fi
  if [ -n "$with_tf" ]; then export HOROVOD_WITH_TENSORFLOW=1; else export HOROVOD_WITHOUT_TENSORFLOW=1; fi
  unset HOROVOD_WITH_MPI HOROVOD_WITHOUT_MPI
  export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1
  if [ -n "$mpi" ]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
  # CMake 4 refuses third_party/gloo's cmake_minimum_required(2.8.12); this lets it configure (see notes).
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  # No cmake on PATH: the environment's own (the `build` extra), which a venv's bin/ need not put there (a
  # Dockerfile's builder, a chroot). Horovod's setup.py would pip-install a temporary one instead, which fails without
  # an index and was seen failing behind a TLS-intercepting proxy.
  if [ -z "${HOROVOD_CMAKE:-}" ] && ! command -v cmake >/dev/null && [ -x "$prefix/bin/cmake" ]; then
    export HOROVOD_CMAKE="$prefix/bin/cmake"
  fi
  export MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
  if [ -n "$gcc13_includes" ]; then
    export CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }$gcc13_includes"
    say "GCC $cxx: CXXFLAGS=$CXXFLAGS (headers 0.28.1 expects other headers to include)"
  fi
  if [ "$gpu" != cpu ]; then
    say "CUDA and NCCL found ($gpu): building with HOROVOD_GPU_OPERATIONS=NCCL"
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$nccl_home"
    if [ ! -d "$cuda_home/lib64" ] && [ -d "$cuda_home/lib" ]; then
      # pip's CUDA wheels lay the toolkit out with lib/ only and no unversioned library names, but nvcc links from
      # lib64/ (its nvcc.profile) and CMake's FindCUDAToolkit looks for libcudart.so. A view of the tree made of
      # links gives both. nvcc takes its root from the path it is called by (bin/..), so bin/ is a real folder.
      view="$work/cuda"; mkdir -p "$view/lib64" "$view/bin"
      for entry in "$cuda_home"/*; do
        case "$(basename "$entry")" in lib|bin) ;; *) ln -s "$entry" "$view/" ;; esac
      done
      for file in "$cuda_home"/bin/*; do ln -s "$file" "$view/bin/"; done
      for lib in "$cuda_home"/lib/*; do ln -s "$lib" "$view/lib64/"; done
      for lib in "$cuda_home"/lib/lib*.so.*; do
        name="$(basename "$lib")"; [ -e "$view/lib64/${name%%.so.*}.so" ] || ln -s "$lib" "$view/lib64/${name%%.so.*}.so"
      done
      ln -s lib64 "$view/lib"
      cuda_home="$view"
    fi
    # CUDA_HOME too: Horovod's FindPytorch links what torch's CUDAExtension names (cudart) from the folders
    # torch.utils.cpp_extension derives from CUDA_HOME (else from nvcc on PATH or /usr/local/cuda: another toolkit,
    # or none where CUDA is pip's wheels), and CMake stopped with FOUND_LIB_cudart NOTFOUND. Gloo-only builds skip it.
    export HOROVOD_CUDA_HOME="$cuda_home" CUDA_HOME="$cuda_home"
    export HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}"
    # The NCCL wheel ships libnccl.so.2 only; CMake's find_library wants the unversioned name.
    if [ ! -e "$nccl_home/lib/libnccl.so" ] && [ -e "$nccl_home/lib/libnccl.so.2" ]; then
      shim="$work/nccl"; mkdir -p "$shim/lib"; ln -s "$nccl_home/include" "$shim/include"
      ln -s "$nccl_home/lib/libnccl.so.2" "$shim/lib/libnccl.so"; ln -s "$nccl_home/lib/libnccl.so.2" "$shim/lib/libnccl.so.2"
      export HOROVOD_NCCL_HOME="$shim"
    fi
    # NCCL from a wheel lives in site-packages, which the loader does not search: without a run path, importing
    # horovod.tensorflow (nothing has loaded libnccl.so.2 before it, unlike torch) fails. The extensions sit in
    # site-packages/horovod/<framework>/, so a path relative to them ($ORIGIN) survives moving the environment.
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
    case "$nccl_home" in
      "$site"/*) export LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,-rpath,\$ORIGIN/../../${nccl_home#"$site"/}/lib" ;;
    esac
  else
    unset HOROVOD_GPU_OPERATIONS
  fi
  # --no-build-isolation: the sdist has no pyproject, and an isolated env hides the installed frameworks from
  # CMake (which then silently skips them).
  # The compiler's output goes to a log, shown only if the build fails.
  "$PY" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src" >>"$log" 2>&1 \
    || { grep -a -A6 -E "CMake Error|error:" "$log" | head -n 60 >&2 || true; tail -n 15 "$log" >&2
         say "error: the Horovod build failed (its first errors and last lines above)"; exit 1; }
  mkdir -p "$key_dir"
  built="$(ls "$work"/dist/horovod-*.whl)"
  cp "$built" "$key_dir/.tmp-$(basename "$built")"
  mv "$key_dir/.tmp-$(basename "$built")" "$key_dir/$(basename "$built")"   # atomic: no half wheel in the cache
  printf '%s\n' "$key" > "$key_dir/KEY"
  wheel="$key_dir/$(basename "$built")"
else
  say "reusing cached wheel $(basename "$wheel") for $key"
fi

"$PY" -m pip install --quiet --no-deps --force-reinstall "$wheel" >&2
# Runtime needs of horovodrun that --no-deps skipped are pinned in constraints.txt (cloudpickle, psutil, pyyaml, packaging).
# Check the installed build really has each framework planned, with Gloo (NCCL for a GPU build, MPI where planned): the same facts
# as `horovodrun --check-build`, asked of each extension in one process (check-build starts one per framework).
TF_CPP_MIN_LOG_LEVEL=3 "$PY" - "$frameworks" "$gpu" "$mpi" <<'EOF' || { say "error: the installed Horovod is incomplete (see above)"; exit 1; }
import importlib
import sys
frameworks, gpu, mpi = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
missing = []
for framework in frameworks:
    hvd = importlib.import_module(f"horovod.{framework}")
    missing += [f"{part} ({framework})" for part, ok in [("Gloo", hvd.gloo_built()),
                                                         ("NCCL", gpu == "cpu" or hvd.nccl_built()),
                                                         ("MPI", not mpi or hvd.mpi_built())] if not ok]
if missing:
    sys.exit(f"Horovod was built without: {', '.join(missing)}")
EOF
printf '%s\n' "$key" > "$marker"
say "Horovod $HOROVOD_VERSION installed and checked ($key)"
