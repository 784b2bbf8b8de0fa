//! `attn-bench`: how fast are the attention kernels, against what, on this machine?
//!
//! The library behind the report binary (`src/main.rs`) and the criterion benches
//! (`benches/`): both run the same [`sections`], so the cases, the peers and the correctness
//! checks are declared once. The report times them with its own alternating harness and rates
//! them against this machine's peaks; the benches hand the same calls to criterion
//! ([`criterion_main`]).
//!
//! Modules: [`cli`] options, [`harness`] timing and pinning, [`machine`] peaks, [`check`] error
//! bounds, [`peers`] safe wrappers of the peer libraries, [`sections`] one module per kernel
//! family, [`record`] and [`report`] output, [`plot`] SVG plots.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod check;
pub mod cli;
pub mod harness;
pub mod machine;
pub mod peers;
pub mod plot;
pub mod record;
pub mod report;
pub mod sections;

use cli::SectionId;
use harness::Budget;
use machine::Machine;
use sections::{Ctx, Progress};

/// The `main` of a criterion bench: runs `ids`' sections (their correctness checks, then every
/// case on one thread and on every core, pinned as the report pins them) with each timed call
/// handed to criterion as benchmark `{op}/{shape}/{threads}t/{implementation}`, with its
/// throughput. Criterion's own arguments apply (a filter, `--measurement-time`, …); set
/// `ATTN_BENCH_QUICK=1` for the report's `--quick` case list. Exits with status 1 when a
/// correctness check failed.
pub fn criterion_main(ids: &[SectionId]) {
    let quick = std::env::var_os("ATTN_BENCH_QUICK").is_some_and(|v| v != "0");
    let progress = Progress::new(false);
    let cores = harness::core_count();
    let threads = if cores > 1 { vec![1, cores] } else { vec![1] };
    let pinned = harness::pin_threads(&threads);
    // Criterion does the timing; the peaks only fill the fields the sections expect.
    let machine = Machine::measure(&threads, cores, pinned, true, |_| {});
    let criterion = criterion::Criterion::default().sample_size(10).configure_from_args();
    let mut ctx = Ctx {
        quick,
        threads,
        machine,
        budget: if quick { Budget::QUICK } else { Budget::DEFAULT },
        measurements: Vec::new(),
        checks: Vec::new(),
        progress,
        criterion: Some(criterion),
    };
    for &id in ids {
        if let Some(run) = sections::runner(id) {
            run(&mut ctx);
        }
    }
    if let Some(c) = ctx.criterion.take() {
        c.final_summary();
    }
    let failed = ctx.checks.iter().filter(|c| !c.passed()).count();
    if failed > 0 {
        ctx.progress.log(&format!("{failed} correctness check(s) FAILED"));
        std::process::exit(1);
    }
}
