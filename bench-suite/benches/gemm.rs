//! SGEMM beside the `gemm` and `matrixmultiply` crates (the report's gemm section).
//!
//! The cases, peers and correctness checks are the report's (`attn_bench::sections`), timed by
//! criterion instead of the report's harness: one benchmark per case and implementation, named
//! `{op}/{shape}/{threads}t/{implementation}`. Run with a filter and criterion's options, e.g.
//! `cargo bench -p attn-bench --bench gemm -- '1t' --measurement-time 2`;
//! `ATTN_BENCH_QUICK=1` takes the report's `--quick` case list.

use attn_bench::cli::SectionId;

fn main() {
    attn_bench::criterion_main(&[SectionId::Gemm]);
}
