#!/usr/bin/env bash
# What the documentation site needs from the system: a CJK font (the notebooks' titles are Chinese; without one the
# browser draws them as empty boxes) and, for `make docs-check`, Debian's chromium with its matching chromedriver.
# `make docs` and `make docs-check` run this. Where something is missing and this runs as root with apt-get (Debian,
# Ubuntu), it installs it; elsewhere it says in one line what is missing (the site still builds; docs-check fails
# naming what it could not find).
# Then the `docs` extra of pyproject.toml, pinned by constraints.txt, into the venv (HVDSYNC_VENV, default .venv).
#   usage: HVDSYNC_VENV=.venv scripts/install_docs_deps.sh [--browser]    (--browser: chromium and chromium-driver too)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf '[install] %s\n' "$*" >&2; }

py="${HVDSYNC_VENV:-.venv}/bin/python"
# Like scripts/install.sh: pip's resolver runs only when the pins or the package list changed since the last time.
stamp="${HVDSYNC_VENV:-.venv}/.hvdsync-docs-$( (cat constraints.txt pyproject.toml; "$py" --version) | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  say "installing the docs extra (mkdocs-material, mkdocs-jupyter, mkdocstrings, selenium)"
  "$py" -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[docs]"
  rm -f "${HVDSYNC_VENV:-.venv}"/.hvdsync-docs-*; touch "$stamp"
fi

need=()
fc-list :lang=zh 2>/dev/null | grep -q . || need+=(fonts-noto-cjk)
command -v fc-list >/dev/null || need+=(fontconfig)
if [ "${1:-}" = "--browser" ]; then
  command -v chromium >/dev/null || need+=(chromium)
  command -v chromedriver >/dev/null || need+=(chromium-driver)
fi
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  say "the docs site needs ${need[*]} (Debian: apt-get install ${need[*]}); not root with apt-get, so not installed"
  exit 0
fi
say "installing ${need[*]} for the docs site"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# matplotlib caches the font list on first use: a cache made before the CJK font arrived would not know it.
rm -rf "${MPLCONFIGDIR:-$HOME/.cache/matplotlib}"/fontlist-*.json
