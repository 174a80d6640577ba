#!/usr/bin/env bash
# The GPU run, for an offline GPU node that already has a CUDA PyTorch environment (not needed by CI). Three modes:
#
#   bash benchmarks/gpu.sh --prepare DIR --for-python 3.12      # where an index is reachable: what to carry, in DIR
#   bash benchmarks/gpu.sh --python PY --bundle DIR [--work W] [--out OUT] [-- gpu.py bench options]   # on the node
#   bash benchmarks/gpu.sh --rehearse [--bundle DIR]            # here, without a GPU: every phase against stubs
#
# --prepare DIR [--for-python X.Y] [--budget-mib N]: the carry bundle, at most N MiB (default 64):
#   DIR/horovod-0.28.1.tar.gz   PyPI's sdist (its sha256 is checked against scripts/build_horovod.sh's)
#   DIR/wheels/                 the few wheels for Python X.Y (default 3.12; linux x86_64) that such a node lacks and
#                               the run needs: scikit-learn and scipy, joblib, threadpoolctl (the digits data of the
#                               training tests), pytest-timeout, setuptools and wheel (the Horovod build); and
#                               mlflow-skinny with its dependencies if they fit in the budget (else tracking is off on
#                               the node and the manifest, then the record, says why)
#   DIR/MANIFEST.json           what is there, for which Python, every file's size and sha256
#   --python-headers INCLUDE    CPython X.Y's headers (a folder holding Python.h and pyconfig.h, e.g. python3.12-config
#                               --includes' first folder) for a node whose Python has none (no python3.X-dev): carried
#                               as DIR/python-include and used for the build when the node lacks its own
#   --node-has FILE             the node's `python -m pip list --format=freeze` (or one name a line): the wheels of
#                               distributions it already has are left out (its own copies serve, as on the node's run)
# No torch, no CUDA wheels: the node's environment has them (torch's CUDA build and the nvidia-nccl wheel).
#
# The run (--python PY: the node's interpreter, used as it is: nothing is installed into it and no index is asked):
#   preflight  in seconds, one line on failure: patch/make/c++/cmake; torch a CUDA build, nvcc of the same CUDA major,
#              a driver for it (nvidia-smi's CUDA version); NCCL's headers; the work and results folders writable and
#              4 GiB free; the bundle's manifest, checksums and Python tag against the node's
#   env        a virtual environment over PY's (WORK/env: PY's packages seen through a .pth, the bundle's wheels that
#              PY lacks installed with --no-index), hvdsync from this checkout on PYTHONPATH
#   plan       scripts/build_horovod.sh --plan: torch only, NCCL, this GPU's compute capability, the carried sdist
#   build      scripts/build_horovod.sh (cached in WORK/cache: a second run takes seconds)
#   check      horovodrun --check-build must list NCCL and PyTorch
#   tests      tests/gpu/test_gpu.py with HVDSYNC_REQUIRE_GPU=1 (a skip is a failure, except "needs 2 GPUs"), pytest
#              --timeout 120 per test; with 2+ GPUs the 2-rank tests run too
#   bench      benchmarks/gpu.py bench: plain torch, DDP, raw Horovod, hvdsync (NCCL proven from the timeline)
#   sweep      with 2+ GPUs: benchmarks/gpu.py sweep on 2 ranks, Horovod's all-reduce against torch.distributed NCCL
#   train      `hvdsync train --device cuda` end to end, tracked in an MLflow store in WORK if the bundle carried
#              mlflow-skinny, else --no-track (the record says which)
# Every phase has its own time limit, and none runs past 570 s from the start: the whole run ends within 10 minutes.
# Results, at most 8 files, in OUT (default benchmarks/results/gpu/<date>-bench-<tag>/, tag HVDSYNC_GPU_TAG, listed in
# the index once everything passed): gpu.log, record.json (the node's facts, driver, CUDA, NCCL, build key and plan,
# check-build, timings, bundle, tracking), nvidia-smi.txt, tests-gpu.txt, tests-gpu.xml, bench.json, sweep-2ranks.json.
# Exit status: 0 all passed, 1 a phase failed (the later phases still run where they can), 2 refused before any phase.
#
# --rehearse runs the same phases here, against the stand-in node of tests/gpu/rehearsal/stub_node.sh (a stub
# nvidia-smi and nvcc, torch's CUDA build as files only), compiling nothing and opening no GPU: the preflight, the
# env, the build plan, the GPU tests collected and each refused under HVDSYNC_REQUIRE_GPU=1 (as a node without a GPU
# must be), the bench's and train's command lines, the record. Its last line says what it rehearsed and how long the
# real run is predicted to take. tests/repo/test_gpu_rehearse.py runs it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd -P)"

