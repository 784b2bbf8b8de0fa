//! Transformer layers: the seed's multi-head self-attention (Q/K/V projections with bias, the
//! heads, the output projection with bias) and the post-norm encoder block (that attention,
//! residual, layer norm, two-layer ReLU feed-forward of width 4·d, residual, layer norm), batch
//! 1, d_model 512, 8 heads, N = 128–1024 tokens, no mask.
//!
//! Implementations: ours (`attn_kernels::layers`, the Q/K/V weights stored as one `[d, 3d]`
//! buffer as engines store them, so the three projections run as one GEMM, and the heads on
//! the flash kernel); ours with the same weights and input rounded to bf16 and a bf16 output
//! (`attn-kernels-bf16`: widened in the GEMMs' packing, the workspace f32); the unfused composition of our public kernels (three `linear` GEMMs,
//! the unfused attention path, the output `linear`; the encoder adds the same residuals,
//! `layer_norm` and `feed_forward_in`), so the ratio shows what the fused projection and the flash kernel
//! buy inside a layer; the reference at the smallest N.
//!
//! FLOPs: a projection with bias, `[n, k]·[k, m] + b`, is exactly k multiplies and k adds per
//! output (k − 1 adds between the products, one for the bias): 2·n·k·m. Attention counts
//! 2·(d_k + d_v) per visible (query, key) pair and head, the attention section's convention.
//! So, with `rows = batch·n`,
//!
//! `mha = 2·rows·d·(q_w + k_w + v_w) + 2·rows·o_w·d + 2·(d_k + d_v)·pairs·heads·batch`,
//! `encoder = mha + 2·rows·d·ff + 2·rows·ff·d`,
//!
//! (q_w = heads·d_k, k_w = kv_heads·d_k, v_w = kv_heads·d_v, o_w = heads·d_v; pairs = n² without
//! a mask). Residual adds, layer norms, the ReLU, the scale and the softmax's exp are not
//! counted: O(rows·d) and O(n²·heads) against the O(rows·d²) and O(n²·d) counted.
//!
//! Last, the attention layer at N = 4096 with the causal mask, and with Mistral's sliding
//! window of 1024 keys on top (mask "causal+window1024", the layer's `MhaWeights::variants`):
//! pairs are then the visible ones only, `Σ_i min(i + 1, w)`, so the two rates compare
//! directly (ours and the unfused composition, which runs the same variants).

use attn_kernels::attention::{Attention, Path};
use attn_kernels::layers::{self, EncoderConfig, MhaConfig};
use attn_kernels::{bf16, Parallelism};
use attn_reference::{
    Activation, EncoderWeights, FeedForwardWeights, LayerNormWeights, Mask, MatLayout, MatRef,
    MhaWeights, Result, Tensor4Layout, TensorMut, TensorRef, Variants,
};

use super::{attention, Ctx, Work};
use crate::check::{attention_staged, compare, mat, mat_mut, Rng, Staged};
use crate::record::Shape;

const OP: &str = "layers";
/// Layer-norm epsilon (PyTorch's default).
const EPS: f32 = 1e-5;

/// One implementation: `y = layer(x)` on `threads` threads, with buffers reused across calls.
struct Impl {
    name: &'static str,
    /// False: measured at one thread only.
    threaded: bool,
    call: fn(&Problem, &mut Scratch, &mut [f32], usize) -> Result<()>,
}

/// Ours, ours with bf16 weights and activations, the unfused composition, the reference.
const IMPLS: &[Impl] = &[
    Impl { name: "attn-kernels", threaded: true, call: |p, s, y, t| p.ours(s, y, t) },
    Impl { name: "attn-kernels-bf16", threaded: true, call: |p, s, y, t| p.ours_bf16(s, y, t) },
    Impl { name: "unfused", threaded: true, call: |p, s, y, t| p.unfused(s, y, t) },
    Impl { name: "reference", threaded: false, call: |p, _, y, _| p.reference(y) },
];

/// A layer's owned weights in one element type.
struct Weights<T> {
    /// `[d, q_w + k_w + v_w]`: Wq | Wk | Wv as adjacent column blocks.
    wqkv: Vec<T>,
    /// bq | bk | bv.
    bqkv: Vec<T>,
    wo: Vec<T>,
    bo: Vec<T>,
    /// γ₁, β₁, γ₂, β₂ (empty for "mha").
    norms: [Vec<T>; 4],
    /// W1 `[d, ff]`, b1, W2 `[ff, d]`, b2 (empty for "mha").
    ff: [Vec<T>; 4],
}

