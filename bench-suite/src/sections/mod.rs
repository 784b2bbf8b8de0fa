//! The report's sections, one module per kernel family, and the context they share.
//!
//! A section first checks every implementation it times against `attn-reference` on a small
//! case, then times its grid of shapes on each thread count. A section whose kernel has not
//! landed in `attn-kernels` is not compiled in at all (see [`runner`]): the report never shows a
//! figure it did not measure.

pub mod additive;
pub mod attention;
pub mod batch;
pub mod decode;
pub mod dtypes;
pub mod gemm;
pub mod layers;
pub mod paged;
pub mod softmax;
pub mod variants;

use std::time::Instant;

use crate::check::Verdict;
use crate::cli::SectionId;
use crate::harness::{measure_alternating, Budget};
use crate::machine::{Machine, PeakRef};
use crate::record::{Check, Measurement, Shape, Unit};

/// The function that runs a section.
pub type Runner = fn(&mut Ctx);

/// f32 elements that start on a 64-byte boundary, as an engine's tensors do (PyTorch's CPU
/// allocator aligns to 64 bytes). A `Vec` starts wherever the allocator put it: 16 bytes past
/// a boundary for glibc's large (mmap'd) blocks, anywhere 16-aligned for small ones. Rows off
/// a cache line make each vector load of them a split load: decode over such K/V took
/// 1.05–1.22× the time in a scratch harness, and up to 1.18× in the report's decode rows
/// (perf journal, 2026-12-07 22:19), so figures would depend on where malloc put the
/// buffers. The operands of the attention problems and the typed caches are kept in these.
/// (The kernels' `AlignedBuf` is their growable packing scratch, private to them.)
pub struct Aligned {
    buf: Vec<f32>,
    at: usize,
    len: usize,
}

impl Aligned {
    /// `n` zeros.
    pub fn zeros(n: usize) -> Aligned {
        let buf = vec![0.0f32; n + 15];
        // Bytes to the next 64-byte boundary: a multiple of 4, as the buffer holds f32.
        let at = (buf.as_ptr() as usize).wrapping_neg() % 64 / 4;
        Aligned { buf, at, len: n }
    }

    /// A copy of `x`.
    pub fn copy_of(x: &[f32]) -> Aligned {
        let mut a = Aligned::zeros(x.len());
        a.copy_from_slice(x);
        a
    }
}

impl std::ops::Deref for Aligned {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[self.at..self.at + self.len]
    }
}

impl std::ops::DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[self.at..self.at + self.len]
    }
}

