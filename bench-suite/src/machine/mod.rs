//! This machine's figures, measured in the same run as the kernels so that "% of peak" compares
//! like with like on a machine whose speed varies with its load: the FMA peak (one core and each
//! thread count of the run) and the copy bandwidth out of cache, in L3 and in L2.
//!
//! A peak is what the machine can do, so it is taken from the fastest timed repetition, not
//! the median: on a shared machine the median of a probe measures the neighbours' load. The
//! kernels are quoted by their median, so "% of peak" errs on the modest side.

pub mod fma;

use std::hint::black_box;

use attn_kernels::{Isa, Parallelism};
use rayon::prelude::*;

use crate::harness::{measure, Budget};
use fma::Probe;

/// Bytes of each buffer (source and destination) in the out-of-cache copy: twice the 32 MiB L3
/// of this machine's class together, so the copy streams from and to memory.
pub const COPY_DRAM_BYTES: usize = 64 << 20;
/// Bytes of each buffer in the in-cache copy: 256 KiB + 256 KiB = 512 KiB, inside a 1 MiB L2
/// (and too large for L1).
pub const COPY_L2_BYTES: usize = 256 << 10;
/// Bytes of each buffer in the in-L3 copy: 4 MiB + 4 MiB, well inside a 32 MiB L3 shared with
/// the other core, far out of L2.
pub const COPY_L3_BYTES: usize = 4 << 20;
/// Working sets (bytes read + written) up to this size per thread are compared with the L2 copy
/// bandwidth...
pub const L2_WORKING_SET: usize = 1 << 20;
/// ...up to this size (all threads together) with the L3 figure, larger ones with the
/// out-of-cache figure.
pub const L3_WORKING_SET: usize = 16 << 20;
/// FMA probe rounds per timed call (≈ 20 ms at 100 GFLOP/s with 16 × 512-bit chains).
const FMA_ROUNDS: u64 = 4_000_000;

/// The figures of this machine.
#[derive(Clone, Debug)]
pub struct Machine {
    /// CPU model name from `/proc/cpuinfo` ("unknown" elsewhere).
    pub cpu: String,
    /// Cores this process may run on.
    pub cores: usize,
    /// The ISA the kernels selected (`attn_kernels::arch::selected`).
    pub isa: Isa,
    /// The FMA probe used.
    pub probe: Probe,
    /// True when every benchmark thread could be pinned to a core.
    pub pinned: bool,
    /// FMA peak in GFLOP/s, per thread count.
    pub fma_gflops: Vec<(usize, f64)>,
    /// Bytes of each buffer of the out-of-cache copy.
    pub dram_bytes: usize,
    /// Out-of-cache copy bandwidth (bytes read + written) in GB/s, per thread count.
    pub copy_dram_gbs: Vec<(usize, f64)>,
    /// In-L3 copy bandwidth in GB/s, per thread count.
    pub copy_l3_gbs: Vec<(usize, f64)>,
    /// In-L2 copy bandwidth in GB/s, per thread count.
    pub copy_l2_gbs: Vec<(usize, f64)>,
}

/// Which figure a measurement is compared with (resolved against the final figures of the run,
/// see [`Machine::refresh`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeakRef {
    /// The FMA peak on this many threads.
    Fma {
        /// Threads.
        threads: usize,
    },
    /// The copy bandwidth for this working set (bytes read + written) on this many threads.
    Copy {
        /// Threads.
        threads: usize,
        /// Bytes read + written per call.
        working_set: usize,
    },
}

/// A peak a measurement is compared with: its value and what it is.
#[derive(Clone, Copy, Debug)]
pub struct Peak {
    /// GFLOP/s or GB/s.
    pub value: f64,
    /// Short description for the tables, e.g. "FMA peak, 2 threads".
    pub what: &'static str,
}

