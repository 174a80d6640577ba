#!/usr/bin/env bash
# In-image smoke test (installed as `hvdsync-smoke-test`): Horovod's build lists what this image promises, and a
# 2-worker run with fp16 on the wire reaches the demo's accuracy with equal parameters on both ranks, with
# TensorFlow where the image has it (the CPU image's default command runs the PyTorch demo), else with PyTorch.
#   docker run --rm hvdsync:cpu hvdsync-smoke-test
#   docker run --rm --gpus all hvdsync:gpu-torch hvdsync-smoke-test NCCL
#   docker run --rm --gpus all hvdsync:gpu-tf hvdsync-smoke-test NCCL
# Arguments: extra names `horovodrun --check-build` must tick (NCCL for the GPU images). Exit 0 only if all pass.
# The frameworks checked are those of the image: HVDSYNC_IMAGE_FRAMEWORK (set by Dockerfile.gpu: one per GPU image),
# else both (the CPU image).
set -euo pipefail
say() { printf '[smoke] %s\n' "$*"; }

case "${HVDSYNC_IMAGE_FRAMEWORK:-both}" in
  torch) names=(PyTorch) framework=torch ;;
  tensorflow) names=(TensorFlow) framework=tensorflow ;;
  *) names=(PyTorch TensorFlow) framework=tensorflow ;;
esac
build="$(horovodrun --check-build)"
for name in "${names[@]}" Gloo "$@"; do
  grep -q "\[X\] $name" <<<"$build" || { printf '%s\n' "$build"; say "FAIL: horovodrun --check-build does not list $name"; exit 1; }
done
say "check-build lists: ${names[*]} Gloo $*"

result="$(hvdsync train --framework "$framework" --np 2 --compression fp16 --no-track --json)"
python - "$result" "$framework" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
ok = r["world_size"] == 2 and r["test_accuracy"] >= 0.90 and r["param_spread"] == 0.0
print(f"[smoke] {sys.argv[2]} x{r['world_size']}: test accuracy {r['test_accuracy']:.4f}, "
      f"parameter spread {r['param_spread']}: {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
