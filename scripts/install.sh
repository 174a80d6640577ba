#!/usr/bin/env bash
# Set everything up on a bare machine, in one command: a virtual environment with the pinned versions of
# pyproject.toml, hvdsync itself (editable), and Horovod 0.28.1 built for that environment with Gloo and both
# PyTorch and TensorFlow (scripts/build_horovod.sh; cached, so a second run takes seconds).
# The Dockerfiles run this same script.
#
#   PYTHON=python3.11 HVDSYNC_VENV=.venv bash scripts/install.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV="${HVDSYNC_VENV:-.venv}"
say() { printf '[install] %s\n' "$*" >&2; }

for tool in "$PYTHON" c++ make patch; do
  command -v "$tool" >/dev/null || { say "error: '$tool' not found; Horovod is built from source and needs a C++ compiler, make and patch (Debian: apt-get install build-essential patch python3-venv)"; exit 2; }
done

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$VENV"
fi
py="$VENV/bin/python"
# pip's own chatter is kept out of the way; errors still show.
"$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
say "installing hvdsync and its pinned dependencies (first time: a few minutes)"
"$py" -m pip install --quiet --disable-pip-version-check -e ".[all]"

# Horovod: quiet the frameworks' import-time logs while the build script reads their versions.
TF_CPP_MIN_LOG_LEVEL=2 PYTHON="$py" bash scripts/build_horovod.sh

# Must list PyTorch, TensorFlow and Gloo as built.
check="$("$VENV/bin/horovodrun" --check-build)"
for part in "\[X\] TensorFlow" "\[X\] PyTorch" "\[X\] Gloo"; do
  grep -q "$part" <<<"$check" || { printf '%s\n' "$check" >&2; say "error: Horovod was not built with ${part#\\[X\\] }"; exit 1; }
done
say "ready: $VENV (Horovod with TensorFlow, PyTorch, Gloo)"
