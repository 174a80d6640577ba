#!/usr/bin/env bash
# Make a minimal Debian 12 image with Python 3.11 from Debian's package archive, for machines that reach Debian's
# archive but no image registry (so `FROM python:3.11-slim-bookworm` cannot be pulled). The result stands in for
# that public image as the Dockerfiles' BASE_IMAGE build argument.
#
#   bash docker/make_base.sh [TAG]        # default tag: hvdsync-base:bookworm
#
# Needs root, debootstrap (apt-get install debootstrap) and a Docker engine. Takes a few minutes (downloads ~40 MB).
set -euo pipefail
tag="${1:-hvdsync-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
docker="${DOCKER:-docker}"
say() { printf '[make_base] %s\n' "$*" >&2; }

command -v debootstrap >/dev/null || { say "error: debootstrap not found (Debian/Ubuntu: apt-get install debootstrap)"; exit 2; }
[ "$(id -u)" = 0 ] || { say "error: debootstrap needs root"; exit 2; }

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
say "debootstrap bookworm (minbase + python3, python3-venv, ca-certificates) from $mirror"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror" \
  > "$root.log" 2>&1 || { tail -n 20 "$root.log" >&2; say "error: debootstrap failed (last lines above)"; exit 1; }
rm -f "$root.log"
# What an image does not need: package lists and caches, docs and man pages (as python:*-slim drops them).
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
# Debian images keep apt from pulling recommended packages and from caching downloads.
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' > "$root/etc/apt/apt.conf.d/90-no-recommends"
tar -C "$root" -c . | "$docker" import \
  -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'CMD ["python3"]' \
  - "$tag" >/dev/null
say "made $tag ($("$docker" run --rm "$tag" python3 --version))"
