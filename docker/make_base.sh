#!/usr/bin/env bash
# Make a minimal Debian image with Python from Debian's package archive, for machines that reach Debian's archive but
# no image registry (so `FROM python:3.11-slim-bookworm` or `nvidia/cuda:...` cannot be pulled). The result stands in
# for those public images as the Dockerfiles' BASE_IMAGE / BUILD_IMAGE build arguments.
#
#   bash docker/make_base.sh [TAG] [SUITE] [PACKAGE ...]
#     default: hvdsync-base:bookworm, Debian 12 (Python 3.11)
#   bash docker/make_base.sh hvdsync-base:trixie trixie                            # Debian 13 (Python 3.13)
#   bash docker/make_base.sh hvdsync-base:trixie-cuda12 trixie nvidia-cuda-toolkit  # + Debian's CUDA 12.4 toolkit
#
# PACKAGEs are installed with apt from the suite's main, contrib and non-free components (Debian's CUDA toolkit is in
# non-free): docker/build.py makes the CUDA 12 one for the TensorFlow GPU image where nvidia/cuda:12.x cannot be
# pulled, as PyPI has no CUDA 12 compiler (docker/README.md, "Two GPU images").
# Needs root, debootstrap (apt-get install debootstrap) and a Docker engine. A few minutes; the CUDA toolkit adds
# ~2 GB of downloads.
set -euo pipefail
tag="${1:-hvdsync-base:bookworm}"
suite="${2:-bookworm}"
packages=("${@:3}")
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
docker="${DOCKER:-docker}"
say() { printf '[make_base] %s\n' "$*" >&2; }

command -v debootstrap >/dev/null || { say "error: debootstrap not found (Debian/Ubuntu: apt-get install debootstrap)"; exit 2; }
[ "$(id -u)" = 0 ] || { say "error: debootstrap needs root"; exit 2; }

root="$(mktemp -d)"
trap 'umount "$root/proc" 2>/dev/null || true; rm -rf "$root"' EXIT
say "debootstrap $suite (minbase + python3, python3-venv, ca-certificates) from $mirror"
components=main
[ "${#packages[@]}" -eq 0 ] || components=main,contrib,non-free
debootstrap --variant=minbase --components="$components" --include=python3,python3-venv,ca-certificates \
  "$suite" "$root" "$mirror" > "$root.log" 2>&1 \
  || { tail -n 20 "$root.log" >&2; say "error: debootstrap failed (last lines above)"; exit 1; }
rm -f "$root.log"
if [ "${#packages[@]}" -gt 0 ]; then
  say "apt-get install ${packages[*]}"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  mount -t proc proc "$root/proc"
  chroot "$root" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends "${packages[@]}" \
    > "$root.log" 2>&1 || { tail -n 20 "$root.log" >&2; say "error: apt-get install failed (last lines above)"; exit 1; }
  rm -f "$root.log"
  umount "$root/proc"
  : > "$root/etc/resolv.conf"
fi
# What an image does not need: package lists and caches, docs and man pages (as python:*-slim drops them).
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
# Debian images keep apt from pulling recommended packages and from caching downloads.
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' > "$root/etc/apt/apt.conf.d/90-no-recommends"
tar -C "$root" -c . | "$docker" import \
  -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'CMD ["python3"]' \
  - "$tag" >/dev/null
say "made $tag ($("$docker" run --rm "$tag" python3 --version))"
