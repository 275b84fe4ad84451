#!/usr/bin/env bash
# The base image container/Containerfile starts FROM, made here from Debian packages only:
# a debootstrap'ed bookworm (minbase) imported as a one-layer image. It stands in for
# `FROM debian:bookworm` where no container registry is reachable (no docker.io here);
# a site that has a registry can skip it: `--build-arg BASE=docker.io/library/debian:bookworm`.
#   container/base.sh [IMAGE] [WORKDIR]      (root; debootstrap and podman from Debian's apt)
set -euo pipefail
image="${1:-localhost/marble-base:bookworm}"
work="${2:-.cache/container}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
security="${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}"
suite=bookworm
rootfs="$work/rootfs"
for tool in debootstrap podman; do
    command -v "$tool" >/dev/null || { echo "base.sh: $tool missing: apt-get install -y $tool" >&2; exit 2; }
done
rm -rf "$rootfs" && mkdir -p "$work"
# minbase: dpkg, apt and the essential set (~150 MB); the Containerfile installs the rest
# with apt, so the same recipe runs on debian:bookworm from a registry.
debootstrap --variant=minbase "$suite" "$rootfs" "$mirror"
# debootstrap writes the main suite only: the Containerfile's `apt-get upgrade` should
# also see the point releases and the security fixes.
cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security $suite-security main
SOURCES
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
# --numeric-owner: the image's ids, not this host's names for them.
tar --numeric-owner -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$image"
rm -rf "$rootfs"
echo "base.sh: $image from debootstrap $suite ($mirror)"