impl<T: Copy> Weights<T> {
    /// Every weight mapped by `f` (rounded to bf16, or widened back).
    fn map<U>(&self, f: impl Fn(T) -> U + Copy) -> Weights<U> {
        let m = |v: &Vec<T>| v.iter().map(|&x| f(x)).collect::<Vec<_>>();
        Weights {
            wqkv: m(&self.wqkv),
            bqkv: m(&self.bqkv),
            wo: m(&self.wo),
            bo: m(&self.bo),
            norms: self.norms.each_ref().map(m),
            ff: self.ff.each_ref().map(m),
        }
    }
}

/// One layer problem: its shape, owned weights and input `x: [batch·n, d]` in bf16 (`wb`, `xb`,
/// for the bf16 row) and as their exact f32 values (`w`, `x`, for every other row).
struct Problem {
    shape: Shape,
    cfg: EncoderConfig,
    encoder: bool,
    batch: usize,
    n: usize,
    w: Weights<f32>,
    wb: Weights<bf16>,
    x: Vec<f32>,
    xb: Vec<bf16>,
    mask: Mask<'static>,
    /// Keys a query sees under a sliding window (Mistral's `w`: itself and `w − 1` before), from
    /// a mask named "causal+window{w}"; `None` for none.
    window: Option<usize>,
}

impl Problem {
    /// Random weights uniform in ±1/√fan_in (so activations stay O(1)), biases in ±0.5, norm
    /// γ in 1 ± 0.25 and β in ±0.25, input in [−1, 1); the shape must be [`Shape::Layer`].
    fn new(shape: Shape, seed: u64) -> Result<Problem> {
        let Shape::Layer { layer, batch, n, d_model: d, heads, kv_heads, ff, mask } = shape else {
            unreachable!("layer problems have layer shapes")
        };
        let attn = MhaConfig::from_embed_dim(d, heads)?.with_kv_heads(kv_heads);
        let cfg = EncoderConfig { attn, ff_dim: ff, activation: Activation::Relu, eps: EPS };
        cfg.check()?;
        let mut rng = Rng::new(seed);
        let mut uniform = |len: usize, scale: f32, centre: f32| -> Vec<f32> {
            rng.vec(len).into_iter().map(|v| centre + scale * v).collect()
        };
        let fan_in = |k: usize| 1.0 / (k.max(1) as f32).sqrt();
        let wid = attn.q_width() + attn.k_width() + attn.v_width();
        let encoder = layer == "encoder";
        let ffw = if encoder { ff } else { 0 };
        let dn = if encoder { d } else { 0 };
        let w32 = Weights {
            wqkv: uniform(d * wid, fan_in(d), 0.0),
            bqkv: uniform(wid, 0.5, 0.0),
            wo: uniform(attn.o_width() * d, fan_in(attn.o_width()), 0.0),
            bo: uniform(d, 0.5, 0.0),
            norms: [
                uniform(dn, 0.25, 1.0),
                uniform(dn, 0.25, 0.0),
                uniform(dn, 0.25, 1.0),
                uniform(dn, 0.25, 0.0),
            ],
            ff: [
                uniform(d * ffw, fan_in(d), 0.0),
                uniform(ffw, 0.5, 0.0),
                uniform(ffw * d, fan_in(ffw), 0.0),
                uniform(dn, 0.5, 0.0),
            ],
        };
        // Rounded to bf16, so that the f32 and the bf16 rows compute on the same values (which
        // the f32 row holds exactly), and the bf16 row is checked against the same reference.
        let wb = w32.map(bf16::from_f32);
        let xb: Vec<bf16> =
            uniform(batch * n * d, 1.0, 0.0).into_iter().map(bf16::from_f32).collect();
        Ok(Problem {
            w: wb.map(|x| x.to_f32()),
            x: xb.iter().map(|v| v.to_f32()).collect(),
            wb,
            xb,
            mask: if mask.starts_with("causal") {
                Mask::Causal { offset: None }
            } else {
                Mask::None
            },
            window: mask.strip_prefix("causal+window").and_then(|w| w.parse().ok()),
            cfg,
            encoder,
            batch,
            n,
            shape,
        })
    }