impl Machine {
    /// Measures the figures for every thread count in `threads` (progress through `log`).
    /// `cores` is the number of cores the process may use (counted before pinning narrows the
    /// main thread to one).
    pub fn measure(
        threads: &[usize],
        cores: usize,
        pinned: bool,
        quick: bool,
        mut log: impl FnMut(&str),
    ) -> Machine {
        let budget = if quick { Budget::QUICK } else { Budget::DEFAULT };
        let probe = Probe::best();
        let rounds = if quick { FMA_ROUNDS / 8 } else { FMA_ROUNDS };
        let dram = if quick { COPY_DRAM_BYTES / 2 } else { COPY_DRAM_BYTES };
        let mut m = Machine {
            cpu: cpu_model(),
            cores,
            isa: attn_kernels::arch::selected(),
            probe,
            pinned,
            dram_bytes: dram,
            fma_gflops: Vec::new(),
            copy_dram_gbs: Vec::new(),
            copy_l3_gbs: Vec::new(),
            copy_l2_gbs: Vec::new(),
        };
        for &t in threads {
            let g = fma_peak(probe, rounds, t, &budget);
            log(&format!("machine: FMA peak, {t} thread(s): {g:.1} GFLOP/s ({})", probe.name()));
            m.fma_gflops.push((t, g));
        }
        for &t in threads {
            let d = copy_bandwidth(dram, t, &budget);
            let l3 = copy_bandwidth(COPY_L3_BYTES, t, &budget);
            let l2 = copy_bandwidth(COPY_L2_BYTES * t, t, &budget);
            log(&format!(
                "machine: copy bandwidth, {t} thread(s): {d:.1} GB/s out of cache, {l3:.1} GB/s in L3, {l2:.1} GB/s in L2"
            ));
            m.copy_dram_gbs.push((t, d));
            m.copy_l3_gbs.push((t, l3));
            m.copy_l2_gbs.push((t, l2));
        }
        m
    }

    /// Measures the figures again (with a short budget) and keeps, for each, the best of the
    /// old and new value: a peak is what the machine can do, and on a shared machine one probe
    /// may land in a busy moment.
    pub fn refresh(&mut self, threads: &[usize], mut log: impl FnMut(&str)) {
        let again = Machine::measure(threads, self.cores, self.pinned, true, |_| {});
        let best = |old: &mut Vec<(usize, f64)>, new: &[(usize, f64)]| {
            for (o, n) in old.iter_mut().zip(new) {
                o.1 = o.1.max(n.1);
            }
        };
        best(&mut self.fma_gflops, &again.fma_gflops);
        best(&mut self.copy_dram_gbs, &again.copy_dram_gbs);
        best(&mut self.copy_l3_gbs, &again.copy_l3_gbs);
        best(&mut self.copy_l2_gbs, &again.copy_l2_gbs);
        let fma: Vec<String> =
            self.fma_gflops.iter().map(|(t, g)| format!("{g:.1} ({t}t)")).collect();
        log(&format!("machine: re-probed; best FMA peak so far {} GFLOP/s", fma.join(", ")));
    }

    /// The figure `r` refers to.
    pub fn peak(&self, r: PeakRef) -> Peak {
        match r {
            PeakRef::Fma { threads } => self.fma_peak(threads),
            PeakRef::Copy { threads, working_set } => self.copy_peak(threads, working_set),
        }
    }

    /// The FMA peak for `threads` threads.
    pub fn fma_peak(&self, threads: usize) -> Peak {
        Peak { value: lookup(&self.fma_gflops, threads), what: "FMA peak" }
    }

    /// The copy bandwidth a kernel moving `working_set` bytes (read + written) on `threads`
    /// threads is compared with: the figure of the cache level its working set fits in.
    pub fn copy_peak(&self, threads: usize, working_set: usize) -> Peak {
        if working_set <= L2_WORKING_SET * threads {
            Peak { value: lookup(&self.copy_l2_gbs, threads), what: "L2 copy bw" }
        } else if working_set <= L3_WORKING_SET {
            Peak { value: lookup(&self.copy_l3_gbs, threads), what: "L3 copy bw" }
        } else {
            Peak { value: lookup(&self.copy_dram_gbs, threads), what: "DRAM copy bw" }
        }
    }
}

