//! The timing harness and thread pinning.
//!
//! A measurement is: warm-up calls until a warm-up budget is spent (at least one, so caches,
//! page faults, lazily built thread pools and packing buffers are paid before timing), then
//! timed calls until the measurement budget is spent and at least [`Budget::min_reps`] calls
//! were made (two for calls longer than the budget). Each call is timed on its own; the report
//! quotes the median (robust to the interruptions of a shared machine) and the quartiles as the
//! spread. Two implementations whose ratio is the figure to read (a kernel and the copy that
//! bounds it) can be timed in alternating calls instead ([`measure_alternating`]), so that a
//! slow spell of the machine falls on both.
//!
//! Threads are pinned with `core_affinity`: the main thread to the first core, and the workers
//! of each `attn_kernels` thread pool (the pools every multi-threaded implementation in the
//! report runs in) one per core, so that no measurement depends on where the scheduler
//! happens to put a thread.

use std::hint::black_box;
use std::time::{Duration, Instant};

use attn_kernels::Parallelism;

/// How long to spend on one measurement.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Warm-up time (at least one call is made whatever it says).
    pub warmup: Duration,
    /// Timed calls continue until this much time was spent in them...
    pub measure: Duration,
    /// ...and at least this many were made.
    pub min_reps: usize,
    /// Never more than this many timed calls (tiny kernels would otherwise make millions).
    pub max_reps: usize,
}

impl Budget {
    /// The default budget: enough repetitions for a stable median on a noisy 2-core machine
    /// while keeping the whole default report under 3 minutes.
    pub const DEFAULT: Budget = Budget {
        warmup: Duration::from_millis(60),
        measure: Duration::from_millis(250),
        min_reps: 3,
        max_reps: 2000,
    };

    /// `--quick`: a look, not a measurement to quote.
    pub const QUICK: Budget = Budget {
        warmup: Duration::from_millis(5),
        measure: Duration::from_millis(25),
        min_reps: 3,
        max_reps: 200,
    };
}

/// Summary of the timed calls of one measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    /// Median time of one call, seconds.
    pub median_s: f64,
    /// First quartile, seconds.
    pub q1_s: f64,
    /// Third quartile, seconds.
    pub q3_s: f64,
    /// Fastest call, seconds.
    pub min_s: f64,
    /// Number of timed calls.
    pub reps: usize,
}

impl Stats {
    /// Half the interquartile range relative to the median (the "±" of the tables).
    pub fn spread(&self) -> f64 {
        if self.median_s > 0.0 {
            (self.q3_s - self.q1_s) / 2.0 / self.median_s
        } else {
            0.0
        }
    }

    /// Summarises a set of call times (seconds); `None` when empty.
    pub fn from_samples(mut samples: Vec<f64>) -> Option<Stats> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        Some(Stats {
            median_s: quantile(&samples, 0.5),
            q1_s: quantile(&samples, 0.25),
            q3_s: quantile(&samples, 0.75),
            min_s: samples[0],
            reps: samples.len(),
        })
    }
}

/// Linear-interpolated quantile of sorted, non-empty samples.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Times `f` under `budget` (see the module docs). `f` returns a value that is passed through
/// `black_box`, so the work it stands for cannot be optimised away.
pub fn measure<R>(budget: &Budget, mut f: impl FnMut() -> R) -> Stats {
    let stats = measure_alternating(budget, &mut [&mut f]);
    stats[0]
}

/// Times the closures in `fs` in alternating calls (`f₀, f₁, …, f₀, f₁, …`), as [`measure`]
/// times one closure with the budget's times multiplied by their number: warm-up rounds
/// until that many warm-up budgets are spent, then timed rounds until the time spent in all of
/// them and the rounds made meet the budget's tests. What each call returns is passed through
/// `black_box`. Implementations timed this way see the same moments of a shared machine, so
/// the ratio of their medians is not skewed by a slow spell that one of them happened to fall
/// in. Returns one summary per closure, in order (none for no closure).
pub fn measure_alternating<R>(budget: &Budget, fs: &mut [&mut dyn FnMut() -> R]) -> Vec<Stats> {
    if fs.is_empty() {
        return Vec::new();
    }
    let k = fs.len() as u32;
    let start = Instant::now();
    loop {
        for f in fs.iter_mut() {
            black_box(f());
        }
        if start.elapsed() >= budget.warmup * k {
            break;
        }
    }
    let mut samples = vec![Vec::new(); fs.len()];
    let mut spent = Duration::ZERO;
    // A round of calls longer than the whole (k-fold) budget gets two timed repetitions, not
    // `min_reps`: its own duration already averages out short interruptions, and three more of
    // them would blow the report's total time.
    let enough = |reps: usize, spent: Duration| {
        reps >= budget.max_reps.max(1)
            || (reps >= budget.min_reps && spent >= budget.measure * k)
            || (reps >= 2 && spent >= 2 * budget.measure * k)
    };
    while !enough(samples[0].len(), spent) {
        for (f, s) in fs.iter_mut().zip(samples.iter_mut()) {
            let t = Instant::now();
            black_box(f());
            let dt = t.elapsed();
            spent += dt;
            s.push(dt.as_secs_f64());
        }
    }
    // Non-empty: the loop runs at least once since max_reps ≥ 1.
    samples
        .into_iter()
        .map(|s| {
            Stats::from_samples(s).unwrap_or(Stats {
                median_s: f64::NAN,
                q1_s: f64::NAN,
                q3_s: f64::NAN,
                min_s: f64::NAN,
                reps: 0,
            })
        })
        .collect()
}

