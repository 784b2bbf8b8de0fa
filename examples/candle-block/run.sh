#!/usr/bin/env bash
# Builds the candle example (outside the workspace) and runs the block with and without our
# attention, on one thread and on two (candle's matmuls follow RAYON_NUM_THREADS).
set -euo pipefail
cd "$(dirname "$0")"
start=$(date +%s)
cargo build --release --quiet
echo "built in $(( $(date +%s) - start )) s"
for t in 1 2; do
    for n in 512 2048; do
        RAYON_NUM_THREADS=$t ./target/release/candle-block "$n" "$t"
    done
done
