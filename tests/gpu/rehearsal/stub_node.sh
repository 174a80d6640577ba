#!/usr/bin/env bash
# A stand-in for the offline GPU node, for `bash benchmarks/gpu.sh --rehearse` and tests/repo/test_gpu_rehearse.py:
# files and scripts only, nothing of it is a GPU. It makes, in DIR:
#   bin/nvidia-smi   answers what gpu.sh and its preflight ask (-L, --query-gpu=..., the plain table with the driver's
#                    CUDA version) for GPUS GPUs of compute capability 9.0 and driver DRIVER (CUDA DRIVER_CUDA)
#   bin/nvcc         answers --version (CUDA NVCC) and --dryrun (the toolkit's root: DIR/cuda, with its headers' names)
#   node/            a Python environment (this machine's python3) holding a CUDA build of torch as files only
#                    (torch/version.py and its package metadata: TORCH, CUDA TORCH_CUDA; importing it fails on purpose)
#                    and the nvidia-nccl wheel's layout (nccl.h of NCCL 2.27.7, an empty libnccl.so.2); with
#                    --packages-from SITE, the packages the offline node is known to have (pip, numpy, PyYAML,
#                    psutil, cloudpickle, tqdm, pytest) linked from SITE, and nothing else: what the run needs beyond
#                    them must come from the bundle, as on the node
# The node's facts are arguments, so the tests can stage the mismatches the preflight must catch:
#   bash tests/gpu/rehearsal/stub_node.sh DIR [--gpus N] [--driver-cuda X.Y] [--nvcc X.Y] [--torch-cuda X.Y]
#                                             [--packages-from SITE]     (--torch-cuda cpu: torch's CPU build)
set -euo pipefail
dir="$1"; shift
gpus=1 driver=580.95.05 driver_cuda=13.0 nvcc=13.0 torch_cuda=13.0 torch=2.11.0 packages=""
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) gpus="$2"; shift ;;
    --driver-cuda) driver_cuda="$2"; shift ;;
    --nvcc) nvcc="$2"; shift ;;
    --torch-cuda) torch_cuda="$2"; shift ;;
    --packages-from) packages="$2"; shift ;;
    *) echo "stub_node.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$dir/bin" "$dir/cuda/include" "$dir/cuda/bin"
dir="$(cd "$dir" && pwd -P)"

cat > "$dir/bin/nvidia-smi" <<SMI
#!/usr/bin/env bash
# The rehearsal's nvidia-smi: $gpus stub GPU(s), driver $driver (CUDA $driver_cuda).
gpus=$gpus
case "\${1:-}" in
  -L) for i in \$(seq 0 \$((gpus - 1))); do echo "GPU \$i: Stub GPU (rehearsal) (UUID: GPU-00000000-0000-0000-0000-00000000000\$i)"; done ;;
  --query-gpu=*)
    for i in \$(seq 0 \$((gpus - 1))); do
      row=""
      IFS=, read -r -a fields <<< "\${1#--query-gpu=}"
      for f in "\${fields[@]}"; do
        case "\$f" in
          name) v="Stub GPU (rehearsal)" ;; driver_version) v="$driver" ;; compute_cap) v="9.0" ;;
          memory.total) v="143771 MiB" ;; *) v="[N/A]" ;;
        esac
        row="\${row:+\$row, }\$v"
      done
      echo "\$row"
    done ;;
  *) echo "| NVIDIA-SMI $driver    Driver Version: $driver    CUDA Version: $driver_cuda |"
     for i in \$(seq 0 \$((gpus - 1))); do echo "|   \$i  Stub GPU (rehearsal)   (no GPU: a rehearsal stub) |"; done ;;
esac
SMI

cat > "$dir/bin/nvcc" <<NVCC
#!/usr/bin/env bash
# The rehearsal's nvcc: CUDA $nvcc, its root $dir/cuda. It compiles nothing.
case " \$* " in
  *" --version "*) echo "Cuda compilation tools, release $nvcc, V$nvcc.88" ;;
  *" --dryrun "*) echo "#\\\$ TOP=$dir/cuda" >&2 ;;
  *) echo "nvcc (rehearsal stub): compiles nothing" >&2; exit 1 ;;
esac
NVCC
chmod +x "$dir/bin/nvidia-smi" "$dir/bin/nvcc"
ln -sf "$dir/bin/nvcc" "$dir/cuda/bin/nvcc"
: > "$dir/cuda/include/cuda_runtime.h"

if [ ! -x "$dir/node/bin/python" ]; then
  python3 -m venv --without-pip "$dir/node"
fi
site="$("$dir/node/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# --torch-cuda cpu: torch's CPU build (version.py's cuda is None), the mistake the preflight must name.
local_version="+cu${torch_cuda/./}" cuda_value="'$torch_cuda'"
[ "$torch_cuda" != cpu ] || { local_version="+cpu"; cuda_value=None; }
mkdir -p "$site/torch" "$site/torch-$torch$local_version.dist-info" "$site/nvidia/nccl/include" "$site/nvidia/nccl/lib"
cat > "$site/torch/__init__.py" <<'PY'
raise ImportError("the GPU rehearsal's stand-in for torch: its files say what a CUDA build says, it runs nothing")
PY
printf "__version__ = '%s'\ncuda: Optional[str] = %s\n" "$torch$local_version" "$cuda_value" > "$site/torch/version.py"
printf 'Metadata-Version: 2.1\nName: torch\nVersion: %s\n' "$torch$local_version" \
  > "$site/torch-$torch$local_version.dist-info/METADATA"
: > "$site/torch-$torch$local_version.dist-info/RECORD"
printf '#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 7\n' > "$site/nvidia/nccl/include/nccl.h"
: > "$site/nvidia/nccl/lib/libnccl.so.2"
if [ -n "$packages" ]; then
  for name in pip pip-*.dist-info numpy numpy.libs numpy-*.dist-info yaml _yaml pyyaml-*.dist-info psutil psutil-*.dist-info cloudpickle \
              cloudpickle-*.dist-info tqdm tqdm-*.dist-info pytest pytest-[0-9]*.dist-info _pytest pluggy \
              pluggy-*.dist-info iniconfig iniconfig-*.dist-info packaging packaging-*.dist-info py.py pygments \
              pygments-*.dist-info; do
    for entry in "$packages"/$name; do [ ! -e "$entry" ] || ln -sfn "$entry" "$site/"; done
  done
fi
echo "$dir"
