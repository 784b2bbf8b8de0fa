//! Packed variable-length batches: prefill of a fixed mix of sequence lengths (64..4096, 8
//! heads, d = 64, causal) through `VarlenAttention`, beside the same batch padded to its
//! longest sequence and run as one dense `[batch, max, heads, d]` call (`padded` in the
//! ratios), in alternating calls. Both are in useful GFLOP/s (visible pairs of the real
//! tokens only), so the ratio `padded` is the speed-up; the padded/useful FLOP ratio is
//! logged beside it (target: speed-up ≥ 0.9× that ratio). Right padding with the causal
//! offset 0 hides the padding keys from every real query, so the padded call computes the
//! same rows. Also a batch of many short sequences (16..128 tokens), where the threads share
//! the sequences: its `1 thread` ratio is the parallel speed-up.

use attn_kernels::batch::{packed_seq, VarlenAttention};
use attn_kernels::Parallelism;
use attn_reference::attention::default_scale;
use attn_reference::{Mask, Tensor4Layout, TensorMut, TensorRef};

use super::{Call, Ctx, Work};
use crate::check::{attention_bound, compare, Rng, Verdict};
use crate::record::Shape;

const OP: &str = "batch";

/// The prefill mix (tokens per sequence), and a smaller one for `--quick`.
const MIX: [usize; 8] = [4096, 64, 256, 1024, 128, 2048, 512, 96];
const MIX_QUICK: [usize; 4] = [512, 16, 100, 64];

/// `[total, heads, d]` storage as a packed view.
fn packed(heads: usize, total: usize, d: usize) -> Tensor4Layout {
    Tensor4Layout::strided([1, heads, total, d], [0, d, heads * d, 1], 0)
}

fn cumulative(lens: &[usize]) -> Vec<usize> {
    let mut cu = vec![0];
    for &n in lens {
        cu.push(cu[cu.len() - 1] + n);
    }
    cu
}

/// Visible (query, key) pairs of a causal sequence of `n` tokens.
fn causal_pairs(n: usize) -> f64 {
    (n as f64) * (n as f64 + 1.0) / 2.0
}