fn lookup(v: &[(usize, f64)], threads: usize) -> f64 {
    v.iter().find(|(t, _)| *t == threads).map_or(f64::NAN, |&(_, g)| g)
}

/// GFLOP/s of `threads` copies of the probe running at once, each pinned to its core.
fn fma_peak(probe: Probe, rounds: u64, threads: usize, budget: &Budget) -> f64 {
    let flops = probe.flops_per_round() * rounds as f64 * threads as f64;
    let stats = if threads == 1 {
        measure(budget, || probe.run(rounds, 1e-3))
    } else {
        Parallelism::threads(threads)
            .install(|| measure(budget, || rayon::broadcast(|_| probe.run(rounds, 1e-3))))
    };
    flops / stats.min_s / 1e9
}

/// GB/s (bytes read + written) of copying a `bytes`-byte buffer into another, split evenly over
/// `threads` threads, from a buffer at [`SOURCE_PHASE`] into one at [`DESTINATION_PHASE`].
fn copy_bandwidth(bytes: usize, threads: usize, budget: &Budget) -> f64 {
    let n = bytes / 4;
    let mut src = Placed::at(n, SOURCE_PHASE);
    for (i, x) in src.get_mut().iter_mut().enumerate() {
        *x = i as f32;
    }
    let src = src.get();
    let mut dst = Placed::at(n, DESTINATION_PHASE);
    let dst = dst.get_mut();
    let chunk = n.div_ceil(threads.max(1)).max(1);
    let stats = Parallelism::threads(threads).install(|| {
        measure(budget, || {
            if threads == 1 {
                dst.copy_from_slice(black_box(src));
            } else {
                dst.par_chunks_mut(chunk)
                    .zip(src.par_chunks(chunk))
                    .for_each(|(d, s)| d.copy_from_slice(s));
            }
            black_box(dst[n / 2])
        })
    });
    2.0 * (n * 4) as f64 / stats.min_s / 1e9
}

const PAGE_BYTES: usize = 4096;
const PAGE_FLOATS: usize = PAGE_BYTES / 4;

/// Where in a 4 KiB page the copy's source starts, and the input of kernels compared with it.
pub const SOURCE_PHASE: usize = 0;
/// Where in a page the copy's destination starts, and the output of kernels compared with it:
/// half a page from the source. When `dst − src` is a small multiple of 4 KiB plus a few
/// bytes, loads falsely depend on earlier stores (4K aliasing) and a copy runs an order of
/// magnitude slower, which would make the "peak" depend on where the allocator happened to
/// put the buffers.
pub const DESTINATION_PHASE: usize = PAGE_BYTES / 2;

/// A zeroed buffer of `n` floats placed at a chosen byte offset into a 4 KiB page: the copy
/// bandwidth's source and destination ([`SOURCE_PHASE`], [`DESTINATION_PHASE`]), and the
/// buffers of kernels compared with it, so that both run on buffers placed alike.
pub struct Placed {
    buf: Vec<f32>,
    skip: usize,
    n: usize,
}

impl Placed {
    /// `n` floats starting `phase` bytes into a page (`phase` a multiple of 4, below 4096).
    pub fn at(n: usize, phase: usize) -> Self {
        assert!(
            phase.is_multiple_of(4) && phase < PAGE_BYTES,
            "phase {phase}: a float offset in a page"
        );
        let buf = vec![0.0f32; n + PAGE_FLOATS];
        let addr = buf.as_ptr() as usize;
        let skip = (phase + PAGE_BYTES - addr % PAGE_BYTES) % PAGE_BYTES / 4;
        Placed { buf, skip, n }
    }

    /// The buffer.
    pub fn get(&self) -> &[f32] {
        &self.buf[self.skip..self.skip + self.n]
    }

    /// The buffer, writable.
    pub fn get_mut(&mut self) -> &mut [f32] {
        &mut self.buf[self.skip..self.skip + self.n]
    }
}

/// The CPU model from `/proc/cpuinfo`, or "unknown".
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}