/// Cores this process may run on (at least one entry, even when the OS does not say).
pub fn core_count() -> usize {
    core_affinity::get_core_ids().map_or(1, |ids| ids.len().max(1))
}

/// Pins the calling thread to the first core, and the workers of the `attn_kernels` pool of
/// each thread count in `threads` one per core (worker `i` to core `i mod cores`). Returns
/// false when the OS refused any of it (the report says the threads were not pinned).
pub fn pin_threads(threads: &[usize]) -> bool {
    let Some(ids) = core_affinity::get_core_ids().filter(|ids| !ids.is_empty()) else {
        return false;
    };
    let mut ok = core_affinity::set_for_current(ids[0]);
    for &t in threads.iter().filter(|&&t| t > 1) {
        let pinned: Vec<bool> = Parallelism::threads(t).install(|| {
            rayon::broadcast(|ctx| core_affinity::set_for_current(ids[ctx.index() % ids.len()]))
        });
        ok &= pinned.iter().all(|&p| p);
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report pins its main thread before any kernel runs; the kernels' thread limit must
    /// still be every core (it once read the pinned thread's affinity and became 1).
    #[test]
    fn pinning_the_caller_keeps_every_core_available() {
        let cores = core_count();
        if let Some(id) = core_affinity::get_core_ids().and_then(|ids| ids.first().copied()) {
            core_affinity::set_for_current(id);
        }
        assert_eq!(Parallelism::threads(cores).count(), cores);
        assert!(attn_kernels::par::max_threads() >= cores);
    }

    #[test]
    fn quantiles_of_known_samples() {
        let s = Stats::from_samples(vec![5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(s.median_s, 3.0);
        assert_eq!(s.q1_s, 2.0);
        assert_eq!(s.q3_s, 4.0);
        assert_eq!(s.min_s, 1.0);
        assert_eq!(s.reps, 5);
        assert!((s.spread() - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(Stats::from_samples(vec![]), None);
    }

    #[test]
    fn measure_respects_min_and_max_reps() {
        let b = Budget {
            warmup: Duration::ZERO,
            measure: Duration::from_secs(3600),
            min_reps: 2,
            max_reps: 7,
        };
        let mut calls = 0;
        let s = measure(&b, || calls += 1);
        assert_eq!(s.reps, 7);
        assert_eq!(calls, 8); // one warm-up call
    }

    #[test]
    fn alternating_calls_take_turns() {
        let b = Budget {
            warmup: Duration::ZERO,
            measure: Duration::from_secs(3600),
            min_reps: 2,
            max_reps: 5,
        };
        let order = std::cell::RefCell::new(Vec::new());
        let s = measure_alternating(
            &b,
            &mut [
                &mut || {
                    order.borrow_mut().push('a');
                    std::thread::sleep(Duration::from_millis(2));
                },
                &mut || order.borrow_mut().push('c'),
            ],
        );
        let [a, c] = s[..] else { panic!("{s:?}") };
        assert_eq!((a.reps, c.reps), (5, 5));
        // One warm-up round, then five timed ones, each `a` then `c`.
        assert_eq!(order.into_inner().iter().collect::<String>(), "ac".repeat(6));
        // Each closure's times come back in its own place: only `a` sleeps.
        assert!(a.min_s >= 0.002, "{a:?}");
        assert!(c.median_s < 0.002, "{c:?}");
        assert!(measure_alternating::<()>(&b, &mut []).is_empty());
    }

    #[test]
    fn long_calls_get_two_repetitions() {
        let b = Budget {
            warmup: Duration::ZERO,
            measure: Duration::from_millis(1),
            min_reps: 5,
            max_reps: 100,
        };
        let s = measure(&b, || std::thread::sleep(Duration::from_millis(3)));
        assert_eq!(s.reps, 2);
    }
}