    /// `[batch, 1, n, d]` over a contiguous `[batch·n, d]` buffer.
    fn seq(&self) -> Tensor4Layout {
        Tensor4Layout::batch_seq(self.batch, self.n, self.cfg.attn.in_dim)
    }

    fn rows(&self) -> usize {
        self.batch * self.n
    }

    /// The f32 attention weights.
    fn mha_weights(&self) -> MhaWeights<'_> {
        self.mha_view(&self.w)
    }

    /// The attention weights `w`: Q, K, V are column blocks of `wqkv`.
    fn mha_view<'a, T: Copy>(&self, w: &'a Weights<T>) -> MhaWeights<'a, T> {
        let c = &self.cfg.attn;
        let (d, qw, kw, vw) = (c.in_dim, c.q_width(), c.k_width(), c.v_width());
        let block = |col: usize, cols: usize| {
            MatRef::new(&w.wqkv, MatLayout::strided(d, cols, qw + kw + vw, 1, col))
        };
        MhaWeights {
            wq: block(0, qw),
            wk: block(qw, kw),
            wv: block(qw + kw, vw),
            wo: MatRef::row_major(&w.wo, c.o_width(), d),
            bq: Some(&w.bqkv[..qw]),
            bk: Some(&w.bqkv[qw..qw + kw]),
            bv: Some(&w.bqkv[qw + kw..]),
            bo: Some(&w.bo),
            variants: match self.window {
                Some(w) => Variants::NONE.window(w.saturating_sub(1), 0),
                None => Variants::NONE,
            },
        }
    }

    fn encoder_weights(&self) -> EncoderWeights<'_> {
        self.encoder_view(&self.w)
    }

    fn encoder_view<'a, T: Copy>(&self, w: &'a Weights<T>) -> EncoderWeights<'a, T> {
        let (d, ff) = (self.cfg.attn.in_dim, self.cfg.ff_dim);
        let [g1, b1, g2, b2] = &w.norms;
        EncoderWeights {
            attn: self.mha_view(w),
            norm1: LayerNormWeights { gamma: g1, beta: b1 },
            ff: FeedForwardWeights {
                w1: MatRef::row_major(&w.ff[0], d, ff),
                b1: Some(&w.ff[1]),
                w2: MatRef::row_major(&w.ff[2], ff, d),
                b2: Some(&w.ff[3]),
            },
            norm2: LayerNormWeights { gamma: g2, beta: b2 },
        }
    }

    /// FLOPs of one call (see the module docs).
    fn flops(&self) -> f64 {
        let c = &self.cfg.attn;
        let (rows, d) = (self.rows() as f64, c.in_dim as f64);
        let qkv = (c.q_width() + c.k_width() + c.v_width()) as f64;
        let proj = 2.0 * rows * d * qkv + 2.0 * rows * c.o_width() as f64 * d;
        let heads = self.batch * c.num_heads;
        let attn = match self.window {
            // Causal (offset 0) within the window: query i sees min(i + 1, w) keys.
            Some(w) => {
                let pairs: usize = (0..self.n).map(|i| (i + 1).min(w)).sum();
                (pairs * heads) as f64 * 2.0 * (c.k_dim + c.v_dim) as f64
            }
            None => attention::flops(heads, self.n, self.n, c.k_dim, c.v_dim, &self.mask),
        };
        let ff = if self.encoder { 4.0 * rows * d * self.cfg.ff_dim as f64 } else { 0.0 };
        proj + attn + ff
    }

    /// Ours: the layer's no-allocation form, on the workspace in `s`.
    fn ours(&self, s: &mut Scratch, y: &mut [f32], threads: usize) -> Result<()> {
        let par = Parallelism::threads(threads);
        let (x, y) = (TensorRef::new(&self.x, self.seq()), TensorMut::new(y, self.seq()));
        if self.encoder {
            let w = self.encoder_weights();
            layers::encoder_block_in(&self.cfg, &w, x, &self.mask, y, &mut s.ws, par)
        } else {
            let w = self.mha_weights();
            layers::multi_head_attention_in(&self.cfg.attn, &w, x, &self.mask, y, &mut s.ws, par)
        }
    }

    /// Ours with bf16 weights and activations (`wb`, `xb`): the output is rounded to bf16
    /// into `s.yb`, then widened into `y` (one pass over the output, inside the timing: under
    /// 1 % of a layer at the report's sizes).
    fn ours_bf16(&self, s: &mut Scratch, y: &mut [f32], threads: usize) -> Result<()> {
        let par = Parallelism::threads(threads);
        let x = TensorRef::new(&self.xb, self.seq());
        let yb = TensorMut::new(&mut s.yb, self.seq());
        if self.encoder {
            let w = self.encoder_view(&self.wb);
            layers::encoder_block_in(&self.cfg, &w, x, &self.mask, yb, &mut s.ws, par)?;
        } else {
            let w = self.mha_view(&self.wb);
            layers::multi_head_attention_in(&self.cfg.attn, &w, x, &self.mask, yb, &mut s.ws, par)?;
        }
        y.iter_mut().zip(&s.yb).for_each(|(y, b)| *y = b.to_f32());
        Ok(())
    }

    /// The unfused composition of our public kernels (see the module docs).
    fn unfused(&self, s: &mut Scratch, y: &mut [f32], threads: usize) -> Result<()> {
        let par = Parallelism::threads(threads);
        if !self.encoder {
            return self.unfused_mha(&mut s.qkvo, y, par);
        }
        let (rows, d) = (self.rows(), self.cfg.attn.in_dim);
        let w = self.encoder_weights();
        let Scratch { ws, qkvo, a, h, .. } = s;
        self.unfused_mha(qkvo, a, par)?;
        a.iter_mut().zip(&self.x).for_each(|(a, x)| *a += x);
        layers::layer_norm(mat(a, rows, d, false), &w.norm1, EPS, mat_mut(h, rows, d))?;
        let f = mat_mut(a, rows, d);
        layers::feed_forward_in(mat(h, rows, d, false), &w.ff, Activation::Relu, f, ws, par)?;
        a.iter_mut().zip(h.iter()).for_each(|(a, h)| *a += h);
        layers::layer_norm(mat(a, rows, d, false), &w.norm2, EPS, mat_mut(y, rows, d))
    }

    /// Three projections into separate buffers, the unfused attention path over their heads,
    /// the output projection.
    fn unfused_mha(
        &self,
        [q, k, v, o]: &mut [Vec<f32>; 4],
        y: &mut [f32],
        par: Parallelism,
    ) -> Result<()> {
        let c = &self.cfg.attn;
        let (b, n, rows) = (self.batch, self.n, self.rows());
        let w = self.mha_weights();
        let x = mat(&self.x, rows, c.in_dim, false);
        for (buf, wm, bias) in [(&mut *q, w.wq, w.bq), (&mut *k, w.wk, w.bk), (&mut *v, w.wv, w.bv)]
        {
            layers::linear(x, wm, bias, mat_mut(buf, rows, wm.layout.cols), par)?;
        }
        let split = |h, dim| Tensor4Layout::bshd(b, n, h, dim);
        Attention::new(
            TensorRef::new(q, split(c.num_heads, c.k_dim)),
            TensorRef::new(k, split(c.kv_heads, c.k_dim)),
            TensorRef::new(v, split(c.kv_heads, c.v_dim)),
        )
        .scale(c.scale())
        .mask(self.mask)
        .variants(w.variants)
        .parallelism(par)
        .path(Path::Unfused)
        .run(TensorMut::new(o, split(c.num_heads, c.v_dim)))?;
        let out = mat_mut(y, rows, c.in_dim);
        layers::linear(mat(o, rows, c.o_width(), false), w.wo, w.bo, out, par)
    }

    /// The reference's module.
    fn reference(&self, y: &mut [f32]) -> Result<()> {
        let (x, y) = (TensorRef::new(&self.x, self.seq()), TensorMut::new(y, self.seq()));
        if self.encoder {
            attn_reference::encoder_block(&self.cfg, &self.encoder_weights(), x, &self.mask, y)
        } else {
            let w = self.mha_weights();
            attn_reference::multi_head_attention(&self.cfg.attn, &w, x, &self.mask, y)
        }
    }

    /// The reference's result stage by stage, with the bound of an f32 implementation of the
    /// same stages (see [`Staged`]).
    fn staged(&self) -> Result<Staged> {
        let c = &self.cfg.attn;
        let x = Staged::exact(self.x.clone(), self.rows(), c.in_dim);
        let w = self.mha_weights();
        let (q, k, v) = (x.linear(w.wq, w.bq)?, x.linear(w.wk, w.bk)?, x.linear(w.wv, w.bv)?);
        let (h, hkv) = (c.num_heads, c.kv_heads);
        let o = attention_staged(&q, &k, &v, self.batch, h, hkv, c.scale(), &self.mask)?;
        let a = o.linear(w.wo, w.bo)?;
        if !self.encoder {
            return Ok(a);
        }
        let e = self.encoder_weights();
        let h = x.add(&a).layer_norm(&e.norm1, EPS)?;
        let f = h.linear(e.ff.w1, e.ff.b1)?.relu().linear(e.ff.w2, e.ff.b2)?;
        f.add(&h).layer_norm(&e.norm2, EPS)
    }
}

