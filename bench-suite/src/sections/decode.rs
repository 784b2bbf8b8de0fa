//! Decode: one query per head against a long KV cache (generation), 32 query heads × 4096 keys ×
//! d = 128, with 32 K/V heads (multi-head) and 8 (GQA). Bandwidth-bound: every K and V element is
//! read once per call for a few FLOPs, so the figure is GB/s of K/V.
//!
//! Its roof is measured in the same run over the same bytes: `stream-sum` reads the very K and
//! V buffers of the case once (a plain vectorisable sum, nothing else), on the same thread count.
//! Whether those bytes come from DRAM or partly from L3 depends on the case (K + V are 128 MiB
//! with 32 K/V heads, 32 MiB with 8 — the size of this machine's L3), and the stream-sum row
//! shows which: `attn-kernels / stream-sum` is the fraction of the attainable read bandwidth.
//!
//! Then both cases with K and V stored sequence-major (`mask` "bshd": `[seq, kv_heads, d]`, the
//! layout of an engine's cache, where one head's rows lie `kv_heads·d` floats apart),
//! alternating with the same values head-major (`head-major` in the ratios).
//!
//! Last, the GQA case with the standard ALiBi slopes (`mask` "alibi"), alternating with plain
//! decode on the same operands (`plain` in the ratios): its scores spread over hundreds, so
//! many weights fall below `e^(−64)`, where their products with the values would be subnormal
//! if they were not flushed to 0 (a subnormal costs a microcode assist in each multiply-add
//! it feeds; `attn_kernels::attention::FLUSH_WEIGHTS_BELOW`).

use std::hint::black_box;

use attn_kernels::attention::Path;
use attn_kernels::{alibi_slopes, Parallelism, Variants};
use rayon::prelude::*;

use super::attention::{check_all, Problem, IMPLS};
use super::{Call, Ctx, Work};
use crate::record::Shape;

const OP: &str = "decode";

/// Floats summed per independent accumulator lane group: 32 accumulators are enough for the
/// compiler to keep the loads, not the add latency, the limit at any vector width.
const SUM_LANES: usize = 32;

fn shape(heads: usize, kv_heads: usize, nk: usize, d: usize) -> Shape {
    shape_masked(heads, kv_heads, nk, d, "none")
}

/// [`shape`] with a mask label ("bshd": K/V sequence-major, see [`Problem::new`]).
fn shape_masked(heads: usize, kv_heads: usize, nk: usize, d: usize, mask: &'static str) -> Shape {
    Shape::Attn { batch: 1, heads, kv_heads, nq: 1, nk, dk: d, dv: d, mask }
}

/// Sum of `x` with [`SUM_LANES`] independent accumulators (vectorised by the compiler).
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; SUM_LANES];
    let chunks = x.chunks_exact(SUM_LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The roofline probe: reads every float of `bufs` once, split evenly over `threads` threads
/// (the same pinned pools the kernels run in). Also the `dtypes` section's read roof.
pub(super) fn stream_sum(bufs: &[&[f32]], threads: usize) -> f32 {
    if threads <= 1 {
        return bufs.iter().map(|b| sum(b)).sum();
    }
    Parallelism::threads(threads).install(|| {
        bufs.iter()
            .map(|b| b.par_chunks(b.len().div_ceil(threads).max(1)).map(sum).sum::<f32>())
            .sum()
    })
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    // Odd key count, GQA group of 4, and two queries with the bottom-right causal mask (the
    // second token of a speculative step sees one key more than the first).
    let checks = [
        shape(8, 2, 301, 64),
        shape_masked(8, 2, 301, 64, "bshd"),
        Shape::Attn {
            batch: 1,
            heads: 4,
            kv_heads: 4,
            nq: 2,
            nk: 257,
            dk: 128,
            dv: 128,
            mask: "causal",
        },
    ];
    check_all(ctx, OP, &checks);
    let (heads, nk, d) = if ctx.quick { (8, 512, 64) } else { (32, 4096, 128) };
    for kv_heads in [heads, heads / 4] {
        let p = Problem::new(shape(heads, kv_heads, nk, d), (kv_heads * nk) as u64);
        let mut o = vec![0.0f32; p.out_len()];
        let work = Work::Bytes(p.kv_bytes());
        let (k, v) = p.kv();
        for &t in &ctx.threads.clone() {
            for imp in IMPLS {
                if t > 1 && !imp.threaded {
                    continue;
                }
                ctx.bench(OP, imp.name, p.shape.clone(), t, work, None, || p.run(imp, &mut o, t));
            }
            ctx.bench(OP, "stream-sum", p.shape.clone(), t, work, None, || {
                black_box(stream_sum(&[k, v], t));
                Ok::<(), std::convert::Infallible>(())
            });
        }
    }
    // K/V stored sequence-major, `[seq, kv_heads, d]` as an engine's cache holds them (each
    // head's rows `kv_heads·d` floats apart), against the same values head-major.
    for kv_heads in [heads, heads / 4] {
        let sh = shape_masked(heads, kv_heads, nk, d, "bshd");
        let seq_major = Problem::new(sh.clone(), (kv_heads * nk) as u64);
        let p = Problem::new(shape(heads, kv_heads, nk, d), (kv_heads * nk) as u64);
        let work = Work::Bytes(p.kv_bytes());
        let (mut o1, mut o2) = (vec![0.0f32; p.out_len()], vec![0.0f32; p.out_len()]);
        for &t in &ctx.threads.clone() {
            let mut ours = || {
                seq_major
                    .run_variants(&Variants::NONE, Path::Decode, &mut o1, t)
                    .map_err(|e| e.to_string())
            };
            let mut head_major = || {
                p.run_variants(&Variants::NONE, Path::Decode, &mut o2, t).map_err(|e| e.to_string())
            };
            let imps: &mut [(&'static str, Call<'_>)] =
                &mut [("attn-kernels", &mut ours), ("head-major", &mut head_major)];
            ctx.bench_alternating(OP, sh.clone(), t, work, None, imps);
        }
    }
    // Spread scores: ALiBi over the whole cache, against plain decode on the same operands.
    let kv_heads = heads / 4;
    let sh = Shape::Attn { batch: 1, heads, kv_heads, nq: 1, nk, dk: d, dv: d, mask: "alibi" };
    let p = Problem::new(sh.clone(), (kv_heads * nk) as u64);
    let slopes = alibi_slopes(heads);
    let var = Variants::NONE.alibi(&slopes);
    let work = Work::Bytes(p.kv_bytes());
    let (mut o1, mut o2) = (vec![0.0f32; p.out_len()], vec![0.0f32; p.out_len()]);
    for &t in &ctx.threads.clone() {
        let mut ours = || p.run_variants(&var, Path::Decode, &mut o1, t).map_err(|e| e.to_string());
        let mut plain =
            || p.run_variants(&Variants::NONE, Path::Decode, &mut o2, t).map_err(|e| e.to_string());
        let imps: &mut [(&'static str, Call<'_>)] =
            &mut [("attn-kernels", &mut ours), ("plain", &mut plain)];
        ctx.bench_alternating(OP, sh.clone(), t, work, None, imps);
    }
}