HOROVOD_VERSION=0.28.1
TOTAL_S=570
say() { printf '[gpu] %s %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[gpu] error: %s\n' "$*" >&2; exit 2; }

prepare="" for_python=3.12 budget=64 node_has="" headers="" py="" bundle="" work="" out="${HVDSYNC_GPU_OUT:-}" rehearse=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) [ -n "${2:-}" ] || die "--prepare needs a folder: bash benchmarks/gpu.sh --prepare DIR --for-python 3.12"
               prepare="$2"; shift ;;
    --for-python) [[ "${2:-}" =~ ^3\.[0-9]+$ ]] || die "--for-python takes the node's Python as 3.N (e.g. 3.12)"
                  for_python="$2"; shift ;;
    --node-has) [ -f "${2:-}" ] || die "--node-has takes a file: the node's python -m pip list --format=freeze"
                node_has="$2"; shift ;;
    --python-headers) [ -f "${2:-}/Python.h" ] || die "--python-headers takes a folder holding Python.h (CPython's include folder)"
                      headers="$2"; shift ;;
    --budget-mib) [[ "${2:-}" =~ ^[0-9]+$ ]] || die "--budget-mib takes a whole number of MiB"; budget="$2"; shift ;;
    --python) [ -n "${2:-}" ] || die "--python needs the node's interpreter (its CUDA torch environment's python)"
              py="$2"; shift ;;
    --bundle|--from) [ -n "${2:-}" ] || die "$1 needs the folder --prepare filled"; bundle="$2"; shift ;;
    --work) [ -n "${2:-}" ] || die "--work needs a folder"; work="$2"; shift ;;
    --out) [ -n "${2:-}" ] || die "--out needs a folder"; out="$2"; shift ;;
    --rehearse) rehearse=1 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (bash benchmarks/gpu.sh --help); options for gpu.py bench go after --" ;;
  esac
  shift
done

