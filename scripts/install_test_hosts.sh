#!/usr/bin/env bash
# What the multi-host tests (tests/hosts) and `python -m hvdlab.testhosts` need from the system: iproute2 (ip netns,
# veth links, tc), openssh-server (an sshd on each test host), openssh-client and util-linux (unshare, nsenter).
# `make test` runs this. Where something is missing and this runs as root with apt-get (Debian, Ubuntu), it installs
# it; elsewhere it says in one line what is missing, and those tests skip with the reason.
set -euo pipefail
say() { printf '[install] %s\n' "$*" >&2; }

need=()
{ command -v ip && command -v tc; } >/dev/null || need+=(iproute2)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
{ command -v ssh && command -v ssh-keygen; } >/dev/null || need+=(openssh-client)
{ command -v unshare && command -v nsenter; } >/dev/null || need+=(util-linux)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  say "the multi-host tests will skip: they need root and ${need[*]} (Debian: apt-get install ${need[*]})"
  exit 0
fi
say "installing ${need[*]} for the multi-host tests (tests/hosts)"
# The package's own sshd service must not start: the test hosts run their own sshd, each inside its namespace, and a
# daemon on port 22 of this machine is not ours to leave behind. policy-rc.d (exit 101) tells Debian's maintainer
# scripts not to start services; made only for this install where the machine has none.
policy=/usr/sbin/policy-rc.d
made_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && made_policy=1
fi
trap '[ -z "$made_policy" ] || rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
