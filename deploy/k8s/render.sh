#!/usr/bin/env bash
# Makes the plain manifests of deploy/k8s from the chart and the example application, as release
# `sluice` in namespace `sluice`; tests/tests/helm.rs checks that the files here are its output.
#
# Usage: deploy/k8s/render.sh [OUT_DIR]     (default: deploy/k8s)
#   HELM      the helm binary (default: helm)
#   SIDECAR   the sluice-sidecar binary (default: target/debug/sluice-sidecar)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/deploy/k8s}
helm=${HELM:-helm}
sidecar=${SIDECAR:-$root/target/debug/sluice-sidecar}
chart=$root/helm/sluice
header="# Rendered by deploy/k8s/render.sh from helm/sluice; edit the chart, not this file."

# The server tree with the chart's defaults: one root tier, no etcd, no injector. No hooks: the
# configuration check runs before an install, which kubectl apply has no notion of, and `helm test`.
{ echo "$header"; "$helm" template sluice "$chart" --namespace sluice --no-hooks; } >"$out/sluice.yaml"

# The injector webhook alone, its certificate from cert-manager (which must be installed).
{
  echo "$header"
  "$helm" template sluice "$chart" --namespace sluice --no-hooks \
    --set injector.enabled=true --show-only templates/injector.yaml
} >"$out/injector.yaml"

# The example application with its sidecar, leasing from the root tier.
{
  echo "# Rendered by deploy/k8s/render.sh: deploy/examples/k8s-app.yaml after sluice-sidecar inject."
  "$sidecar" inject --config-map orders-client-sidecar --server sluice-root.sluice.svc:7777 \
    "$root/deploy/examples/k8s-app.yaml"
} >"$out/example-app.yaml"