# ---- --prepare: where an index is reachable --------------------------------------------------------------------------
if [ -n "$prepare" ]; then
  host_py="${PYTHON:-python3}"
  mkdir -p "$prepare/wheels"
  prepare="$(cd "$prepare" && pwd -P)"
  want="$(sed -n 's/^HOROVOD_SDIST_SHA256=//p' scripts/build_horovod.sh)"
  say "Horovod $HOROVOD_VERSION's sdist -> $prepare"
  "$host_py" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "horovod==$HOROVOD_VERSION" -d "$prepare" || die "pip could not download horovod==$HOROVOD_VERSION's sdist"
  got="$(sha256sum "$prepare/horovod-$HOROVOD_VERSION.tar.gz" | cut -c1-64)"
  [ "$got" = "$want" ] || die "the sdist pip downloaded has sha256 $got, not PyPI's $want"
  # Wheels for the node's Python, not this machine's: binary only, for the manylinux platforms a current node takes.
  target=(--python-version "$for_python" --only-binary=:all: --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  pins="$(sed -n 's/^mlflow==//p' constraints.txt)"
  say "the wheels such a node lacks, for Python $for_python -> $prepare/wheels"
  "$host_py" -m pip download --quiet --disable-pip-version-check "${target[@]}" --no-deps -c constraints.txt \
    -d "$prepare/wheels" scikit-learn scipy joblib threadpoolctl pytest-timeout setuptools wheel \
    || die "pip could not download the wheels for Python $for_python (its messages above)"
  if [ -n "$headers" ]; then
    got="$("$host_py" -c 'import sys; sys.path.insert(0, "benchmarks"); import gpu_node, pathlib; print(gpu_node.headers_version(pathlib.Path(sys.argv[1])))' "$headers")"
    [ "$got" = "$for_python" ] || die "--python-headers $headers holds Python $got's headers, not $for_python's (--for-python)"
    rm -rf "$prepare/python-include"; cp -rL "$headers" "$prepare/python-include"
    say "CPython $got's headers -> $prepare/python-include ($(du -sh "$prepare/python-include" | cut -f1))"
  fi
  # prune: the node's own copies serve (the run's env phase installs only what the node lacks).
  prune() { [ -z "$node_has" ] || "$host_py" benchmarks/gpu_node.py prune "$prepare" --node-has "$node_has"; }
  prune
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  mlflow=off why=""
  if "$host_py" -m pip download --quiet --disable-pip-version-check "${target[@]}" -d "$tmp" \
       "mlflow-skinny==$pins" 2>"$tmp/err"; then
    for w in "$tmp"/*.whl; do [ -e "$prepare/wheels/${w##*/}" ] || cp "$w" "$prepare/wheels/"; done
    prune
    total="$(du -cb "$prepare"/horovod-*.tar.gz "$prepare"/wheels/*.whl | tail -n 1 | cut -f1)"
    if [ "$total" -le $(( budget * 1048576 - 65536 )) ]; then
      mlflow=on why="mlflow-skinny $pins and its dependencies carried ($(( total / 1048576 )) MiB in all)"
    else
      for w in "$tmp"/*.whl; do
        # Only what mlflow-skinny brought: a wheel of the required set stays.
        case "${w##*/}" in scikit_learn-*|scipy-*|joblib-*|threadpoolctl-*|pytest_timeout-*|setuptools-*|wheel-*) ;;
          *) rm -f "$prepare/wheels/${w##*/}" ;; esac
      done
      why="mlflow-skinny $pins with its dependencies would make the bundle $(( total / 1048576 )) MiB, over $budget"
    fi
  else
    why="pip could not download mlflow-skinny==$pins for Python $for_python: $(tail -n 1 "$tmp/err")"
  fi
  say "tracking on the node: $mlflow ($why)"
  "$host_py" benchmarks/gpu_node.py manifest "$prepare" --for-python "$for_python" --mlflow "$mlflow" --why "$why" \
    --budget-mib "$budget" || exit 2
  say "ready: carry $prepare and the repository, then on the node: bash benchmarks/gpu.sh --python PY --bundle DIR"
  exit 0
fi

# ---- the run -------------------------------------------------------------------------------------------------------
start=$(date +%s)
if [ -n "$rehearse" ]; then
  # The stand-in node (tests/gpu/rehearsal/stub_node.sh): its stubs first on PATH, its python as --python.
  [ -x .venv/bin/python ] || die "--rehearse runs the GPU tests with this checkout's .venv (make install)"
  rdir="$(mktemp -d "${TMPDIR:-/tmp}/hvdsync-gpu-rehearsal.XXXXXX")"
  trap 'rm -rf "$rdir"' EXIT
  # HVDSYNC_REHEARSAL_NODE: more of stub_node.sh's options (another node: --gpus 2, --driver-cuda 12.4, ...).
  # shellcheck disable=SC2086
  bash tests/gpu/rehearsal/stub_node.sh "$rdir/node" --packages-from \
    "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" ${HVDSYNC_REHEARSAL_NODE:-} \
    >/dev/null
  export PATH="$rdir/node/bin:$PATH"
  py="$rdir/node/node/bin/python"
  work="${work:-$rdir/work}" out="${out:-$rdir/out}"
  if [ -z "$bundle" ]; then  # no bundle given: an empty one for this Python (no sdist: the plan then names PyPI's)
    mkdir -p "$rdir/bundle/wheels"
    "$py" benchmarks/gpu_node.py manifest "$rdir/bundle" --for-python "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
      --mlflow off --why "a rehearsal's empty bundle" >/dev/null
    bundle="$rdir/bundle" bundle_kind="empty (no sdist; --bundle DIR checks a real one)"
  fi
