#!/usr/bin/env bash
# Build (or reuse) Horovod 0.28.1 for the Python environment that runs this script, with Gloo and BOTH
# PyTorch and TensorFlow, on today's stack. Used by scripts/install.sh, the Makefile and the Dockerfiles.
#
# Why a script and not `pip install horovod`: 0.28.1 (the last release) does not build as shipped against
# torch >= 2.1 (C++17), TensorFlow >= 2.16 (XLA headers) or CMake 4 (gloo's cmake_minimum_required). The fixes
# are the patch files in scripts/horovod-patches/, each of which says why and which upstream change it mirrors.
#
# The built wheel is cached under $HVDSYNC_CACHE (default ~/.cache/hvdsync), keyed by everything it was built
# against: Horovod version, torch, TensorFlow, Python ABI, CUDA/NCCL (or cpu), the compiler, and the bytes of the
# patches with this script's RECIPE number. A second run with the same key installs the cached wheel in seconds; any change to
# the key rebuilds from a clean source tree (a reused tree breaks CMake: third_party/compatible17_gloo is left).
#
# Environment knobs:
#   PYTHON                    the interpreter of the target environment (default: python on PATH)
#   HVDSYNC_CACHE             cache folder (default ${XDG_CACHE_HOME:-~/.cache}/hvdsync)
#   HVDSYNC_HOROVOD_REBUILD=1 ignore the cache
#   HOROVOD_BUILD_CUDA_CC_LIST  GPU builds only: compute capabilities (default 80,90: A100, H100/H200)
# Arguments: --print-key prints the cache key and the cache folder, and exits.
set -euo pipefail

HOROVOD_VERSION=0.28.1
# Bump when the build recipe below changes in a way that changes the wheel (flags, steps): it is part of the key.
RECIPE=1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
patch_dir="$here/horovod-patches"
PY="${PYTHON:-python}"
cache_root="${HVDSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdsync}/horovod"

say() { printf '[build_horovod] %s\n' "$*" >&2; }

# ---- GPU detection: NCCL only where both a CUDA compiler and NCCL are present --------------------------------
nvcc_bin="$(command -v nvcc || true)"
[ -z "$nvcc_bin" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && nvcc_bin="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
nccl_home="${HOROVOD_NCCL_HOME:-}"
if [ -n "$nvcc_bin" ] && [ -z "$nccl_home" ]; then
  # The nvidia-nccl-cu* wheels that CUDA builds of torch pull in carry NCCL's header and library.
  nccl_home="$("$PY" - <<'EOF' 2>/dev/null || true
import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
if spec and spec.submodule_search_locations:
    root = list(spec.submodule_search_locations)[0]
    if os.path.exists(os.path.join(root, "include", "nccl.h")):
        print(root)
EOF
)"
  [ -z "$nccl_home" ] && [ -f /usr/include/nccl.h ] && nccl_home=/usr
fi
gpu="cpu"
if [ -n "$nvcc_bin" ] && [ -n "$nccl_home" ]; then
  cuda_version="$("$nvcc_bin" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  nccl_version="$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$nccl_home/include/nccl.h" | paste -sd.)"
  gpu="cuda${cuda_version}-nccl${nccl_version}-cc${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}"
fi

# ---- the cache key ----------------------------------------------------------------------------------------------
# Versions from package metadata: importing torch and TensorFlow just to read them would cost seconds.
versions="$("$PY" - <<'EOF'
import sys, sysconfig
from importlib import metadata

def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    sys.exit(f"error: none of {names} is installed; install the frameworks before building Horovod")

print(f"cp{sys.version_info.major}{sys.version_info.minor}-{sysconfig.get_platform()}"
      f"-torch{version('torch')}-tf{version('tensorflow', 'tensorflow-cpu')}")
EOF
)"
cxx="$(${CXX:-c++} -dumpfullversion 2>/dev/null || echo unknown)"
fix_sum="$( (cat "$patch_dir"/*.patch; echo "recipe $RECIPE") | sha256sum | cut -c1-12)"
key="horovod${HOROVOD_VERSION}-${versions}-${gpu}-gcc${cxx}-fixes${fix_sum}"
key_dir="$cache_root/$(printf '%s' "$key" | sha256sum | cut -c1-16)"
if [ "${1:-}" = "--print-key" ]; then printf '%s\n%s\n' "$key" "$key_dir"; exit 0; fi

# The key of the Horovod installed in this environment is kept beside it, in the environment's prefix.
marker="$("$PY" -c 'import sys; print(sys.prefix)')/hvdsync-horovod-build-key"
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
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" >>"$log" 2>&1 \
    || { cat "$log" >&2; say "error: could not download the horovod==$HOROVOD_VERSION sdist from PyPI"; exit 1; }
  tar xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  for p in "$patch_dir"/*.patch; do
    say "applying $(basename "$p")"
    patch --quiet -p1 -d "$src" < "$p"
  done
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1
  export HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1
  # CMake 4 refuses third_party/gloo's cmake_minimum_required(2.8.12); this lets it configure (see notes).
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  export MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
  if [ "$gpu" != cpu ]; then
    say "CUDA and NCCL found ($gpu): building with HOROVOD_GPU_OPERATIONS=NCCL"
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$nccl_home"
    export HOROVOD_CUDA_HOME="$(dirname "$(dirname "$nvcc_bin")")"
    export HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}"
    # The NCCL wheel ships libnccl.so.2 only; CMake's find_library wants the unversioned name.
    if [ ! -e "$nccl_home/lib/libnccl.so" ] && [ -e "$nccl_home/lib/libnccl.so.2" ]; then
      shim="$work/nccl"; mkdir -p "$shim/lib"; ln -s "$nccl_home/include" "$shim/include"
      ln -s "$nccl_home/lib/libnccl.so.2" "$shim/lib/libnccl.so"; ln -s "$nccl_home/lib/libnccl.so.2" "$shim/lib/libnccl.so.2"
      export HOROVOD_NCCL_HOME="$shim"
    fi
  else
    unset HOROVOD_GPU_OPERATIONS
  fi
  # --no-build-isolation: the sdist has no pyproject, and an isolated env hides the installed frameworks from
  # CMake (which then silently skips them).
  # The compiler's output goes to a log, shown only if the build fails.
  "$PY" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src" >>"$log" 2>&1 \
    || { tail -n 60 "$log" >&2; say "error: the Horovod build failed (last lines above)"; exit 1; }
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
# Runtime needs of horovodrun that --no-deps skipped are pinned in pyproject.toml (cloudpickle, psutil, pyyaml, packaging).
# Check the installed build really has both frameworks and Gloo (and NCCL for a GPU build): the same facts as
# `horovodrun --check-build`, asked of each extension in one process (check-build starts one per framework).
TF_CPP_MIN_LOG_LEVEL=3 "$PY" - "$gpu" <<'EOF' || { say "error: the installed Horovod is incomplete (see above)"; exit 1; }
import sys
import horovod.tensorflow as hvd_tf
import horovod.torch as hvd_torch
missing = [name for name, ok in [("Gloo (torch)", hvd_torch.gloo_built()), ("Gloo (tensorflow)", hvd_tf.gloo_built())]
           + ([("NCCL", hvd_torch.nccl_built())] if sys.argv[1] != "cpu" else []) if not ok]
if missing:
    sys.exit(f"Horovod was built without: {', '.join(missing)}")
EOF
printf '%s\n' "$key" > "$marker"
say "Horovod $HOROVOD_VERSION installed and checked ($key)"
