#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60), one after another.
#   fuzz/run.sh 30
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`);
# the first run also builds the targets with ASan (about a minute).
# Extra arguments after SECONDS go to libFuzzer, e.g. `fuzz/run.sh 30 -jobs=2`.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
shift || true
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz/run.sh: cargo-fuzz is missing: cargo install cargo-fuzz --locked (needs the nightly toolchain too)" >&2
    exit 2
fi
targets=$(cargo +nightly fuzz list)
cargo +nightly fuzz build
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in $targets; do
    echo "== $t: ${seconds}s"
    status=0
    cargo +nightly fuzz run "$t" -- -max_total_time="$seconds" -print_final_stats=1 "$@" >"$log" 2>&1 || status=$?
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)|DONE|ERROR|panicked|SUMMARY" "$log" || true
    # cargo fuzz run exits non-zero (and leaves fuzz/artifacts/$t/) on a crash.
    if [ "$status" -ne 0 ]; then
        tail -40 "$log" >&2
        echo "fuzz/run.sh: $t failed: see fuzz/artifacts/$t/" >&2
        exit 1
    fi
done
echo "fuzz/run.sh: all targets ran ${seconds}s each without a failure"
