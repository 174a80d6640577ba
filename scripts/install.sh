#!/usr/bin/env bash
# Set everything up on a bare machine, in one command: a virtual environment with the exact versions pinned in
# constraints.txt (pyproject.toml states the supported ranges), hvdsync itself (editable), and Horovod 0.28.1 built
# for that environment with Gloo and both PyTorch and TensorFlow (scripts/build_horovod.sh; cached, so a second run takes seconds).
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
# Skip pip when these exact pins were already installed into this venv (pip's resolver alone takes ~30 s). The pins
# and pyproject.toml are the stamp: every dependency pyproject.toml names is pinned in constraints.txt
# (tests/repo/test_packaging.py), and a change of pyproject's package list must reach the editable install.
# HVDSYNC_EXTRAS picks pyproject's extra: `all` (default, CPU TensorFlow) or `gpu` (the full tensorflow wheel, which
# Horovod's NCCL build needs); a non-default choice enters the stamp, so switching it re-runs pip.
extras="${HVDSYNC_EXTRAS:-all}"
stamp="$VENV/.hvdsync-deps-$( (cat constraints.txt pyproject.toml; "$py" --version; [ "$extras" = all ] || echo "$extras") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  say "installing hvdsync and its pinned dependencies (first time: a few minutes)"
  # pip's own chatter is kept out of the way; errors still show.
  "$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$py" -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[$extras]"
  [ ! -f hvdlab/pyproject.toml ] || "$py" -m pip install --quiet --disable-pip-version-check --no-deps -e ./hvdlab  # the lab; Docker has none
  rm -f "$VENV"/.hvdsync-deps-*; touch "$stamp"
fi

# Horovod: reuses the installed build or the cached wheel when the key matches; builds and checks otherwise.
# HVDSYNC_INSTALL_HOROVOD=0 leaves it to the caller (docker/Dockerfile.gpu runs it as a step of its own, so the GBs of
# CUDA wheels above stay in a layer that a new Horovod build does not invalidate).
if [ "${HVDSYNC_INSTALL_HOROVOD:-1}" != 0 ]; then
  PYTHON="$py" bash scripts/build_horovod.sh
fi
say "ready: $VENV"
