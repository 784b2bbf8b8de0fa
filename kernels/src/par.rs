//! Threading: how many threads a call may use, and the rayon pools that provide them.
//!
//! One policy for the Rust API and the C ABI ([`Parallelism::threads`], [`Parallelism::count`]):
//! a requested count of 0 means every available core, any other count is clamped to
//! [`max_threads`] (the CPUs the machine has online), so no call ever creates more workers
//! than the machine has cores, whatever it asks for (`usize::MAX` included), and no arithmetic
//! on a count can overflow.
//!
//! Pools are bounded: the pool of [`max_threads`] workers lives for the whole process, and at
//! most [`SMALL_POOLS`] pools of smaller sizes are kept besides it (least recently used first
//! out; a pool dropped from the cache ends its threads once the calls running on it return).
//! Results never depend on which pool ran them: every kernel's arithmetic is fixed by the
//! problem and the (clamped) count, not by the workers.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock};

/// How many threads a kernel call may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Parallelism {
    /// Run on the calling thread only.
    #[default]
    Sequential,
    /// Use up to this many threads, clamped to [`max_threads`] (see [`count`](Self::count)).
    /// Kernels stay sequential below their size thresholds whatever this says.
    Threads(NonZeroUsize),
}

/// Smaller pools (fewer workers than [`max_threads`]) kept alive besides the full-size one.
pub const SMALL_POOLS: usize = 2;

/// The most threads any call uses, read once: the CPUs the OS has online (Linux:
/// `/sys/devices/system/cpu/online`), or [`std::thread::available_parallelism`] where that is
/// more or the file is absent; 1 when neither says.
///
/// Not the calling thread's affinity alone: `available_parallelism` counts the CPUs the
/// *calling thread* may run on, so an engine that pins its main thread to one core before its
/// first call would otherwise clamp every later request to one thread.
pub fn max_threads() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        let allowed = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|s| count_cpu_list(&s))
            .unwrap_or(0);
        allowed.max(online).max(1)
    })
}

/// The number of CPUs in a Linux CPU list such as `0-3,8,10-11` (`None` if malformed).
fn count_cpu_list(list: &str) -> Option<usize> {
    list.trim().split(',').try_fold(0usize, |n, part| {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        n.checked_add(hi.checked_sub(lo)?.checked_add(1)?)
    })
}

impl Parallelism {
    /// The policy for a requested thread count: `0` = every available core
    /// ([`max_threads`]), `1` = the calling thread only, `n ≥ 2` = up to `min(n, max_threads())`
    /// threads. Any `n` is accepted; on a one-core machine every request is sequential.
    pub fn threads(n: usize) -> Self {
        let n = if n == 0 { max_threads() } else { n.min(max_threads()) };
        match NonZeroUsize::new(n) {
            Some(n) if n.get() > 1 => Parallelism::Threads(n),
            _ => Parallelism::Sequential,
        }
    }

    /// Number of threads this allows: 1 for sequential, else the requested count clamped to
    /// [`max_threads`] (also for a `Threads(n)` built directly). Always in `1..=max_threads()`.
    pub fn count(self) -> usize {
        match self {
            Parallelism::Sequential => 1,
            Parallelism::Threads(n) => n.get().min(max_threads()).max(1),
        }
    }

    /// Runs `f` inside a rayon pool of [`count`](Self::count) threads (or directly when that
    /// is 1), so that rayon calls inside `f` use exactly that many workers. Should the OS refuse
    /// to start a pool's threads, `f` runs on a one-thread pool, or on the calling thread.
    pub fn install<R: Send>(self, f: impl FnOnce() -> R + Send) -> R {
        match self.count() {
            1 => f(),
            n => match pool(n) {
                Some(p) => p.install(f),
                None => f(),
            },
        }
    }
}

/// The pool of `n` workers (`2 ≤ n ≤ max_threads()`), from the bounded cache.
fn pool(n: usize) -> Option<Arc<rayon::ThreadPool>> {
    static FULL: OnceLock<Option<Arc<rayon::ThreadPool>>> = OnceLock::new();
    static SMALL: Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>> = Mutex::new(Vec::new());
    if n >= max_threads() {
        return FULL.get_or_init(|| build(max_threads())).clone();
    }
    // A poisoned lock only means another thread panicked while holding it; the list is valid.
    let mut small = SMALL.lock().unwrap_or_else(|e| e.into_inner());
    cached(&mut small, n, || build(n))
}

/// The entry of size `n` in `list` (most recently used last), made by `make` when missing; the
/// least recently used entry leaves when the list would exceed [`SMALL_POOLS`]. Dropping the
/// last handle of a pool ends its threads once its running calls return.
fn cached<P: Clone>(
    list: &mut Vec<(usize, P)>,
    n: usize,
    make: impl FnOnce() -> Option<P>,
) -> Option<P> {
    if let Some(i) = list.iter().position(|(size, _)| *size == n) {
        let entry = list.remove(i);
        let p = entry.1.clone();
        list.push(entry);
        return Some(p);
    }
    let p = make()?;
    if list.len() >= SMALL_POOLS {
        list.remove(0);
    }
    list.push((n, p.clone()));
    Some(p)
}

/// A pool of `n` workers, else one of 1, else none.
fn build(n: usize) -> Option<Arc<rayon::ThreadPool>> {
    let make = |n: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(move |i| format!("attn-kernels-{n}-{i}"))
            .build()
            .ok()
    };
    make(n).or_else(|| make(1)).map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
        assert_eq!(count_cpu_list(""), None);
    }

    #[test]
    fn counts_are_clamped_to_the_cores() {
        let max = max_threads();
        assert!(max >= 1);
        assert_eq!(Parallelism::threads(1), Parallelism::Sequential);
        assert_eq!(Parallelism::threads(0).count(), max);
        for n in [2, 3, 8, 4096, usize::MAX / 2, usize::MAX] {
            assert_eq!(Parallelism::threads(n).count(), n.min(max), "{n}");
            let direct = Parallelism::Threads(NonZeroUsize::new(n).unwrap());
            assert_eq!(direct.count(), n.min(max), "{n}");
        }
    }

    #[test]
    fn install_uses_the_clamped_count_of_workers() {
        for n in [0, 1, 2, 3, 4096, usize::MAX] {
            let par = Parallelism::threads(n);
            let workers = par.install(rayon::current_num_threads);
            if par.count() > 1 {
                assert_eq!(workers, par.count(), "{n}");
            }
            let direct = Parallelism::Threads(NonZeroUsize::new(n.max(1)).unwrap());
            let workers = direct.install(rayon::current_num_threads);
            if direct.count() > 1 {
                assert_eq!(workers, direct.count(), "{n}");
            }
        }
    }

    #[test]
    fn the_pool_cache_is_bounded() {
        let mut list = Vec::new();
        let mut made = 0;
        for round in 0..3 {
            for n in 2..=64 {
                let p = cached(&mut list, n, || {
                    made += 1;
                    Some(n)
                });
                assert_eq!(p, Some(n));
                assert!(list.len() <= SMALL_POOLS, "round {round}: {} cached", list.len());
            }
        }
        // Reused while cached: asking for the newest size again makes nothing.
        let before = made;
        assert_eq!(cached(&mut list, 64, || None), Some(64));
        assert_eq!(made, before);
        // A size that failed to build is not cached.
        assert_eq!(cached(&mut list, 1000, || None::<usize>), None);
        assert!(list.iter().all(|(n, _)| *n != 1000));
    }
}
