#!/usr/bin/env bash
# Makes a runtime base image for deploy/Containerfile without a registry, and imports it
# into podman (docs/DEPLOY.md "Image"). Prints the image's name.
#
#   deploy/image/make-base.sh host BINARY...   # this machine's libraries that BINARY needs
#   deploy/image/make-base.sh debian [SUITE]   # Debian packages (debootstrap minbase)
#
# Both bases hold glibc, the libraries named, CA certificates and the user nonroot
# (65532), like distroless cc. The name carries a hash of what went in, so a base that
# exists already is reused (CI keeps it between runs).
set -euo pipefail
mode=${1:?host BINARY... | debian [SUITE]}
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"/{etc/ssl/certs,tmp,home/nonroot}

case $mode in
host)
  [ $# -gt 0 ] || { echo "host: name the binaries whose libraries go in" >&2; exit 2; }
  # ldd lists the loader and each library; copy them to the same paths.
  libs=$(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*[^:]$/ { print $1 }' | sort -u)
  [ -n "$libs" ] || { echo "host: ldd found no libraries" >&2; exit 2; }
  key=$(for l in $libs /etc/ssl/certs/ca-certificates.crt; do sha256sum "$(readlink -f "$l")"; done | sha256sum | cut -c1-16)
  name=localhost/kvroute-base:host-$key
  if podman image exists "$name"; then echo "$name"; exit 0; fi
  for l in $libs; do
    mkdir -p "$root$(dirname "$l")"
    cp -L "$l" "$root$l"
  done
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  ;;
debian)
  suite=${1:-bookworm}
  name=localhost/kvroute-base:debian-$suite
  if podman image exists "$name"; then echo "$name"; exit 0; fi
  debootstrap --variant=minbase --include=ca-certificates,libgcc-s1 "$suite" "$root" >&2
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  ;;
*)
  echo "unknown mode $mode (host | debian)" >&2
  exit 2
  ;;
esac

grep -q '^nonroot:' "$root/etc/passwd" 2>/dev/null || {
  echo 'root:x:0:0:root:/root:/sbin/nologin' >>"$root/etc/passwd"
  echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >>"$root/etc/passwd"
  echo 'root:x:0:' >>"$root/etc/group"
  echo 'nonroot:x:65532:' >>"$root/etc/group"
}
chown 65532:65532 "$root/home/nonroot"
chmod 1777 "$root/tmp"
tar -C "$root" -c . | podman import --quiet - "$name" >/dev/null
echo "$name"