/// The runner of a section, or `None` while its kernel does not exist yet.
pub fn runner(id: SectionId) -> Option<Runner> {
    match id {
        SectionId::Gemm => Some(gemm::run),
        SectionId::Attention => Some(attention::run),
        SectionId::Decode => Some(decode::run),
        SectionId::Softmax => Some(softmax::run),
        SectionId::Layers => Some(layers::run),
        SectionId::Variants => Some(variants::run),
        SectionId::Additive => Some(additive::run),
        SectionId::Batch => Some(batch::run),
        SectionId::Paged => Some(paged::run),
        SectionId::Dtypes => Some(dtypes::run),
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

/// One call of an implementation being timed, its error as text.
pub type Call<'a> = &'a mut dyn FnMut() -> Result<(), String>;

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
    /// Set by the criterion benches ([`crate::criterion_main`]): timed calls go to criterion,
    /// one benchmark per case and implementation, and nothing is recorded in `measurements`.
    pub criterion: Option<criterion::Criterion>,
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
        let f = &mut || f().map_err(|e| e.to_string());
        self.bench_alternating(op, shape, threads, work, plot, &mut [(imp, f)]);
    }

    /// Times implementations of one case in alternating calls ([`measure_alternating`]), so
    /// that the ratios of their medians compare them at the same moments of a shared machine,
    /// and records each measurement (with `plot` as [`bench`](Self::bench) takes it). An
    /// implementation whose first call returns an error is recorded as a failed check instead,
    /// and the others are timed without it.
    pub fn bench_alternating(
        &mut self,
        op: &'static str,
        shape: Shape,
        threads: usize,
        work: Work,
        plot: Option<(String, f64)>,
        imps: &mut [(&'static str, Call<'_>)],
    ) {
        let works = vec![work; imps.len()];
        self.bench_alternating_each(op, shape, threads, &works, plot, imps);
    }

    /// [`bench_alternating`](Self::bench_alternating) with the work of each implementation
    /// (`works[i]` for `imps[i]`): calls of one case that move different bytes, e.g. the
    /// same softmax reading bf16 or f32.
    pub fn bench_alternating_each(
        &mut self,
        op: &'static str,
        shape: Shape,
        threads: usize,
        works: &[Work],
        plot: Option<(String, f64)>,
        imps: &mut [(&'static str, Call<'_>)],
    ) {
        assert_eq!(works.len(), imps.len(), "one work per implementation");
        if self.criterion.is_some() {
            return self.bench_criterion(op, shape, threads, works, imps);
        }
        let mut live = Vec::new();
        let mut calls: Vec<Call<'_>> = Vec::new();
        for ((imp, f), &work) in imps.iter_mut().zip(works) {
            match f() {
                Ok(()) => {
                    live.push((*imp, work));
                    calls.push(&mut **f);
                }
                Err(e) => self.check(op, imp, shape.clone(), threads, Err(e)),
            }
        }
        let stats = measure_alternating(&self.budget, &mut calls);
        for ((imp, work), stats) in live.into_iter().zip(stats) {
            let t = stats.median_s;
            let (unit, rate, gbs, peak_ref) = match work {
                Work::Flops(fl) => (Unit::Gflops, fl / t / 1e9, None, PeakRef::Fma { threads }),
                Work::Elems { elems, bytes } => (
                    Unit::GelemS,
                    elems / t / 1e9,
                    Some(bytes / t / 1e9),
                    PeakRef::Copy { threads, working_set: bytes as usize },
                ),
                Work::Bytes(b) => (
                    Unit::Gbs,
                    b / t / 1e9,
                    None,
                    PeakRef::Copy { threads, working_set: b as usize },
                ),
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
                shape: shape.clone(),
                threads,
                stats,
                unit,
                rate,
                gbs,
                pct_peak,
                peak: peak.what,
                peak_ref,
                plot: plot.clone(),
            });
        }
    }
}

impl Ctx {
    /// [`bench_alternating_each`](Self::bench_alternating_each) under criterion: each
    /// implementation is one benchmark of the group `{op}/{shape}/{threads}t`, with its work
    /// as its throughput (FLOPs and elements as criterion's elements, bytes as bytes). A call
    /// that fails is a failed check, as in the report.
    fn bench_criterion(
        &mut self,
        op: &'static str,
        shape: Shape,
        threads: usize,
        works: &[Work],
        imps: &mut [(&'static str, Call<'_>)],
    ) {
        let throughput = |work: Work| match work {
            Work::Flops(f) => criterion::Throughput::Elements(f as u64),
            Work::Elems { elems, .. } => criterion::Throughput::Elements(elems as u64),
            Work::Bytes(b) => criterion::Throughput::Bytes(b as u64),
        };
        let mut failed = Vec::new();
        if let Some(c) = self.criterion.as_mut() {
            let mut g = c.benchmark_group(format!("{op}/{}/{threads}t", shape.label()));
            for ((imp, f), &work) in imps.iter_mut().zip(works) {
                g.throughput(throughput(work));
                if let Err(e) = f() {
                    failed.push((*imp, e));
                    continue;
                }
                g.bench_function(*imp, |b| b.iter(|| std::hint::black_box(f().is_ok())));
            }
            g.finish();
        }
        for (imp, e) in failed {
            self.check(op, imp, shape.clone(), threads, Err(e));
        }
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
