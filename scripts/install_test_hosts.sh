#!/usr/bin/env bash
# What the multi-host tests (tests/hosts, tests/slurm) and `python -m hvdlab.testhosts` need from the system:
# iproute2 (ip netns, veth links, tc), openssh-server (an sshd on each test host), openssh-client and util-linux
# (unshare, nsenter); for tests/slurm also OpenMPI (openmpi-bin, libopenmpi-dev: mpirun, and the headers Horovod's MPI
# controller is built against), Slurm (slurm-wlm: slurmctld, slurmd, srun with its pmix/pmi2 plugins) and munge.
# `make test` runs this BEFORE the environment is made, so the one Horovod build sees the MPI and serves the tests.
# Where something is missing and this runs as root with apt-get (Debian, Ubuntu), it installs it; elsewhere it says
# in one line what is missing, and those tests skip with the reason.
set -euo pipefail
say() { printf '[install] %s\n' "$*" >&2; }

need=()
{ command -v ip && command -v tc; } >/dev/null || need+=(iproute2)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
{ command -v ssh && command -v ssh-keygen; } >/dev/null || need+=(openssh-client)
{ command -v unshare && command -v nsenter; } >/dev/null || need+=(util-linux)
{ command -v mpirun && command -v mpicxx; } >/dev/null || need+=(openmpi-bin libopenmpi-dev)
{ command -v slurmctld && command -v slurmd && command -v sbatch; } >/dev/null || need+=(slurm-wlm)
{ command -v munged && command -v munge; } >/dev/null || need+=(munge)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  say "the multi-host tests will skip: they need root and ${need[*]} (Debian: apt-get install ${need[*]})"
  exit 0
fi
say "installing ${need[*]} for the multi-host tests (tests/hosts, tests/slurm)"
# The packages' own services (sshd, munge, slurmctld, slurmd) must not start: the test hosts run their own sshd, each
# inside its namespace, the Slurm fixture its own munged and Slurm daemons, and a daemon of this machine's is not ours
# to leave behind. policy-rc.d (exit 101) tells Debian's maintainer scripts not to start services; made only for this
# install where the machine has none.
policy=/usr/sbin/policy-rc.d
made_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && made_policy=1
fi
trap '[ -z "$made_policy" ] || rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
