//! `attn-bench`: how fast are the attention kernels, against what, on this machine?
//!
//! `cargo run --release -p attn-bench` measures this machine's FMA peak and copy bandwidth,
//! checks every implementation against `attn-reference` on a small case, then times each kernel
//! family beside its peers (`gemm`, `matrixmultiply`, the unfused path, the reference) in the
//! same run, and prints one table per family. Progress goes to stderr. A failed correctness
//! check makes the process exit with status 1 after the report is printed. The sections live
//! in the `attn_bench` library, which the criterion benches run too.

use std::process::ExitCode;

use clap::Parser;

use attn_bench::cli::{Format, Options};
use attn_bench::harness::{self, Budget};
use attn_bench::machine::Machine;
use attn_bench::plot;
use attn_bench::report::{self, Run};
use attn_bench::sections::{self, Ctx, Progress};

fn main() -> ExitCode {
    let opts = Options::parse();
    let load_start = report::load_average();
    let progress = Progress::new(opts.quiet);
    let cores = harness::core_count();
    let threads = opts.thread_counts(cores);
    if threads.iter().any(|&t| t > cores) {
        progress.log(&format!(
            "warning: more threads than the {cores} core(s) this process may use; figures for them measure oversubscription"
        ));
    }
    let pinned = harness::pin_threads(&threads);
    if !pinned {
        progress.log("warning: could not pin threads to cores; figures may vary more");
    }
    let machine = Machine::measure(&threads, cores, pinned, opts.quick, |s| progress.log(s));

    let mut ctx = Ctx {
        quick: opts.quick,
        threads,
        machine,
        budget: if opts.quick { Budget::QUICK } else { Budget::DEFAULT },
        measurements: Vec::new(),
        checks: Vec::new(),
        progress,
        criterion: None,
    };
    let mut skipped = Vec::new();
    for (i, id) in opts.sections().into_iter().enumerate() {
        match sections::runner(id) {
            Some(run) => {
                if i > 0 {
                    let threads = ctx.threads.clone();
                    let Ctx { machine, progress, .. } = &mut ctx;
                    machine.refresh(&threads, |s| progress.log(s));
                }
                run(&mut ctx)
            }
            None => {
                // Only worth a word when asked for by name; the default run covers what exists.
                if !opts.only.is_empty() {
                    ctx.progress
                        .log(&format!("{}: no kernel in attn-kernels yet, skipped", id.name()));
                }
                skipped.push(id.name());
            }
        }
    }

    let machine = &ctx.machine;
    for m in &mut ctx.measurements {
        m.rebase(machine);
    }
    let run = Run {
        machine,
        measurements: &ctx.measurements,
        checks: &ctx.checks,
        skipped: &skipped,
        seconds: ctx.progress.elapsed(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        load: (load_start, report::load_average()),
    };
    match opts.format {
        Format::Table => print!("{}", report::markdown(&run, &[])),
        Format::Json => print!("{}", report::json_lines(&run)),
        Format::Csv => print!("{}", report::csv(&run)),
    }
    let mut status = ExitCode::SUCCESS;
    if let Some(dir) = &opts.out {
        if let Err(e) = write_out(dir, &run) {
            ctx.progress.log(&format!("error: writing {}: {e}", dir.display()));
            status = ExitCode::from(2);
        } else {
            ctx.progress.log(&format!("wrote {}", dir.join("report.md").display()));
        }
    }
    let failed = ctx.checks.iter().filter(|c| !c.passed()).count();
    if failed > 0 {
        ctx.progress.log(&format!("{failed} correctness check(s) FAILED"));
        status = ExitCode::from(1);
    }
    ctx.progress.log(&format!("done in {:.1} s", ctx.progress.elapsed()));
    status
}

/// Writes `report.md` and one SVG per plot group into `dir`.
fn write_out(dir: &std::path::Path, run: &Run<'_>) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let mut plots = Vec::new();
    for (group, (unit, series)) in report::plot_groups(run.measurements) {
        if series.values().all(|pts| pts.len() < 2) {
            continue; // a single size is not a curve
        }
        let file = format!("{group}.svg");
        plot::draw(&dir.join(&file), &group, unit.as_str(), &series)?;
        let section = group.split('-').next().unwrap_or("").to_string();
        plots.push((section, file));
    }
    std::fs::write(dir.join("report.md"), report::markdown(run, &plots))?;
    Ok(())
}