fi
py="${py:-python3}"
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
command -v "$py" >/dev/null || die "--python $py: no such interpreter"
py="$(command -v "$py")"
[ -z "$bundle" ] || { [ -d "$bundle" ] || die "--bundle $bundle: no such folder"; bundle="$(cd "$bundle" && pwd -P)"; }
tag="${HVDSYNC_GPU_TAG:-gpu-sh}"
[[ "$tag" =~ ^[a-z0-9]+(-[a-z0-9]+)*$ ]] || die "HVDSYNC_GPU_TAG=$tag: lower case, digits and dashes"
record="$(date -u +%Y-%m-%d)-bench-$tag"
recorded=""
[ -n "$out" ] || { out="benchmarks/results/gpu/$record"; recorded=1; }
work="${work:-${TMPDIR:-/tmp}/hvdsync-gpu}"
made_out=""; [ -d "$out" ] || made_out=1

say "preflight ($py)"
facts="$(timeout 60 "$py" benchmarks/gpu_node.py preflight --work "$work" --out "$out" ${bundle:+--bundle "$bundle"})" \
  || { [ -z "$made_out" ] || rmdir "$out" 2>/dev/null || true; exit 2; }
fact() { printf '%s\n' "$facts" | sed -n "s/^$1=//p"; }
out="$(cd "$out" && pwd -P)" work="$(cd "$work" && pwd -P)"
exec > >(tee -a "$out/gpu.log") 2>&1
printf '%s\n' "$facts" > "$work/preflight.txt"
say "node: $(fact GPUS) x $(fact GPU_NAME) (cc $(fact CC)), driver $(fact DRIVER) (CUDA $(fact DRIVER_CUDA)), torch $(fact TORCH), nvcc $(fact NVCC_CUDA), Python $(fact PYTHON_VERSION)"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
: > "$work/timings.txt"
failed=""
# phase NAME CAP CMD...: runs CMD under min(CAP, what is left of TOTAL_S), logs its time; a failure is remembered.
phase() {
  local name="$1" cap="$2" left t0 rc=0; shift 2
  left=$(( start + TOTAL_S - $(date +%s) ))
  [ "$left" -lt "$cap" ] && cap="$left"
  if [ "$cap" -le 0 ]; then say "$name: no time left of the run's $TOTAL_S s" >&2; failed="$failed $name"; return 1; fi
  say "$name (at most $cap s)" >&2
  t0=$(date +%s)
  timeout --kill-after=10 "$cap" "$@" || rc=$?
  printf '%s=%s s, status %s\n' "$name" "$(( $(date +%s) - t0 ))" "$rc" >> "$work/timings.txt"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then say "$name: stopped at its limit of $cap s" >&2; fi
  [ "$rc" = 0 ] || { failed="$failed $name"; say "$name failed (status $rc)" >&2; }
  return "$rc"
}

