#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer's coverage instrumentation (stable rustc: only `-C`
# flags, no sanitizer) and runs each for FUZZ_SECONDS (default 600), or only those named as
# arguments. New corpus entries go to target/corpus/<name>, seeded from seeds/<name>; a crash
# stops the run with the input saved under target/artifacts/<name>/.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-600}
host=$(rustc -vV | sed -n 's/^host: //p')
# An explicit --target keeps the flags off build scripts and proc macros, which cannot link the
# coverage callbacks.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
cargo build --release --locked --target "$host" --bins
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(h1_head h1_chunked sidecar_config server_config ratelimit_file rules server_requests ledger admission_review)
passed=0
for name in "${targets[@]}"; do
  corpus=target/corpus/$name artifacts=target/artifacts/$name log=target/logs/$name.log
  mkdir -p "$corpus" "$artifacts" target/logs
  echo "fuzz: $name for ${seconds}s (log: fuzz/$log)"
  status=0
  "target/$host/release/$name" "$corpus" "seeds/$name" -max_total_time="$seconds" -max_len=16384 \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1 || status=$?
  grep -E '^stat::(number_of_executed_units|new_units_added|peak_rss_mb)' "$log" | sed "s/^/fuzz: $name: /"
  if [ "$status" -ne 0 ]; then
    grep -E -A3 'panicked|ERROR|Test unit written' "$log" >&2 || tail -20 "$log" >&2
    echo "fuzz: $name failed (exit $status); the input is under fuzz/$artifacts" >&2
    echo "fuzz: $passed passed, 1 failed"
    exit 1
  fi
  passed=$((passed + 1))
done
echo "fuzz: $passed passed, 0 failed"
