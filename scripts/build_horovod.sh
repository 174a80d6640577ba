#!/usr/bin/env bash
# Build (or reuse) Horovod 0.28.1 for the Python environment that runs this script, with Gloo and BOTH
# PyTorch and TensorFlow, on today's stack. Used by scripts/install.sh, the Makefile and the Dockerfiles.
#
# Why a script and not `pip install horovod`: 0.28.1 (the last release) does not build as shipped against
# torch >= 2.1 (C++17), TensorFlow >= 2.16 (XLA headers) or CMake 4 (gloo's cmake_minimum_required). The fixes
# are the patch files in scripts/horovod-patches/, each of which says why and which upstream change it mirrors.
#
# The built wheel is cached under $HVDSYNC_CACHE (default ~/.cache/hvdsync), keyed by everything it was built
# against: Horovod version, torch, TensorFlow, Python ABI, CUDA/NCCL (or cpu), the compiler, and the diffs of the
# patches with this script's RECIPE number. A second run with the same key installs the cached wheel in seconds; any change to
# the key rebuilds from a clean source tree (a reused tree breaks CMake: third_party/compatible17_gloo is left).
#
# Environment knobs:
#   PYTHON                    the interpreter of the target environment (default: python on PATH)
#   HVDSYNC_CACHE             cache folder (default ${XDG_CACHE_HOME:-~/.cache}/hvdsync)
#   HVDSYNC_HOROVOD_REBUILD=1 ignore the cache
#   HVDSYNC_HOROVOD_GPU       auto (default) | cpu | nccl: see "Gloo only, or with NCCL" below
#   HVDSYNC_CUDA_FROM_WHEELS=1  NCCL builds: take nvcc and CUDA's headers from pip's wheels even if a system CUDA exists
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

# ---- Gloo only, or with NCCL ---------------------------------------------------------------------------------
# HVDSYNC_HOROVOD_GPU=auto (default): NCCL only where the environment's torch is a CUDA build AND a CUDA compiler and
# NCCL are found; otherwise Gloo only. A machine with nvcc but torch's CPU build (a CPU venv on a box that has CUDA)
# therefore stays CPU: a CUDA Horovod next to CPU torch would only fail at run time.
# HVDSYNC_HOROVOD_GPU=cpu: Gloo only, whatever is installed. HVDSYNC_HOROVOD_GPU=nccl: NCCL or a clear error naming
# the missing piece. The CUDA toolkit comes from nvcc on PATH / $CUDA_HOME, or, when there is none (or
# HVDSYNC_CUDA_FROM_WHEELS=1), from pip's CUDA wheels in the environment (scripts/cuda-build-requirements.txt);
# NCCL from $HOROVOD_NCCL_HOME, the nvidia-nccl wheel torch pulls in, or /usr.
mode="${HVDSYNC_HOROVOD_GPU:-auto}"
case "$mode" in
  auto|cpu|nccl) ;;
  *) say "error: HVDSYNC_HOROVOD_GPU: '$mode' is not allowed; choose one of: auto, cpu, nccl"; exit 2 ;;
esac
gpu="cpu"
if [ "$mode" != cpu ]; then
  # What the environment holds, without importing torch (seconds): torch's CUDA version, pip's CUDA toolkit
  # (the nvidia-cuda-* wheels of CUDA >= 13 share one tree, nvidia/cu<major>), and the NCCL wheel.
  eval "$("$PY" - <<'EOF'
import importlib.util, os, re, shlex
def where(name):
    spec = importlib.util.find_spec(name)
    return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else ""
torch_cuda = ""
if where("torch") and os.path.exists(os.path.join(where("torch"), "version.py")):
    m = re.search(r"^cuda(?:: [^=]+)? = '([0-9.]+)'", open(os.path.join(where("torch"), "version.py")).read(), re.M)
    torch_cuda = m.group(1) if m else ""
nvidia = where("nvidia")
wheel_cuda = ""
if nvidia and torch_cuda:
    tree = os.path.join(nvidia, "cu" + torch_cuda.split(".")[0])
    wheel_cuda = tree if os.path.exists(os.path.join(tree, "bin", "nvcc")) else ""