# ---- env: a virtual environment over the node's, the bundle's missing wheels, hvdsync from this checkout ------------
make_env() {
  local env="$work/env" site
  [ -x "$env/bin/python" ] || "$py" -m venv --without-pip "$env"
  site="$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # The node's packages, after the env's own: torch, NCCL's wheel, pip, pytest as they are (a .pth, not a copy).
  # site.addsitedir, not bare paths: the node's own .pth files run too, setuptools' distutils shim among them, which
  # Horovod's CMake needs on Python 3.12+ (it asks distutils.sysconfig.get_python_inc for Python.h's folder).
  "$py" -c 'import sys; print("\n".join(f"import site; site.addsitedir({p!r})" for p in sys.path
                                         if p.endswith(("site-packages", "dist-packages"))))' \
    > "$site/zz-node-packages.pth"
  if [ -n "$bundle" ]; then
    mapfile -t lack < <("$env/bin/python" benchmarks/gpu_node.py lacking "$bundle")
    if [ "${#lack[@]}" -gt 0 ] && [ -n "${lack[0]}" ]; then
      echo "installing ${#lack[@]} carried wheel(s) the node lacks: ${lack[*]##*/}"
      # --no-compile: bytecode is written on first import instead; compiling scipy alone took a minute here.
      "$env/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile "${lack[@]}"
    fi
  fi
  # What the run imports, checked now rather than in the middle of the tests. A rehearsal's empty bundle carries
  # none of them: it says which the real bundle must (--prepare's wheels do), and goes on.
  PYTHONPATH="$repo" "$env/bin/python" -c 'import importlib.util as u, sys
need = ["numpy", "yaml", "psutil", "cloudpickle", "tqdm", "packaging", "pytest", "pytest_timeout", "sklearn",
        "setuptools", "wheel", "hvdsync"]
missing = [m for m in need if u.find_spec(m) is None]
print(f"the run needs these modules, in neither the node nor the bundle: {missing}" if missing else
      f"every module the run needs is here: {need}")
if not missing:
    # What Horovod 0.28.1'"'"'s CMake runs to find Python.h (horovod/torch/CMakeLists.txt): distutils, on 3.12+ the shim.
    import os
    try:
        from distutils.sysconfig import get_python_inc
        inc = get_python_inc()
    except Exception as e:
        sys.exit(f"Horovod'"'"'s build asks distutils for Python'"'"'s include folder, and this env cannot answer: {e!r}")
    if not os.path.isfile(os.path.join(inc, "Python.h")) and not os.environ.get("CPATH"):
        sys.exit(f"Horovod'"'"'s build will look for Python.h in {inc}: it is not there")
    print(f"Horovod'"'"'s build finds Python.h in {inc}")
sys.exit(1 if missing else 0)' || [ -n "${bundle_kind:-}" ]
}
# The node's Python without its headers: the bundle's copy of the same X.Y, for every compiler call (CPATH).
if [ "$(fact PY_HEADERS)" != node ]; then
  export CPATH="$(fact PY_HEADERS)${CPATH:+:$CPATH}"
  say "Python's headers: the bundle's ($(fact PY_HEADERS)); the node's Python has none"
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export -f make_env
export py work bundle repo bundle_kind="${bundle_kind:-}"
phase env 120 bash -c make_env || true
envpy="$work/env/bin/python"
mlflow_on=""
[ "$(fact BUNDLE_MLFLOW)" = on ] && "$envpy" -c 'import mlflow' 2>/dev/null && mlflow_on=1

# ---- plan and build: torch only, NCCL, this GPU's architecture, the carried sdist ---------------------------------
# No MPI unless asked (HVDSYNC_HOROVOD_MPI=auto or on): the run is about NCCL, and an MPI build costs minutes more.
export HVDSYNC_HOROVOD_FRAMEWORKS=torch HVDSYNC_HOROVOD_GPU=nccl HVDSYNC_CACHE="$work/cache"
export HVDSYNC_HOROVOD_MPI="${HVDSYNC_HOROVOD_MPI:-off}"
export HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-$(fact CC)}"
[ "$(fact BUNDLE_SDIST)" != yes ] || export HVDSYNC_HOROVOD_SDIST="$bundle"
phase plan 60 env PYTHON="$envpy" bash scripts/build_horovod.sh --plan > "$work/plan.txt" || true
cat "$work/plan.txt"
build_cmd=(env PYTHON="$envpy" MAKEFLAGS="-j$(nproc)" bash scripts/build_horovod.sh)
if [ -n "$rehearse" ]; then
  say "build: not in a rehearsal (it would run: ${build_cmd[*]}; cache $HVDSYNC_CACHE)"
