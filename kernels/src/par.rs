//! Threading: how many threads a call may use, and the cached rayon pools that provide them.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock};

/// How many threads a kernel call may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Parallelism {
    /// Run on the calling thread only.
    #[default]
    Sequential,
    /// Use up to this many threads (a dedicated rayon pool of that size, created once and
    /// cached). Kernels stay sequential below their size thresholds whatever this says.
    Threads(NonZeroUsize),
}

impl Parallelism {
    /// `Threads(n)` for `n ≥ 2`, `Sequential` for `n ≤ 1`.
    pub fn threads(n: usize) -> Self {
        match NonZeroUsize::new(n) {
            Some(n) if n.get() > 1 => Parallelism::Threads(n),
            _ => Parallelism::Sequential,
        }
    }

    /// Number of threads this allows (1 for sequential).
    pub fn count(self) -> usize {
        match self {
            Parallelism::Sequential => 1,
            Parallelism::Threads(n) => n.get(),
        }
    }

    /// Runs `f` inside a rayon pool of [`count`](Self::count) threads (or directly when
    /// sequential), so that rayon calls inside `f` use exactly that many workers.
    pub fn install<R: Send>(self, f: impl FnOnce() -> R + Send) -> R {
        match self {
            Parallelism::Sequential => f(),
            Parallelism::Threads(n) => pool(n.get()).install(f),
        }
    }
}

fn pool(n: usize) -> Arc<rayon::ThreadPool> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let pools = POOLS.get_or_init(Default::default);
    // A poisoned lock only means another thread panicked while inserting; the map is still valid.
    let mut map = pools.lock().unwrap_or_else(|e| e.into_inner());
    map.entry(n)
        .or_insert_with(|| {
            Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(move |i| format!("attn-kernels-{n}-{i}"))
                    .build()
                    .unwrap_or_else(|_| {
                        rayon::ThreadPoolBuilder::new()
                            .num_threads(1)
                            .build()
                            .expect("a 1-thread pool")
                    }),
            )
        })
        .clone()
}
