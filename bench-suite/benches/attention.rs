//! Flash attention beside the unfused path and the reference, the decode path beside the plain
//! read of the same bytes, the variants, additive attention, and packed varlen batches (the report's attention, decode,
//! variants, additive and batch sections).
//!
//! The cases, peers and correctness checks are the report's (`attn_bench::sections`), timed by
//! criterion instead of the report's harness: one benchmark per case and implementation, named
//! `{op}/{shape}/{threads}t/{implementation}`. Run with a filter and criterion's options, e.g.
//! `cargo bench -p attn-bench --bench attention -- 'decode' --measurement-time 2`;
//! `ATTN_BENCH_QUICK=1` takes the report's `--quick` case list.

use attn_bench::cli::SectionId;

fn main() {
    attn_bench::criterion_main(&[
        SectionId::Attention,
        SectionId::Decode,
        SectionId::Variants,
        SectionId::Additive,
        SectionId::Batch,
    ]);
}
