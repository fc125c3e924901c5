#!/usr/bin/env bash
# Packages prebuilt sluice-server and sluice-sidecar into the container image without pulling
# anything: strips them into a build context of their own and builds deploy/Dockerfile's
# `prebuilt` target on BASE, or, without BASE, on a base made from this machine's packages by
# base.sh. Prints the image's size and user.
#
# Usage: deploy/image/build.sh BIN_DIR
#   IMAGE   tag of the image (default: sluice:latest and sluice:VERSION, the crate version: the
#           image `sluice-sidecar inject` and the chart's appVersion name)
#   BASE    runtime base image (default: sluice-base:local, made by base.sh)
#   DOCKER  the docker client to use (default: docker)
set -euo pipefail
bins=${1:?usage: deploy/image/build.sh BIN_DIR}
here=$(cd "$(dirname "$0")" && pwd)
docker=${DOCKER:-docker}
image=${IMAGE:-sluice:latest}
tags=(-t "$image")
# The default also under the crate version: the tag `inject` and the chart default to.
if [ "$image" = sluice:latest ]; then
  version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/../../Cargo.toml" | head -n 1)
  tags+=(-t "sluice:${version:?no version in Cargo.toml}")
fi
base=${BASE:-}

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
for name in sluice-server sluice-sidecar; do
  strip -o "$context/$name" "$bins/$name"
  chmod 0755 "$context/$name"
done
if [ -z "$base" ]; then
  base=sluice-base:local
  DOCKER=$docker "$here/base.sh" "$base"
fi
"$docker" build -q --network none -f "$here/../Dockerfile" --target prebuilt --build-arg "BASE=$base" "${tags[@]}" "$context" >/dev/null
"$docker" image inspect -f "image $image: {{.Size}} bytes, user {{.Config.User}}" "$image"
