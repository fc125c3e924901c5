#!/usr/bin/env bash
# Makes a runtime base image for deploy/Dockerfile without pulling any image: what distroless
# cc-debian12 holds (glibc, libgcc, netbase, tzdata, a CA bundle, /tmp and the user nonroot,
# 65532) from this Debian machine's own packages, so binaries built here find the same C library.
#
# Usage: deploy/image/base.sh TAG        DOCKER: the docker client to use (default: docker)
set -euo pipefail
tag=${1:?usage: deploy/image/base.sh TAG}
docker=${DOCKER:-docker}
ca=/etc/ssl/certs/ca-certificates.crt
[ -r "$ca" ] || { echo "base.sh: no CA bundle at $ca (apt-get install ca-certificates)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir "$root"

# As root, apt drops to the _apt user to download, which cannot write into a private directory.
sandbox=()
[ "$(id -u)" -eq 0 ] && sandbox=(-o APT::Sandbox::User=root)
(cd "$work" && apt-get download -qq "${sandbox[@]}" libc6 libgcc-s1 netbase tzdata)
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$root"
done
# Documentation is no use in a container.
rm -rf "$root/usr/share/doc" "$root/usr/share/lintian" "$root/usr/share/man"

mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot"
chmod 1777 "$root/tmp"
cp "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
cat >"$root/etc/passwd" <<'USERS'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
USERS
cat >"$root/etc/group" <<'GROUPS'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
GROUPS

# Everything belongs to root but the home directory, whoever runs this script.
tar -C "$root" -cf "$work/rootfs.tar" --numeric-owner --owner=0 --group=0 --exclude=./home/nonroot .
tar -C "$root" -rf "$work/rootfs.tar" --numeric-owner --owner=65532 --group=65532 ./home/nonroot
"$docker" import \
  -c 'USER 65532:65532' \
  -c 'WORKDIR /home/nonroot' \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  "$work/rootfs.tar" "$tag" >/dev/null
echo "base image $tag: $("$docker" image inspect -f '{{.Size}}' "$tag") bytes"