nccl = where("nvidia.nccl") if nvidia else ""
nccl = nccl if nccl and os.path.exists(os.path.join(nccl, "include", "nccl.h")) else ""
print(f"torch_cuda={shlex.quote(torch_cuda)} wheel_cuda={shlex.quote(wheel_cuda)} wheel_nccl={shlex.quote(nccl)}")
EOF
)"
  nvcc_bin=""
  if [ "${HVDSYNC_CUDA_FROM_WHEELS:-0}" != 1 ]; then
    nvcc_bin="$(command -v nvcc || true)"
    [ -z "$nvcc_bin" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && nvcc_bin="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
  fi
  [ -z "$nvcc_bin" ] && [ -n "$wheel_cuda" ] && nvcc_bin="$wheel_cuda/bin/nvcc"
  nccl_home="${HOROVOD_NCCL_HOME:-$wheel_nccl}"
  [ -z "$nccl_home" ] && [ -f /usr/include/nccl.h ] && nccl_home=/usr
  cuda_version="" cuda_home=""
  if [ -n "$nvcc_bin" ]; then
    cuda_version="$("$nvcc_bin" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    # The toolkit's root as nvcc itself sees it (nvcc on PATH may be a wrapper or a symlink).
    cuda_home="$(cd "$("$nvcc_bin" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p')" && pwd -P)"
  fi
  missing=""
  if [ -z "$torch_cuda" ]; then
    missing="the CUDA build of torch (this environment has $("$PY" -c 'from importlib import metadata as m; print("torch " + m.version("torch"))' 2>/dev/null || echo "no torch"); pip install torch from PyPI, not from a CPU index)"
  elif [ -z "$nvcc_bin" ]; then
    missing="a CUDA compiler: no nvcc on PATH or in \$CUDA_HOME, and no nvidia-cuda-nvcc wheel for CUDA $torch_cuda in this environment (pip install -r scripts/cuda-build-requirements.txt)"
  elif [ "${cuda_version%%.*}" != "${torch_cuda%%.*}" ]; then
    missing="a CUDA compiler for torch's CUDA $torch_cuda: $nvcc_bin is CUDA $cuda_version (set HVDSYNC_CUDA_FROM_WHEELS=1 to use pip's CUDA wheels instead)"
  elif [ -z "$(ls "$cuda_home"/include/cuda_runtime.h "$cuda_home"/targets/*/include/cuda_runtime.h 2>/dev/null)" ]; then
    missing="CUDA's runtime headers: no include/cuda_runtime.h beside $nvcc_bin (the nvidia-cuda-runtime wheel, or a CUDA toolkit)"
  elif [ -z "$nccl_home" ]; then
    missing="NCCL: no \$HOROVOD_NCCL_HOME, no nvidia-nccl-cu${torch_cuda%%.*} wheel in this environment, no /usr/include/nccl.h"
  fi
  if [ -z "$missing" ]; then
    nccl_version="$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$nccl_home/include/nccl.h" | paste -sd.)"
    gpu="cuda${cuda_version}-nccl${nccl_version}-cc${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}"
  elif [ "$mode" = nccl ]; then
    say "error: HVDSYNC_HOROVOD_GPU=nccl, but this is missing: $missing"; exit 2
  elif [ -n "$torch_cuda" ]; then
    # torch can use GPUs but Horovod will not: say so once rather than leave a silent Gloo-only build.
    say "note: building without NCCL (Gloo only), missing: $missing"
  fi
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

def tf():
    # `tensorflow-cpu` keeps the short name (the keys of existing caches stay valid). The full `tensorflow` wheel ships
    # more headers (its GPU kernels', CUDA's) and the GPU symbols an NCCL build links to: a different build.
    try:
        return f"tf{metadata.version('tensorflow-cpu')}"
    except metadata.PackageNotFoundError:
        return f"tensorflow{version('tensorflow')}"

print(f"cp{sys.version_info.major}{sys.version_info.minor}-{sysconfig.get_platform()}"
      f"-torch{version('torch')}-{tf()}")
EOF
)"
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
patch_bodies() { for p in "$@"; do echo "== $(basename "$p")"; awk '/^(--- |diff --git )/ { on = 1 } on' "$p"; done; }
fix_sum="$( (patch_bodies "${patches[@]}"; echo "recipe $RECIPE"; [ -z "$gcc13_includes" ] || echo "$gcc13_includes") \
           | sha256sum | cut -c1-12)"
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
  for p in "${patches[@]}"; do
    say "applying $(basename "$p")"
    patch --quiet -p1 -d "$src" < "$p"
  done
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1
  export HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1
  # CMake 4 refuses third_party/gloo's cmake_minimum_required(2.8.12); this lets it configure (see notes).
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
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
    export HOROVOD_CUDA_HOME="$cuda_home"
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
    || { grep -a -A6 -E "CMake Error|error:" "$log" | head -n 60 >&2; tail -n 15 "$log" >&2
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
