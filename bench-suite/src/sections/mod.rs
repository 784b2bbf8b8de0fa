//! The report's sections, one module per kernel family, and the context they share.
//!
//! A section first checks every implementation it times against `attn-reference` on a small
//! case, then times its grid of shapes on each thread count. A section whose kernel has not
//! landed in `attn-kernels` is not compiled in at all (see [`runner`]): the report never shows a
//! figure it did not measure.

pub mod attention;
pub mod decode;
pub mod gemm;
pub mod layers;
pub mod softmax;

use std::hint::black_box;
use std::time::Instant;

use crate::check::Verdict;
use crate::cli::SectionId;
use crate::harness::{measure, measure_alternating, Budget, Stats};
use crate::machine::{Machine, PeakRef};
use crate::record::{Check, Measurement, Shape, Unit};

/// The function that runs a section.
pub type Runner = fn(&mut Ctx);

/// The runner of a section, or `None` while its kernel does not exist yet.
pub fn runner(id: SectionId) -> Option<Runner> {
    match id {
        SectionId::Gemm => Some(gemm::run),
        SectionId::Attention => Some(attention::run),
        SectionId::Decode => Some(decode::run),
        SectionId::Softmax => Some(softmax::run),
        SectionId::Layers => Some(layers::run),
    }
}

/// What one call of a timed implementation does, for rates and % of peak.
#[derive(Clone, Copy, Debug)]
pub enum Work {
    /// Floating-point operations; compared with the FMA peak.
    Flops(f64),
    /// Elements processed and bytes moved (read + written); the rate is in elements/s and the
    /// bandwidth is compared with the copy bandwidth for that working set.
    Elems {
        /// Elements per call.
        elems: f64,
        /// Bytes read + written per call.
        bytes: f64,
    },
    /// Bytes that must be read per call; compared with the copy bandwidth.
    Bytes(f64),
}

/// Shared state of a run: options, machine figures, results, progress.
pub struct Ctx {
    /// `--quick` was given.
    pub quick: bool,
    /// Thread counts to measure, ascending.
    pub threads: Vec<usize>,
    /// The machine figures of this run.
    pub machine: Machine,
    /// Time budget of one measurement.
    pub budget: Budget,
    /// Measurements so far.
    pub measurements: Vec<Measurement>,
    /// Correctness checks so far.
    pub checks: Vec<Check>,
    /// Progress on stderr.
    pub progress: Progress,
}

impl Ctx {
    /// Records a correctness check (`verdict` of a successful call, or the error it returned).
    pub fn check(
        &mut self,
        op: &'static str,
        imp: &'static str,
        shape: Shape,
        threads: usize,
        verdict: Result<Verdict, String>,
    ) {
        let c = match verdict {
            Ok(v) => Check {
                op,
                imp,
                shape,
                threads,
                max_err: v.max_err,
                bound: v.bound,
                ratio: v.ratio,
                error: None,
            },
            Err(e) => Check {
                op,
                imp,
                shape,
                threads,
                max_err: f64::NAN,
                bound: f64::NAN,
                ratio: f64::INFINITY,
                error: Some(e),
            },
        };
        self.progress.log(&format!(
            "{op}: check {imp} {} t={threads}: {} (max err {:.2e}, err/bound {:.3})",
            c.shape.label(),
            if c.passed() { "pass" } else { "FAIL" },
            c.max_err,
            c.ratio,
        ));
        if let Some(e) = &c.error {
            self.progress.log(&format!("{op}: {imp} returned an error: {e}"));
        }
        self.checks.push(c);
    }

    /// Times `f` and records the measurement. A call that returns an error is not timed; it is
    /// recorded as a failed check instead.
    #[allow(clippy::too_many_arguments)]
    pub fn bench<E: std::fmt::Display>(
        &mut self,
        op: &'static str,
        imp: &'static str,
        shape: Shape,
        threads: usize,
        work: Work,
        plot: Option<(String, f64)>,
        mut f: impl FnMut() -> Result<(), E>,
    ) {
        if let Err(e) = f() {
            self.check(op, imp, shape, threads, Err(e.to_string()));
            return;
        }
        let stats = measure(&self.budget, || f().is_ok());
        self.record(op, imp, shape, threads, work, plot, stats);
    }

