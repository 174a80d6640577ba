#!/usr/bin/env bash
# In-image smoke test (installed as `hvdsync-smoke-test`): Horovod's build lists what this image promises, and a
# 2-worker TensorFlow run with fp16 on the wire reaches the demo's accuracy with equal parameters on both ranks
# (the image's default command runs the PyTorch demo).
#   docker run --rm hvdsync:cpu hvdsync-smoke-test
#   docker run --rm --gpus all hvdsync:gpu hvdsync-smoke-test NCCL
# Arguments: extra names `horovodrun --check-build` must tick (NCCL for the GPU image). Exit 0 only if all pass.
set -euo pipefail
say() { printf '[smoke] %s\n' "$*"; }

build="$(horovodrun --check-build)"
for name in PyTorch TensorFlow Gloo "$@"; do
  grep -q "\[X\] $name" <<<"$build" || { printf '%s\n' "$build"; say "FAIL: horovodrun --check-build does not list $name"; exit 1; }
done
say "check-build lists: PyTorch TensorFlow Gloo $*"

result="$(hvdsync train --framework tensorflow --np 2 --compression fp16 --no-track --json)"
python - "$result" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
ok = r["world_size"] == 2 and r["test_accuracy"] >= 0.90 and r["param_spread"] == 0.0
print(f"[smoke] tensorflow x{r['world_size']}: test accuracy {r['test_accuracy']:.4f}, "
      f"parameter spread {r['param_spread']}: {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
