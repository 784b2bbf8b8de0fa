#!/usr/bin/env bash
# Memory checking: runs the kernel test suite's release test binaries (release profile, line
# tables kept for valgrind's stack traces) under `valgrind --tool=memcheck`; exits 1 on any
# memcheck error.
#
#   scripts/valgrind.sh                 # bounded default: the fast tests (see DEFAULT_FILTERS)
#   scripts/valgrind.sh FILTER...       # only tests whose name contains a FILTER
#   scripts/valgrind.sh --all           # every test (slow: valgrind runs ~50x slower)
#
# Valgrind 3.19 does not decode AVX-512 instructions (it hides them from CPUID), so the
# script runs every binary once per ISA it supports (ATTN_ISA=avx2, then portable); AVX-512 code
# is left to AddressSanitizer (scripts/fuzz.sh). Property tests run with small case counts
# (PROPTEST_CASES, ATTN_FUZZ_CASES, ATTN_STRESS_CALLS) so the default run stays bounded.
set -euo pipefail
cd "$(dirname "$0")/.."

# Fast, broad tests: the crates' unit tests, exact/bad-input tables, the fuzz decoders with a few
# dozen cases per kernel, and the cheap hostility and stress tests.
DEFAULT_FILTERS=(tests:: exact_on_small bad_input fuzz_ oracle_ every_key_masked empty_dimensions
    zero_width no_keys nonfinite_values concurrent_calls)

filters=("$@")
if [[ ${#filters[@]} -eq 0 ]]; then
    filters=("${DEFAULT_FILTERS[@]}")
elif [[ "${filters[0]}" == "--all" ]]; then
    filters=()
fi

export PROPTEST_CASES="${PROPTEST_CASES:-4}"
export ATTN_FUZZ_CASES="${ATTN_FUZZ_CASES:-24}"
export ATTN_STRESS_CALLS="${ATTN_STRESS_CALLS:-60}"

echo "== building release test binaries"
mapfile -t bins < <(
    cargo test --release --workspace --no-run --message-format=json 2>/dev/null \
        | grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/'
)
status=0
for isa in avx2 portable; do
    for bin in "${bins[@]}"; do
        # The list of tests this binary has that match a filter (none: skip it).
        if [[ ${#filters[@]} -gt 0 ]]; then
            n=$("$bin" --list "${filters[@]}" 2>/dev/null | grep -c ': test$' || true)
            [[ "$n" -eq 0 ]] && continue
        fi
        echo "== ATTN_ISA=$isa valgrind $(basename "$bin") ${filters[*]}"
        # Memcheck errors exit with 99; a failing test (e.g. a reported kernel bug's reproducer)
        # exits with 101 and is listed, but is not a memory error.
        rc=0
        ATTN_ISA=$isa valgrind --tool=memcheck --error-exitcode=99 --leak-check=no --quiet \
            "$bin" --test-threads=2 "${filters[@]}" >/tmp/valgrind-test.log 2>&1 || rc=$?
        grep -E "^test result|^test .*FAILED" /tmp/valgrind-test.log || true
        if [[ $rc -eq 99 ]] || grep -qE "^==[0-9]+== [A-Z]" /tmp/valgrind-test.log; then
            grep -E "^==[0-9]+==" /tmp/valgrind-test.log | head -n 60
            status=1
        elif [[ $rc -ne 0 ]]; then
            echo "   (test failures above are not memory errors)"
        fi
    done
done
if [[ $status -eq 0 ]]; then echo "== valgrind: no errors"; else echo "!! valgrind: errors"; fi
exit $status
