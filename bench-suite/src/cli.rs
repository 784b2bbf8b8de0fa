//! Command-line options of `attn-bench` (clap derive). With no argument the binary runs every
//! section that has a kernel, on one thread and on every core, and prints Markdown tables.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// The report: this machine's FMA peak and copy bandwidth, a correctness check of every
/// implementation against `attn-reference`, then one table per kernel family with each
/// implementation beside its peers, measured in the same run.
#[derive(Parser, Debug, Clone)]
#[command(name = "attn-bench", version, about, long_about = None)]
pub struct Options {
    /// Run only these sections (repeatable, or a comma-separated list).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<SectionId>,

    /// Thread counts to measure (repeatable or comma list; threads are pinned to cores).
    /// Default: 1 and the number of cores (just 1 on a single-core machine).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Vec<u16>,

    /// Smaller shapes and time budgets: a fast look (seconds, not minutes). The figures are less
    /// representative: small shapes do not reach the kernels' steady state.
    #[arg(long)]
    pub quick: bool,

    /// Output format on stdout (progress always goes to stderr).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,

    /// Also write `report.md` and SVG plots (GFLOP/s against size) into this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// Silence the progress lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// A kernel family; one section of the report, one module under `sections/`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
pub enum SectionId {
    /// SGEMM: square and attention-shaped products.
    Gemm,
    /// Fused scale-mask-softmax over score rows.
    Softmax,
    /// Flash attention, prefill shapes.
    Attention,
    /// Attention with one query per head against a long KV cache (bandwidth-bound).
    Decode,
    /// Multi-head attention and encoder layers.
    Layers,
    /// Attention variants: sliding window, softcap, sinks, ALiBi, windowed decode.
    Variants,
    /// Additive (Bahdanau, tanh) attention, and its tanh throughput.
    Additive,
    /// Packed variable-length batches against the same batch padded.
    Batch,
    /// Decode over a paged K/V cache against dense decode on the same bytes.
    Paged,
    /// Attention with bf16/f16 operands and int8 K/V caches (decode and flash).
    Dtypes,
}

impl SectionId {
    /// Every section, in report order.
    pub const ALL: [SectionId; 10] = [
        SectionId::Gemm,
        SectionId::Softmax,
        SectionId::Attention,
        SectionId::Decode,
        SectionId::Layers,
        SectionId::Variants,
        SectionId::Additive,
        SectionId::Batch,
        SectionId::Paged,
        SectionId::Dtypes,
    ];

    /// Lower-case name, as on the command line and in the `op` field of records.
    pub const fn name(self) -> &'static str {
        match self {
            SectionId::Gemm => "gemm",
            SectionId::Softmax => "softmax",
            SectionId::Attention => "attention",
            SectionId::Decode => "decode",
            SectionId::Layers => "layers",
            SectionId::Variants => "variants",
            SectionId::Additive => "additive",
            SectionId::Batch => "batch",
            SectionId::Paged => "paged",
            SectionId::Dtypes => "dtypes",
        }
    }
}

/// How results are printed on stdout.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Markdown tables, one per section, with the machine figures first.
    Table,
    /// One JSON object per line: machine figures, correctness checks, measurements.
    Json,
    /// One CSV header and one row per record (same fields as JSON, empty where absent).
    Csv,
}

impl Options {
    /// The sections to run, in report order.
    pub fn sections(&self) -> Vec<SectionId> {
        SectionId::ALL
            .into_iter()
            .filter(|s| self.only.is_empty() || self.only.contains(s))
            .collect()
    }

    /// The thread counts to measure, ascending and deduplicated.
    pub fn thread_counts(&self, cores: usize) -> Vec<usize> {
        let mut t: Vec<usize> = if self.threads.is_empty() {
            vec![1, cores.max(1)]
        } else {
            self.threads.iter().map(|&n| usize::from(n)).collect()
        };
        t.sort_unstable();
        t.dedup();
        t
    }
}