/// Buffers an implementation reuses across calls, allocated once per problem as an engine
/// would: the layers' workspace (ours; the hidden layer of the unfused encoder's feed-forward)
/// and the unfused path's activations (Q, K, V, the heads; the encoder's A and H).
struct Scratch {
    ws: Vec<f32>,
    /// The bf16 row's output.
    yb: Vec<bf16>,
    qkvo: [Vec<f32>; 4],
    a: Vec<f32>,
    h: Vec<f32>,
}

impl Scratch {
    fn new(p: &Problem) -> Scratch {
        let c = &p.cfg.attn;
        let rows = p.rows();
        let ws = if p.encoder {
            layers::encoder_workspace_len(&p.cfg, p.batch, p.n)
        } else {
            layers::mha_workspace_len(c, p.batch, p.n, p.n)
        };
        let widths = [c.q_width(), c.k_width(), c.v_width(), c.o_width()];
        let act = if p.encoder { rows * c.in_dim } else { 0 };
        Scratch {
            ws: vec![0.0; ws],
            yb: vec![bf16::ZERO; p.x.len()],
            qkvo: widths.map(|w| vec![0.0; rows * w]),
            a: vec![0.0; act],
            h: vec![0.0; act],
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn layer_shape(
    layer: &'static str,
    batch: usize,
    n: usize,
    d_model: usize,
    heads: usize,
    kv_heads: usize,
    ff: usize,
    mask: &'static str,
) -> Shape {
    Shape::Layer { layer, batch, n, d_model, heads, kv_heads, ff, mask }
}

/// Checks ours and the unfused composition against the reference's modules, at each thread
/// count, with the stage-by-stage bound of [`Problem::staged`].
fn checks(ctx: &mut Ctx) {
    // Odd token counts, batch 2, GQA with the causal mask, d_k = 12 (not a vector width), and an
    // encoder whose feed-forward width is not a multiple of any tile.
    let cases = [
        layer_shape("mha", 2, 37, 48, 4, 2, 0, "causal"),
        layer_shape("mha", 1, 33, 64, 8, 8, 0, "none"),
        layer_shape("encoder", 2, 29, 64, 4, 4, 96, "none"),
    ];
    for (i, shape) in cases.into_iter().enumerate() {
        let setup = Problem::new(shape.clone(), 0x1a7e + i as u64).and_then(|p| {
            let mut want = vec![0.0; p.rows() * p.cfg.attn.in_dim];
            p.reference(&mut want)?;
            let staged = p.staged()?;
            Ok((p, want, staged))
        });
        let (p, want, staged) = match setup {
            Ok(s) => s,
            Err(e) => {
                ctx.check(OP, "reference", shape, 1, Err(e.to_string()));
                continue;
            }
        };
        if staged.val != want {
            let e = "the stage-by-stage reference differs from the reference's module";
            ctx.check(OP, "reference", shape, 1, Err(e.to_string()));
            continue;
        }
        let mut s = Scratch::new(&p);
        // The bf16 row's output is the f32 result rounded once to bf16 (the weights and input
        // are bf16 values for every row): the bound plus half an ULP of bf16 relative, and half
        // its smallest subnormal.
        let bf16_err: Vec<f64> = staged
            .err
            .iter()
            .zip(&want)
            .map(|(&e, &w)| e + (f64::from(w).abs() + e) / 256.0 + 2f64.powi(-134))
            .collect();
        for imp in IMPLS.iter().filter(|i| i.name != "reference") {
            let err = if imp.name == "attn-kernels-bf16" { &bf16_err } else { &staged.err };
            for &t in ctx.threads.clone().iter().filter(|&&t| t == 1 || imp.threaded) {
                let mut got = vec![f32::NAN; want.len()];
                let v = (imp.call)(&p, &mut s, &mut got, t)
                    .map(|()| compare(&got, &want, err))
                    .map_err(|e| e.to_string());
                ctx.check(OP, imp.name, shape.clone(), t, v);
            }
        }
    }
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    checks(ctx);
    let (d, heads, sizes): (usize, usize, &[usize]) =
        if ctx.quick { (128, 4, &[64, 128]) } else { (512, 8, &[128, 512, 1024]) };
    for (layer, ff) in [("mha", 0), ("encoder", 4 * d)] {
        for &n in sizes {
            let shape = layer_shape(layer, 1, n, d, heads, heads, ff, "none");
            let Some((p, mut s, mut y)) = setup(ctx, shape, (n * d + ff) as u64) else {
                continue;
            };
            let work = Work::Flops(p.flops());
            for &t in &ctx.threads.clone() {
                for imp in IMPLS {
                    // The reference (f64, naive loops) only at the smallest size: an encoder
                    // layer at N = 128 already takes it about a second.
                    if (t > 1 && !imp.threaded) || (imp.name == "reference" && n != sizes[0]) {
                        continue;
                    }
                    let plot = Some((format!("layers-{layer}"), n as f64));
                    ctx.bench(OP, imp.name, p.shape.clone(), t, work, plot, || {
                        (imp.call)(&p, &mut s, &mut y, t)
                    });
                }
            }
        }
    }
    // A long sequence, causal, without and with a sliding window (see the module docs).
    let (n, window) =
        if ctx.quick { (512, "causal+window128") } else { (4096, "causal+window1024") };
    for mask in ["causal", window] {
        let shape = layer_shape("mha", 1, n, d, heads, heads, 0, mask);
        let Some((p, mut s, mut y)) = setup(ctx, shape, (n * d) as u64) else {
            continue;
        };
        let work = Work::Flops(p.flops());
        for &t in &ctx.threads.clone() {
            for imp in IMPLS.iter().filter(|i| i.name != "reference") {
                ctx.bench(OP, imp.name, p.shape.clone(), t, work, None, || {
                    (imp.call)(&p, &mut s, &mut y, t)
                });
            }
        }
    }
}

/// The problem of a timed layer shape with its scratch and output, or `None` after recording
/// the reason it could not be set up as a failed check.
fn setup(ctx: &mut Ctx, shape: Shape, seed: u64) -> Option<(Problem, Scratch, Vec<f32>)> {
    match Problem::new(shape.clone(), seed) {
        Ok(p) => {
            let (s, y) = (Scratch::new(&p), vec![0.0f32; p.x.len()]);
            Some((p, s, y))
        }
        Err(e) => {
            ctx.check(OP, "attn-kernels", shape, 1, Err(e.to_string()));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's output for `shape` with its mask replaced by `mask` (same weights and
    /// input: same seed).
    fn run_reference(shape: &Shape, mask: &'static str) -> Vec<f32> {
        let Shape::Layer { layer, batch, n, d_model, heads, kv_heads, ff, .. } = *shape else {
            unreachable!()
        };
        let other = layer_shape(layer, batch, n, d_model, heads, kv_heads, ff, mask);
        let p = Problem::new(other, 7).unwrap();
        let mut y = vec![0.0; p.rows() * d_model];
        p.reference(&mut y).unwrap();
        y
    }

    /// The bound passes the reference itself and fails a plausible bug: the causal mask
    /// dropped (same weights and input), in the attention layer and in the encoder.
    #[test]
    fn layer_bounds_pass_the_reference_and_catch_a_dropped_mask() {
        for layer in ["mha", "encoder"] {
            let ff = if layer == "encoder" { 40 } else { 0 };
            let shape = layer_shape(layer, 2, 19, 32, 4, 2, ff, "causal");
            let p = Problem::new(shape.clone(), 7).unwrap();
            let staged = p.staged().unwrap();
            let want = run_reference(&shape, "causal");
            assert_eq!(staged.val, want, "{layer}: stages reproduce the module");
            assert_eq!(compare(&want, &want, &staged.err).ratio, 0.0);
            let unmasked = run_reference(&shape, "none");
            let v = compare(&unmasked, &want, &staged.err);
            assert!(v.ratio > 1.0, "{layer}: a dropped mask passed ({v:?})");
        }
    }
}
