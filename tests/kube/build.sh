#!/usr/bin/env bash
# Builds a real kube-apiserver and kube-controller-manager (Kubernetes 1.20.2, Debian's source
# package with its vendored modules) offline with Debian's Go, into OUT/bin (default
# target/kube/bin), for the tests that run the webhook under a real API server (`make test-kube`).
# Nothing is built again once both binaries are there. Needs apt (golang-go, rsync, the source
# package); about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/kube}
mkdir -p "$out/bin"
out=$(cd "$out" && pwd)
if [ -x "$out/bin/kube-apiserver" ] && [ -x "$out/bin/kube-controller-manager" ]; then
  exit 0
fi
command -v go >/dev/null && command -v rsync >/dev/null || apt-get install -y golang-go rsync

src="$out/src"
mkdir -p "$src/apt/etc" "$src/apt/lists/partial" "$src/apt/cache/archives/partial"
cd "$src"
# The source package from a private apt configuration: the system's sources stay as they are.
echo "deb-src http://deb.debian.org/debian bookworm main" >apt/etc/sources.list
apt_private=(-o "Dir::Etc::SourceList=$src/apt/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$src/apt/lists" -o "Dir::Cache=$src/apt/cache")
if ! ls kubernetes_*.orig.tar.gz >/dev/null 2>&1; then
  apt-get "${apt_private[@]}" update -q
  apt-get "${apt_private[@]}" source --download-only kubernetes
fi
ls golang-github-modern-go-reflect2-dev_*.deb >/dev/null 2>&1 || apt-get download golang-github-modern-go-reflect2-dev
rm -rf tree reflect2 .go
mkdir tree reflect2
tar xzf kubernetes_*.orig.tar.gz -C tree --strip-components=1
# The vendored reflect2 1.0.1 crashes the API server on a webhook's first JSON patch under
# Go >= 1.18; Debian's 1.0.2 does not.
dpkg-deb -x golang-github-modern-go-reflect2-dev_*.deb reflect2
rsync -a --delete reflect2/usr/share/gocode/src/github.com/modern-go/reflect2/ tree/vendor/github.com/modern-go/reflect2/
mkdir -p .go/src/k8s.io
ln -s "$src/tree" .go/src/k8s.io/kubernetes
cd .go/src/k8s.io/kubernetes
for what in kube-apiserver kube-controller-manager; do
  GOPATH="$src/.go" CGO_ENABLED=0 GOPROXY=off make WHAT="cmd/$what"
  cp "_output/local/bin/linux/amd64/$what" "$out/bin/$what"
done
# The tree and its build output take some 2 GB; the binaries are all that is kept.
cd "$out"
rm -rf "$src"
