//! Decode: one query per head against a long KV cache (generation), 32 query heads × 4096 keys ×
//! d = 128, with 32 K/V heads (multi-head) and 8 (GQA). Bandwidth-bound: every K and V element is
//! read once per call for a few FLOPs, so the figure is GB/s of K/V, compared with the
//! out-of-cache copy bandwidth.

use super::attention::{check_all, Problem, IMPLS};
use super::{Ctx, Work};
use crate::record::Shape;

const OP: &str = "decode";

fn shape(heads: usize, kv_heads: usize, nk: usize, d: usize) -> Shape {
    Shape::Attn { batch: 1, heads, kv_heads, nq: 1, nk, dk: d, dv: d, mask: "none" }
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    // Odd key count, GQA group of 4, and two queries with the bottom-right causal mask (the
    // second token of a speculative step sees one key more than the first).
    let checks = [
        shape(8, 2, 301, 64),
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
        for &t in &ctx.threads.clone() {
            for imp in IMPLS {
                if t > 1 && !imp.threaded {
                    continue;
                }
                ctx.bench(OP, imp.name, p.shape.clone(), t, work, None, || p.run(imp, &mut o, t));
            }
        }
    }
}
