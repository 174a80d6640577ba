#!/usr/bin/env bash
# Worker mode for jobs across several hosts (installed as `hvdsync-sshd`; docker/README.md, "Several hosts"):
# Horovod's launcher starts the workers of the other hosts over ssh, so every container of a multi-host job runs
# sshd. This script installs the mounted key material for the plain user, makes fresh host keys and runs sshd in the
# foreground (the container lives as long as sshd; its log goes to `docker logs`).
#
#   docker run -d --user root --network NET --name w1 --hostname w1 \
#     -v "$PWD/ssh:/etc/hvdsync/ssh:ro" hvdsync:cpu hvdsync-sshd [PORT]
#
# PORT: where sshd listens (default $HVDSYNC_SSH_PORT, else 12345 as in Horovod's Docker guide); give the launcher
# the same one (horovodrun -p PORT, hvdsync train --ssh-port PORT).
# The mounted folder ($HVDSYNC_SSH_DIR, default /etc/hvdsync/ssh) holds `authorized_keys` (required: the public keys
# that may log in) and optionally a private key (`id_ed25519`, `id_ecdsa` or `id_rsa`) for a container that launches
# jobs. Nothing of it is in the image; copies with the modes ssh insists on go to the user's ~/.ssh.
#
# Why root: sshd has to start as root to log a user in and to confine its unauthenticated pre-auth child (chroot to
# /run/sshd, unprivileged user); it also reads the mounted keys whatever their owner on the host (a Kubernetes
# Secret volume is root's, mode 0400). Only the plain user `hvdsync` (uid 10001) may log in (no root login, no
# passwords), so the workers Horovod starts over ssh run as that user, as in the image's default mode.
set -euo pipefail
user=hvdsync
port="${1:-${HVDSYNC_SSH_PORT:-12345}}"
keys="${HVDSYNC_SSH_DIR:-/etc/hvdsync/ssh}"
die() { printf 'hvdsync-sshd: error: %s\n' "$*" >&2; exit 2; }

[ "$#" -le 1 ] || die "expected at most one argument, the port; got $#: $*"
[[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] \
  || die "port '$port' is not a port number (1-65535)"
[ "$(id -u)" = 0 ] \
  || die "sshd must start as root: run the container with --user root (only the user '$user' can log in)"
[ -f "$keys/authorized_keys" ] && [ -s "$keys/authorized_keys" ] \
  || die "no $keys/authorized_keys (or it is empty): mount a folder holding the public keys allowed to log in," \
         "e.g. -v \"\$PWD/ssh:$keys:ro\" after: ssh-keygen -t ed25519 -N '' -f ssh/id_ed25519;" \
         "cp ssh/id_ed25519.pub ssh/authorized_keys"
home="$(getent passwd "$user" | cut -d: -f6)"

install -d -m 700 -o "$user" -g "$user" "$home/.ssh"
install -m 600 -o "$user" -g "$user" "$keys/authorized_keys" "$home/.ssh/authorized_keys"
for key in id_ed25519 id_ecdsa id_rsa; do
  if [ -f "$keys/$key" ]; then install -m 600 -o "$user" -g "$user" "$keys/$key" "$home/.ssh/$key"; fi
done
# The launcher's side: the port by default, and no host-key prompt. Host keys are made anew at every container
# start, so a known_hosts file would only go stale; the network is one made for the job.
cat > "$home/.ssh/config" <<EOF
Host *
    Port $port
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
EOF
chown "$user:$user" "$home/.ssh/config"

# Fresh host keys for this container only (the image holds none: Dockerfile.cpu deletes the package's).
ssh-keygen -A >/dev/null
mkdir -p /run/sshd
chmod 755 /run/sshd
# The session's environment: sshd would give a login the system PATH, without the venv; Horovod's launcher exports
# its own environment to every worker anyway, this makes a plain `ssh HOST python` find the venv's too.
# UsePAM no: PAM's session modules (pam_loginuid) fail in a container without CAP_AUDIT_CONTROL, and key login is
# all that is needed; the user's password field is '*' (no password, not locked), which sshd requires without PAM.
config=/etc/ssh/hvdsync_sshd_config
cat > "$config" <<EOF
Port $port
HostKey /etc/ssh/ssh_host_ed25519_key
HostKey /etc/ssh/ssh_host_ecdsa_key
HostKey /etc/ssh/ssh_host_rsa_key
AllowUsers $user
PermitRootLogin no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
X11Forwarding no
PrintMotd no
AuthorizedKeysFile .ssh/authorized_keys
SetEnv PATH=$PATH PYTHONUNBUFFERED=${PYTHONUNBUFFERED:-1} TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
EOF
echo "hvdsync-sshd: sshd on port $port for user $user (keys from $keys)" >&2
exec /usr/sbin/sshd -D -e -f "$config"
