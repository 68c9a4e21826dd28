#!/usr/bin/env bash
# Stand-in for the upstream image `python:3.11-slim-bookworm` (the Dockerfile's PYTHON_IMAGE), for the compose
# smoke test (scripts/compose-smoke.sh) on machines that reach no image registry: a Debian bookworm root
# file system made with debootstrap (variant minbase) from the Debian mirror this host's apt uses, with
# python3 (3.11), venv, `python` (python-is-python3) and ca-certificates, plus this host's own extra CA
# certificates when /usr/local/share/ca-certificates has any (on networks that re-sign TLS, pip and apt
# inside the image need them). Not the upstream image: Python is Debian's 3.11, not python.org's build.
#
#   deploy/ci/base-image.sh TARBALL     # writes TARBALL (for `docker import`); nothing on stdout
#
# Needs root and debootstrap. Its work folder is removed on exit, Ctrl-C included (mounts first).
set -euo pipefail

tarball="${1:?usage: base-image.sh TARBALL}"
say() { printf '[base-image] %s\n' "$*" >&2; }

# the mirror of this host's apt sources (deb822 or one-line format), so the image uses what the host reaches
mirror="$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -v -- '-security' | head -n 1 || true)"
if [[ -z "$mirror" ]]; then
    mirror="$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\).*/\2/p' /etc/apt/sources.list \
        2>/dev/null | grep -v -- '-security' | head -n 1 || true)"
fi
[[ -n "$mirror" ]] || { say "no Debian mirror found in this host's apt sources"; exit 1; }

root="$(mktemp -d -t clef-base-XXXXXX)"
cleanup() {
    local m
    for m in dev/pts dev proc sys; do  # debootstrap mounts these inside; never delete through a mount
        if mountpoint -q "$root/$m" 2>/dev/null; then umount -l "$root/$m" || true; fi
    done
    rm -rf --one-file-system "$root" "$tarball.part"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "debootstrap bookworm (minbase + python3, venv, ca-certificates) from $mirror"
timeout 1200 debootstrap --variant=minbase \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    bookworm "$root" "$mirror" >&2

shopt -s nullglob
extra=(/usr/local/share/ca-certificates/*.crt)
if ((${#extra[@]})); then
    say "adding this host's CA certificates: ${extra[*]##*/}"
    cp "${extra[@]}" "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >&2
fi
# as in Docker's own Debian images: packages installed in a build never try to start services
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb

mkdir -p "$(dirname "$tarball")"
tar --numeric-owner -C "$root" -cf "$tarball.part" .
mv "$tarball.part" "$tarball"
say "wrote $tarball ($(du -h "$tarball" | cut -f1))"