/// A packed batch of self-attention sequences (`cu_q = cu_k`), random operands in [−1, 1).
struct Packed {
    lens: Vec<usize>,
    cu: Vec<usize>,
    heads: usize,
    d: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Packed {
    fn new(lens: &[usize], heads: usize, d: usize, seed: u64) -> Packed {
        let cu = cumulative(lens);
        let n = cu[lens.len()] * heads * d;
        let mut rng = Rng::new(seed);
        Packed { lens: lens.to_vec(), heads, d, q: rng.vec(n), k: rng.vec(n), v: rng.vec(n), cu }
    }

    fn total(&self) -> usize {
        self.cu[self.lens.len()]
    }

    fn layout(&self) -> Tensor4Layout {
        packed(self.heads, self.total(), self.d)
    }

    fn useful_flops(&self) -> f64 {
        let pairs: f64 = self.lens.iter().map(|&n| causal_pairs(n)).sum();
        pairs * self.heads as f64 * 4.0 * self.d as f64
    }

    fn padded_flops(&self) -> f64 {
        let max = self.lens.iter().copied().max().unwrap_or(0);
        self.lens.len() as f64 * causal_pairs(max) * self.heads as f64 * 4.0 * self.d as f64
    }

    fn shape(&self) -> Shape {
        Shape::Attn {
            batch: self.lens.len(),
            heads: self.heads,
            kv_heads: self.heads,
            nq: self.total(),
            nk: self.total(),
            dk: self.d,
            dv: self.d,
            mask: "causal varlen",
        }
    }

    fn run(&self, o: &mut [f32], threads: usize) -> attn_kernels::Result<()> {
        let l = self.layout();
        VarlenAttention::new(
            TensorRef::new(&self.q, l),
            TensorRef::new(&self.k, l),
            TensorRef::new(&self.v, l),
            &self.cu,
            &self.cu,
        )
        .mask(Mask::CAUSAL)
        .parallelism(Parallelism::threads(threads))
        .run(TensorMut::new(o, l))
    }
}

/// The same batch padded to its longest sequence, `[batch, max, heads, d]`, padding zero.
struct Padded {
    layout: Tensor4Layout,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Padded {
    fn new(p: &Packed) -> Padded {
        let (b, h, d) = (p.lens.len(), p.heads, p.d);
        let max = p.lens.iter().copied().max().unwrap_or(0);
        let layout = Tensor4Layout::strided([b, h, max, d], [max * h * d, d, h * d, 1], 0);
        // Zeros written, not `vec!`'s calloc: its untouched pages all map the kernel's one zero
        // page, so the padding was read from L1, where an engine's padded batch is real memory
        // (the padded call ran 1.1× faster per sequence; perf journal, 2026-12-06 22:57).
        let pad = |src: &[f32]| {
            let mut x = Vec::with_capacity(b * max * h * d);
            x.resize(b * max * h * d, 0.0f32);
            for s in 0..b {
                let n = p.lens[s] * h * d;
                x[s * max * h * d..][..n].copy_from_slice(&src[p.cu[s] * h * d..][..n]);
            }
            x
        };
        Padded { layout, q: pad(&p.q), k: pad(&p.k), v: pad(&p.v) }
    }

    fn run(&self, o: &mut [f32], threads: usize) -> attn_kernels::Result<()> {
        let l = self.layout;
        attn_kernels::attention::Attention::new(
            TensorRef::new(&self.q, l),
            TensorRef::new(&self.k, l),
            TensorRef::new(&self.v, l),
        )
        .mask(Mask::Causal { offset: Some(0) })
        .parallelism(Parallelism::threads(threads))
        .run(TensorMut::new(o, l))
    }
}

/// Checks varlen against the reference on a small mixed batch (lengths 0, 1, and around the
/// 256-query chunk), per sequence within the attention bound.
fn check(ctx: &mut Ctx) {
    let p = Packed::new(&[37, 0, 1, 300, 5], 4, 32, 0xba7c);
    let sh = Shape::Attn {
        batch: 5,
        heads: 4,
        kv_heads: 4,
        nq: p.total(),
        nk: p.total(),
        dk: 32,
        dv: 32,
        mask: "causal varlen",
    };
    let (l, scale) = (p.layout(), default_scale(p.d));
    let mut want = vec![0.0f32; p.q.len()];
    let abs_v: Vec<f32> = p.v.iter().map(|x| x.abs()).collect();
    let mut bound = vec![0.0f64; p.q.len()];
    let reference = attn_reference::batch::attention_varlen(
        TensorRef::new(&p.q, l),
        TensorRef::new(&p.k, l),
        TensorRef::new(&p.v, l),
        &p.cu,
        &p.cu,
        scale,
        &Mask::CAUSAL,
        &attn_reference::attention::Variants::NONE,
        TensorMut::new(&mut want, l),
        None,
    );
    if let Err(e) = reference {
        ctx.check(OP, "reference", sh, 1, Err(e.to_string()));
        return;
    }
    // Per sequence: the bound of its dense problem, moved to its packed rows.
    for s in 0..p.lens.len() {
        let (n, h, d) = (p.lens[s], p.heads, p.d);
        let ls = packed_seq(&l, p.cu[s]..p.cu[s + 1]);
        let dense = Tensor4Layout::bhsd(1, h, n, d);
        let mut w = vec![0.0f32; h * n * d];
        let (q, k) = (TensorRef::new(&p.q, ls), TensorRef::new(&p.k, ls));
        let r = attn_reference::attention::attention(
            q,
            k,
            TensorRef::new(&abs_v, ls),
            scale,
            &Mask::CAUSAL,
            TensorMut::new(&mut w, dense),
            None,
        );
        if let Err(e) = r {
            ctx.check(OP, "reference", sh, 1, Err(e.to_string()));
            return;
        }
        let b = attention_bound(&q, &k, scale, &TensorRef::new(&w, dense));
        for hh in 0..h {
            for i in 0..n {
                for e in 0..d {
                    bound[ls.index(0, hh, i, e)] = b[dense.index(0, hh, i, e)];
                }
            }
        }
    }
    for &t in &ctx.threads.clone() {
        let mut got = vec![f32::NAN; p.q.len()];
        let verdict: Result<Verdict, String> =
            p.run(&mut got, t).map(|()| compare(&got, &want, &bound)).map_err(|e| e.to_string());
        ctx.check(OP, "attn-kernels", sh.clone(), t, verdict);
    }
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    check(ctx);
    let threads = ctx.threads.clone();
    let (mix, heads): (&[usize], usize) = if ctx.quick { (&MIX_QUICK, 2) } else { (&MIX, 8) };
    let p = Packed::new(mix, heads, 64, 0x7ac4);
    let padded = Padded::new(&p);
    let ratio = p.padded_flops() / p.useful_flops();
    ctx.progress.log(&format!(
        "{OP}: mix {mix:?}: padded/useful FLOPs {ratio:.2} (target: speed-up ≥ {:.2})",
        0.9 * ratio
    ));
    let work = Work::Flops(p.useful_flops());
    let (mut o1, mut o2) = (vec![0.0f32; p.q.len()], vec![0.0f32; padded.q.len()]);
    for &t in &threads {
        let mut ours = || p.run(&mut o1, t).map_err(|e| e.to_string());
        let mut pad = || padded.run(&mut o2, t).map_err(|e| e.to_string());
        let imps: &mut [(&'static str, Call<'_>)] =
            &mut [("attn-kernels", &mut ours), ("padded", &mut pad)];
        ctx.bench_alternating(OP, p.shape(), t, work, None, imps);
    }

    // Many short sequences: the threads share whole sequences.
    let mut rng = Rng::new(0x5407);
    let count = if ctx.quick { 32 } else { 256 };
    let lens: Vec<usize> =
        (0..count).map(|_| 16 + (rng.vec(1)[0].abs() * 112.0) as usize).collect();
    let short = Packed::new(&lens, heads, 64, 0x5408);
    let mut o = vec![0.0f32; short.q.len()];
    for &t in &threads {
        let work = Work::Flops(short.useful_flops());
        ctx.bench(OP, "attn-kernels", short.shape(), t, work, None, || short.run(&mut o, t));
    }
}
