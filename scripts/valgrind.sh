#!/usr/bin/env bash
# Memory checking: runs the kernel test suite's release test binaries (release profile, line
# tables kept for valgrind's stack traces) under `valgrind --tool=memcheck`; exits 1 on any
# memcheck error that scripts/valgrind.supp does not suppress.
#
#   scripts/valgrind.sh                 # bounded default: the fast tests (see DEFAULT_FILTERS)
#   scripts/valgrind.sh FILTER...       # only tests whose name contains a FILTER
#   scripts/valgrind.sh --all           # every test (slow: valgrind runs ~50x slower)
#   VALGRIND_OPTS=--track-origins=yes scripts/valgrind.sh ...   # where undefined bytes came from
#
# Any `==pid== ...` line valgrind prints counts as an error, so extra options must keep it quiet
# (-v and -s print summaries that would trip the check; use them on one binary by hand).
#
# Valgrind 3.19 does not decode AVX-512 instructions (it hides them from CPUID), so the
# script runs every binary once per ISA it supports (ATTN_ISA=avx2, then portable); AVX-512 code
# is left to AddressSanitizer (scripts/fuzz.sh). Property tests run with small case counts
# (PROPTEST_CASES, ATTN_FUZZ_CASES, ATTN_STRESS_CALLS) so the default run stays bounded.
#
# Suppressions (scripts/valgrind.supp), each a confirmed false positive:
#
# 1. `Memcheck:Cond` in attn_reference::softmax::scale_mask_softmax. Seen in the softmax test
#    binary (`equals_reference_within_derived_bounds`, under every PROPTEST_RNG_SEED tried): most
#    likely the "4 reports inside the reference" left open by issue 8, which the default filters
#    of the time did not reproduce. Evidence:
#    - --track-origins=yes: the undefined bytes were "created by a stack allocation" in the test's
#      frame (proptest call_test/run_case inlined), i.e. the `Mask` value the test passes in.
#    - objdump of the release binary: before the row loops the function tests `cmpb $0,8(mask)`,
#      the tag of `Mask::Causal { offset: Option<isize> }`, and branches to load `offset` or
#      compute `nk - nq` -- LLVM hoisted the loop-invariant `Mask::causal_offset` out of the loops
#      and runs it for every variant, a select on a load that codegen lowered to a branch. For
#      `Mask::None` (no payload) bytes 8.. of the value are never written, hence the report. The
#      result (spilled, then `i + offset` saturated) is read only in the `Mask::Causal` target of
#      the jump table on the mask's discriminant (`Mask::term`, reference/src/mask.rs), so the
#      undefined bytes never influence any output: a speculative read, not a use.
#    - The reference is `#![forbid(unsafe_code)]` and the test builds the mask in safe code: no
#      uninitialised read is expressible there. The same test (seeds 1, 2) is clean when built in
#      the test profile (no LTO) at opt-level 3, and with the reference at opt-level 0: only the fat-LTO
#      release codegen contains the hoisted branch. The attention reference (same `Mask::term`)
#      is clean in the attention test binary.
#    How often a run meets it: the test's 192 cases (PROPTEST_CASES unset) hit it under every
#    seed tried; the default run's 4 random cases draw a `Mask::None` about one run in three.
#    `PROPTEST_CASES=192 scripts/valgrind.sh equals_reference_within_derived_bounds` always meets
#    it (memcheck -s on that binary: "used_suppression: 40 attn-reference-scale_mask_softmax-...").
#    The entry matches only `Cond` errors whose innermost frame is that function; any other
#    error kind there, and any error in the kernels, std, or another reference function (e.g.
#    softmax_row, which reads the logits), is still reported.
#
# 2. `Memcheck:Cond` in attn_reference::attention::attention_with_variants (2026-12-05, Zen 4):
#    the same hoisted `cmpb $0,8(mask)` on a `Mask::None`, in `fuzz_equiv::fuzz_attention` and
#    `fuzz_attention_decode`; --track-origins=yes traced the bytes to a stack allocation in the
#    test's frame. Evidence and scope in scripts/valgrind.supp.
#
# 3. `Memcheck:Cond` in attn_kernels::softmax::row::softmax_rows under the C boundary test
#    (scripts/valgrind.supp).
set -euo pipefail
cd "$(dirname "$0")/.."

# Fast, broad tests: the crates' unit tests, exact/bad-input tables, the fuzz decoders with a few
# dozen cases per kernel, the cheap hostility and stress tests, and the softmax equivalence test
# (it drives the reference's scale_mask_softmax with every mask kind, so the default run meets
# the suppressed false positive, about one run in three, and would show any other error there).
DEFAULT_FILTERS=(tests:: exact_on_small bad_input fuzz_ oracle_ every_key_masked empty_dimensions
    zero_width no_keys nonfinite_values concurrent_calls equals_reference_within_derived_bounds)
SUPPRESSIONS=scripts/valgrind.supp

filters=("$@")
if [[ ${#filters[@]} -eq 0 ]]; then
    filters=("${DEFAULT_FILTERS[@]}")
elif [[ "${filters[0]}" == "--all" ]]; then
    filters=()
fi

export PROPTEST_CASES="${PROPTEST_CASES:-4}"
export ATTN_FUZZ_CASES="${ATTN_FUZZ_CASES:-24}"
export ATTN_STRESS_CALLS="${ATTN_STRESS_CALLS:-60}"

log=$(mktemp)
build=$(mktemp)
trap 'rm -f "$log" "$build"' EXIT

echo "== building release test binaries"
# A failed build must fail the script, not leave an empty list of binaries that "pass".
if ! cargo test --release --workspace --no-run --message-format=json >"$build"; then
    echo "!! valgrind: build failed"
    exit 1
fi
mapfile -t bins < <(grep -o '"executable":"[^"]*"' "$build" | sed 's/"executable":"\(.*\)"/\1/')
if [[ ${#bins[@]} -eq 0 ]]; then
    echo "!! valgrind: no test binaries"
    exit 1
fi
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
            --suppressions="$SUPPRESSIONS" "$bin" --test-threads=2 "${filters[@]}" >"$log" 2>&1 \
            || rc=$?
        grep -E "^test result|^test .*FAILED" "$log" || true
        if [[ $rc -eq 99 ]] || grep -qE "^==[0-9]+== [A-Z]" "$log"; then
            grep -E "^==[0-9]+==" "$log" | head -n 60 || true
            status=1
        elif [[ $rc -ne 0 ]]; then
            echo "   (test failures above are not memory errors)"
        fi
    done
done
if [[ $status -eq 0 ]]; then echo "== valgrind: no errors"; else echo "!! valgrind: errors"; fi
exit $status