else
  phase build 360 "${build_cmd[@]}" || true
  phase check 60 bash -c "'$work/env/bin/horovodrun' --check-build | tee '$work/check-build.txt'
    grep -q '\[X\] NCCL' '$work/check-build.txt' && grep -q '\[X\] PyTorch' '$work/check-build.txt' \
    || { echo 'horovodrun --check-build does not list NCCL and PyTorch'; exit 1; }" || true
  # What the record must hold beside the node's facts: the CUDA and NCCL that torch runs, Horovod's build key.
  phase versions 60 "$envpy" -c 'import os, sys, torch
nccl = torch.cuda.nccl.version()
print(f"TORCH_CUDA_RUNTIME={torch.version.cuda}")
print("NCCL_RUNTIME=" + (".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)))
key = os.path.join(sys.prefix, "hvdsync-horovod-build-key")
print("HOROVOD_BUILD_KEY=" + (open(key).read().strip() if os.path.exists(key) else "(none installed)"))' \
    > "$work/versions.txt" || true
fi

# ---- the GPU tests: a skip is a failure here --------------------------------------------------------------------------
testpy="$envpy"
[ -z "$rehearse" ] || testpy="$repo/.venv/bin/python"  # the stand-in's torch runs nothing: this checkout's CPU venv
phase tests 300 env HVDSYNC_REQUIRE_GPU=1 "$testpy" -m pytest tests/gpu/test_gpu.py -m gpu -rs -p no:cacheprovider \
  --timeout 120 --junitxml="$out/tests-gpu.xml" -o junit_family=xunit2 > "$out/tests-gpu.txt" 2>&1 || true
tail -n 3 "$out/tests-gpu.txt"
# Without a GPU every test must have been refused (that is what a rehearsal checks): not a failure there.
[ -z "$rehearse" ] || failed="${failed/ tests/}"

# ---- bench, the 2-rank sweep, train -----------------------------------------------------------------------------------
bench_cmd=("$work/env/bin/horovodrun" -np 1 -H localhost:1 "$envpy" benchmarks/gpu.py bench --json "$out/bench.json" "$@")
sweep_cmd=("$work/env/bin/horovodrun" -np 2 -H localhost:2 "$envpy" benchmarks/gpu.py sweep --json "$out/sweep-2ranks.json")
# mlflow-skinny has no SQL store (hvdsync's default is MLflow's SQLite one): a file store, which MLflow 3 uses only when
# MLFLOW_ALLOW_FILE_STORE=true.
track=(--no-track); [ -z "$mlflow_on" ] || track=(--tracking-uri "$work/mlruns")
train_cmd=(env MLFLOW_ALLOW_FILE_STORE=true "$envpy" -c 'import sys; from hvdsync.launch.cli import main; sys.exit(main())' train --framework torch
           --np 1 --device cuda --epochs 3 --json "${track[@]}")
if [ -n "$rehearse" ]; then
  # The bench's options (those given after --) parsed by the code that will run them, nothing measured.
  if [ $# -gt 0 ]; then
    phase bench-args 60 "$repo/.venv/bin/python" -c 'import sys; sys.path.insert(0, "benchmarks"); import gpu
gpu._args(sys.argv[1:])' "$@" || true
  fi
  say "bench: not in a rehearsal (it would run: ${bench_cmd[*]})"
  [ "$(fact GPUS)" -lt 2 ] || say "sweep: not in a rehearsal (it would run: ${sweep_cmd[*]})"
  say "train: not in a rehearsal (it would run: ${train_cmd[*]})"
else
  phase bench 180 env PYTHONUNBUFFERED=1 "${bench_cmd[@]}" || true
  if [ "$(fact GPUS)" -ge 2 ]; then phase sweep 90 env PYTHONUNBUFFERED=1 "${sweep_cmd[@]}" || true; fi
  phase train 90 "${train_cmd[@]}" || true
fi

# ---- the record ---------------------------------------------------------------------------------------------------
tracking="off: $(fact BUNDLE_TRACKING_WHY)"
[ -z "$mlflow_on" ] || tracking="on: hvdsync train tracked in $work/mlruns ($(fact BUNDLE_TRACKING_WHY))"
[ -n "$bundle" ] || tracking="off: no bundle given"
items=(node="$work/preflight.txt" plan="$work/plan.txt" timings="$work/timings.txt" tracking="$tracking"
       failed="${failed# }" rehearsal="${rehearse:+yes}")
for f in versions check-build; do [ ! -f "$work/$f.txt" ] || items+=("${f/-/_}=$work/$f.txt"); done
[ -z "$bundle" ] || items+=(bundle="$bundle/MANIFEST.json")
"$py" benchmarks/gpu_node.py record "$out/record.json" "${items[@]}"
nfiles="$(find "$out" -type f | wc -l)"
[ "$nfiles" -le 8 ] || { say "error: $nfiles result files in $out, over the 8 that come back"; failed="$failed files"; }
took=$(( $(date +%s) - start ))
if [ -n "$rehearse" ]; then
  # The real run's time: this rehearsal's phases as measured, plus what it could not run, from the GPU run before
  # (Horovod's NCCL build ~2 min on 16 cores) and each phase's share: about 5 s per GPU test (a Horovod job each),
  # 90 s of bench (4 contenders x 5 repetitions of 50 ResNet-18 steps at the 5674 img/s measured before, the proofs,
  # the sweep), 20 s of train.
  ntests="$(grep -o 'tests="[0-9]*"' "$out/tests-gpu.xml" | head -n 1 | tr -dc 0-9)"
  refused="$(grep -c 'HVDSYNC_REQUIRE_GPU=1: this GPU test would have been skipped' "$out/tests-gpu.txt" || true)"
  # Measured: what runs the same here as there (env, plan); the tests' phase is replaced by its estimate.
  measured="$(grep -v '^tests=' "$work/timings.txt" | sed 's/^[^=]*=\([0-9]*\) s.*/\1/' | awk '{s += $1} END {print s + 0}')"
  predicted=$(( measured + 120 + 5 * ${ntests:-0} + 90 + 20 ))
  [ "${ntests:-0}" -gt 0 ] && [ "$refused" -ge "${ntests:-0}" ] || failed="$failed tests-not-refused"
  say "rehearsed in $took s: preflight (stub node: $(fact GPUS) GPU(s), driver CUDA $(fact DRIVER_CUDA), torch CUDA $(fact TORCH_CUDA), nvcc $(fact NVCC_CUDA)), env, plan ($(sed -n 's/^GPU=//p' "$work/plan.txt")), build skipped, ${ntests:-0} GPU tests collected and ${refused} refused without a GPU, bench's command line, record ($nfiles files); bundle ${bundle_kind:-$bundle}; the real run is predicted to take ~$(( (predicted + 59) / 60 )) min ($predicted s; at most $TOTAL_S s by its phase limits)${failed:+; FAILED:$failed}"
  [ -z "$failed" ] || exit 1
  exit 0
fi
if [ -n "$recorded" ] && [ -z "$failed" ]; then  # a record of the gpu suite: listed in the index (regenerated)
  "$envpy" benchmarks/index.py add "gpu/$record" --command "bash benchmarks/gpu.sh --python PY --bundle DIR${*:+ -- $*}" \
    --shows "$(fact GPU_NAME): NCCL in --check-build; GPU tests; img/s of plain torch, DDP, raw Horovod, hvdsync; all-reduce sweep"
fi
say "done in $took s: $out${failed:+; FAILED:$failed}"
[ -z "$failed" ] || exit 1
