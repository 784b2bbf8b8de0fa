#!/usr/bin/env bash
# Fuzzed equivalence: runs every cargo-fuzz target in fuzz/ for a bounded time, each checking
# kernel == reference within derived bounds, typed errors, guard bands (see
# tests/src/fuzz_decode.rs). cargo-fuzz needs `-Z` flags, which the stable compiler accepts with
# RUSTC_BOOTSTRAP=1; it builds with AddressSanitizer and runs libFuzzer.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   # default 60 s, every target
#   scripts/fuzz.sh --proptest [CASES]                 # same decoders under proptest, no
#                                                      # cargo-fuzz (default 100000 per target)
#
# New corpus entries stay in fuzz/corpus/<target>/ (git-ignored except the seed-* files); a
# crash is saved under fuzz/artifacts/<target>/ and reproduced with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/<file>
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--proptest" ]]; then
    cases="${2:-100000}"
    echo "== proptest-driven fuzz decoders, $cases cases per target"
    ATTN_FUZZ_RANDOM=1 ATTN_FUZZ_CASES="$cases" cargo test -p attn-tests --test suite -- --test-threads=1 fuzz_equiv::
    exit 0
fi

secs="${1:-60}"
shift || true
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
cd fuzz
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    mapfile -t targets < <(cargo fuzz list)
fi
cargo fuzz build
mkdir -p logs
for t in "${targets[@]}"; do
    echo "== $t: ${secs}s"
    mkdir -p "corpus/$t"
    # -max_len: large enough for every header plus explicit element bytes; longer inputs only
    # add data, which the decoders also draw from a seeded generator.
    if ! cargo fuzz run "$t" -- -max_total_time="$secs" -max_len=4096 -print_final_stats=1 \
        >"logs/$t.log" 2>&1; then
        tail -n 40 "logs/$t.log"
        echo "!! $t failed; input saved under fuzz/artifacts/$t/, log in fuzz/logs/$t.log"
        exit 1
    fi
    grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb|INFO: seed corpus)" \
        "logs/$t.log" || true
done
echo "== all targets ran ${secs}s without a finding"