    /// Times two implementations of one case in alternating calls ([`measure_alternating`]),
    /// so that the ratio of their medians compares them at the same moments of a shared
    /// machine, and records both measurements. An implementation whose first call returns an
    /// error is recorded as a failed check instead, and the other is timed alone, as
    /// [`bench`](Self::bench) would.
    #[allow(clippy::too_many_arguments)]
    pub fn bench_alternating<E: std::fmt::Display>(
        &mut self,
        op: &'static str,
        [fa, ga]: [&'static str; 2],
        shape: Shape,
        threads: usize,
        work: Work,
        mut f: impl FnMut() -> Result<(), E>,
        mut g: impl FnMut() -> Result<(), E>,
    ) {
        let (fr, gr) = (f(), g());
        if fr.is_ok() && gr.is_ok() {
            let [a, b] = measure_alternating(
                &self.budget,
                [&mut || drop(black_box(f())), &mut || drop(black_box(g()))],
            );
            self.record(op, fa, shape.clone(), threads, work, None, a);
            self.record(op, ga, shape, threads, work, None, b);
            return;
        }
        match fr {
            Err(e) => self.check(op, fa, shape.clone(), threads, Err(e.to_string())),
            Ok(()) => self.bench(op, fa, shape.clone(), threads, work, None, &mut f),
        }
        match gr {
            Err(e) => self.check(op, ga, shape, threads, Err(e.to_string())),
            Ok(()) => self.bench(op, ga, shape, threads, work, None, &mut g),
        }
    }

    /// Records a measurement of `imp` taking `stats` per call for `work`.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        op: &'static str,
        imp: &'static str,
        shape: Shape,
        threads: usize,
        work: Work,
        plot: Option<(String, f64)>,
        stats: Stats,
    ) {
        let t = stats.median_s;
        let (unit, rate, gbs, peak_ref) = match work {
            Work::Flops(fl) => (Unit::Gflops, fl / t / 1e9, None, PeakRef::Fma { threads }),
            Work::Elems { elems, bytes } => (
                Unit::GelemS,
                elems / t / 1e9,
                Some(bytes / t / 1e9),
                PeakRef::Copy { threads, working_set: bytes as usize },
            ),
            Work::Bytes(b) => {
                (Unit::Gbs, b / t / 1e9, None, PeakRef::Copy { threads, working_set: b as usize })
            }
        };
        let peak = self.machine.peak(peak_ref);
        let pct_peak = 100.0 * gbs.unwrap_or(rate) / peak.value;
        self.progress.log(&format!(
            "{op}: {imp:<16} {:<22} t={threads}  {:>9.3} ms ±{:.0}%  {rate:>7.2} {}  {pct_peak:>3.0}% of {}",
            shape.label(),
            t * 1e3,
            stats.spread() * 100.0,
            unit.header(),
            peak.what,
        ));
        self.measurements.push(Measurement {
            op,
            imp,
            shape,
            threads,
            stats,
            unit,
            rate,
            gbs,
            pct_peak,
            peak: peak.what,
            peak_ref,
            plot,
        });
    }
}

/// Progress lines on stderr, stamped with the time since the run started.
pub struct Progress {
    start: Instant,
    quiet: bool,
}

impl Progress {
    /// Starts the clock.
    pub fn new(quiet: bool) -> Self {
        Progress { start: Instant::now(), quiet }
    }

    /// Prints one line on stderr (unless quiet).
    pub fn log(&self, msg: &str) {
        if !self.quiet {
            eprintln!("[{:>6.1}s] {msg}", self.start.elapsed().as_secs_f64());
        }
    }

    /// Seconds since the start.
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}
