//! Shared by `layers.rs` and `c_abi.rs`: deterministic layer weights, the reference's
//! intermediate activations, and forward error bounds for each layer built from the bounds of
//! its stages.
//!
//! Every bound is first order in `u = 2⁻²⁴`: a stage's bound is the propagation of its inputs'
//! bounds through the stage's exact derivative plus the stage's own rounding error; the kernel
//! and the reference both round each stage's output to f32, so `u·|value|` is added per stage.
//! [`GAMMA`] absorbs the second-order terms and the constant factors of the f32 sums.
#![allow(dead_code)] // some helpers serve only the ignored or C-side cases

use attn_reference::attention::attention_with_variants as ref_attention;
use attn_reference::{
    layer_norm as ref_layer_norm, linear as ref_linear, multi_head_attention as ref_mha,
    Activation, EncoderConfig, EncoderWeights, FeedForwardWeights, LayerNormWeights, Mask,
    MatLayout, MatMut, MatRef, MhaConfig, MhaWeights, Tensor4Layout, TensorMut, TensorRef,
    Variants,
};
use attn_tests::fuzz_decode::VariantSpec;
use attn_tests::numerics::{gelu_tanh_bound, softcap_error};

pub use attn_tests::numerics::{GAMMA, U};

/// A small deterministic generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Gen(u64);

impl Gen {
    /// A generator started at `seed`.
    pub fn new(seed: u64) -> Self {
        Gen(seed)
    }
    /// Uniform in `[-1, 1)`.
    pub fn unit(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32) / (1u64 << 23) as f32 - 1.0
    }
    /// `n` values uniform in `[-scale, scale)`.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}

/// Owned weights of an MHA layer, generated for a config; `fused` stores `wq | wk | wv` as
/// adjacent column blocks of one `[in, q_w + k_w + v_w]` buffer (self-attention only), so the
/// kernel runs the fused QKV GEMM. `var` are the layer's attention variants (none by default).
/// Generated in f32; [`map`](Self::map) makes the same weights in another element type.
#[derive(Clone)]
pub struct MhaParams<T = f32> {
    pub cfg: MhaConfig,
    pub wqkv: Vec<T>,
    pub wq: Vec<T>,
    pub wk: Vec<T>,
    pub wv: Vec<T>,
    pub wo: Vec<T>,
    pub bq: Option<Vec<T>>,
    pub bk: Option<Vec<T>>,
    pub bv: Option<Vec<T>>,
    pub bo: Option<Vec<T>>,
    pub fused: bool,
    pub var: VariantSpec,
}

/// `f` applied to every element of `v`.
fn map_vec<T: Copy, U>(v: &[T], f: impl Fn(T) -> U) -> Vec<U> {
    v.iter().map(|&x| f(x)).collect()
}

impl<T: Copy> MhaParams<T> {
    /// The same layer with every weight and bias mapped by `f` (e.g. rounded to bf16).
    pub fn map<U>(&self, f: impl Fn(T) -> U + Copy) -> MhaParams<U> {
        let opt = |b: &Option<Vec<T>>| b.as_deref().map(|b| map_vec(b, f));
        MhaParams {
            cfg: self.cfg,
            wqkv: map_vec(&self.wqkv, f),
            wq: map_vec(&self.wq, f),
            wk: map_vec(&self.wk, f),
            wv: map_vec(&self.wv, f),
            wo: map_vec(&self.wo, f),
            bq: opt(&self.bq),
            bk: opt(&self.bk),
            bv: opt(&self.bv),
            bo: opt(&self.bo),
            fused: self.fused,
            var: self.var.clone(),
        }
    }

    /// The weight views (column blocks of `wqkv` when fused).
    pub fn weights(&self) -> MhaWeights<'_, T> {
        let c = &self.cfg;
        let (qw, kw, vw) = (c.q_width(), c.k_width(), c.v_width());
        let (wq, wk, wv) = if self.fused {
            let t = qw + kw + vw;
            let blk =
                |cols, off| MatRef::new(&self.wqkv, MatLayout::strided(c.in_dim, cols, t, 1, off));
            (blk(qw, 0), blk(kw, qw), blk(vw, qw + kw))
        } else {
            (
                MatRef::row_major(&self.wq, c.in_dim, qw),
                MatRef::row_major(&self.wk, c.kv_in_dim, kw),
                MatRef::row_major(&self.wv, c.kv_in_dim, vw),
            )
        };
        MhaWeights {
            wq,
            wk,
            wv,
            wo: MatRef::row_major(&self.wo, c.o_width(), c.in_dim),
            bq: self.bq.as_deref(),
            bk: self.bk.as_deref(),
            bv: self.bv.as_deref(),
            bo: self.bo.as_deref(),
            variants: self.var.variants(),
        }
    }
}

impl MhaParams {
    /// Weights uniform in `±1/√fan_in` (activations stay O(1)); biases when `bias`.
    pub fn new(cfg: MhaConfig, bias: bool, fused: bool, g: &mut Gen) -> Self {
        let (qw, kw, vw, ow) = (cfg.q_width(), cfg.k_width(), cfg.v_width(), cfg.o_width());
        let s_in = 1.0 / (cfg.in_dim.max(1) as f32).sqrt();
        let s_kv = 1.0 / (cfg.kv_in_dim.max(1) as f32).sqrt();
        let s_o = 1.0 / (ow.max(1) as f32).sqrt();
        let wq = g.vec(cfg.in_dim * qw, s_in);
        let wk = g.vec(cfg.kv_in_dim * kw, s_kv);
        let wv = g.vec(cfg.kv_in_dim * vw, s_kv);
        let wo = g.vec(ow * cfg.in_dim, s_o);
        let mut b = |n: usize| bias.then(|| g.vec(n, 0.5));
        let (bq, bk, bv, bo) = (b(qw), b(kw), b(vw), b(cfg.in_dim));
        let fused = fused && cfg.in_dim == cfg.kv_in_dim;
        let mut wqkv = Vec::new();
        if fused {
            for r in 0..cfg.in_dim {
                wqkv.extend_from_slice(&wq[r * qw..(r + 1) * qw]);
                wqkv.extend_from_slice(&wk[r * kw..(r + 1) * kw]);
                wqkv.extend_from_slice(&wv[r * vw..(r + 1) * vw]);
            }
        }
        Self { cfg, wqkv, wq, wk, wv, wo, bq, bk, bv, bo, fused, var: VariantSpec::default() }
    }

    /// The same weights with the attention variants `var`.
    pub fn with_variants(self, var: VariantSpec) -> Self {
        Self { var, ..self }
    }
}

/// Owned weights of an encoder block (f32, or mapped to another type by [`map`](Self::map)).
pub struct EncoderParams<T = f32> {
    pub cfg: EncoderConfig,
    pub attn: MhaParams<T>,
    pub g1: Vec<T>,
    pub be1: Vec<T>,
    pub w1: Vec<T>,
    pub b1: Vec<T>,
    pub w2: Vec<T>,
    pub b2: Vec<T>,
    pub g2: Vec<T>,
    pub be2: Vec<T>,
}

impl<T: Copy> EncoderParams<T> {
    /// The same block with every weight mapped by `f`.
    pub fn map<U>(&self, f: impl Fn(T) -> U + Copy) -> EncoderParams<U> {
        EncoderParams {
            cfg: self.cfg,
            attn: self.attn.map(f),
            g1: map_vec(&self.g1, f),
            be1: map_vec(&self.be1, f),
            w1: map_vec(&self.w1, f),
            b1: map_vec(&self.b1, f),
            w2: map_vec(&self.w2, f),
            b2: map_vec(&self.b2, f),
            g2: map_vec(&self.g2, f),
            be2: map_vec(&self.be2, f),
        }
    }

    /// The weight views.
    pub fn weights(&self) -> EncoderWeights<'_, T> {
        let (d, ff) = (self.cfg.attn.in_dim, self.cfg.ff_dim);
        EncoderWeights {
            attn: self.attn.weights(),
            norm1: LayerNormWeights { gamma: &self.g1, beta: &self.be1 },
            ff: FeedForwardWeights {
                w1: MatRef::row_major(&self.w1, d, ff),
                b1: Some(&self.b1),
                w2: MatRef::row_major(&self.w2, ff, d),
                b2: Some(&self.b2),
            },
            norm2: LayerNormWeights { gamma: &self.g2, beta: &self.be2 },
        }
    }
}

impl EncoderParams {
    /// Weights for `cfg`; layer-norm γ around 1, β around 0.
    pub fn new(cfg: EncoderConfig, fused: bool, g: &mut Gen) -> Self {
        let d = cfg.attn.in_dim;
        let ff = cfg.ff_dim;
        let attn = MhaParams::new(cfg.attn, true, fused, g);
        let mut around = |n: usize, c: f32| g.vec(n, 0.25).into_iter().map(|v| v + c).collect();
        let (g1, be1, g2, be2) = (around(d, 1.0), around(d, 0.0), around(d, 1.0), around(d, 0.0));
        let w1 = g.vec(d * ff, 1.0 / (d.max(1) as f32).sqrt());
        let b1 = g.vec(ff, 0.5);
        let w2 = g.vec(ff * d, 1.0 / (ff.max(1) as f32).sqrt());
        let b2 = g.vec(d, 0.5);
        Self { cfg, attn, g1, be1, w1, b1, w2, b2, g2, be2 }
    }
}

/// A row-major f32 matrix with a per-element error bound, both `[rows, cols]`.
#[derive(Clone, Debug)]
pub struct Bounded {
    pub rows: usize,
    pub cols: usize,
    pub val: Vec<f32>,
    pub err: Vec<f64>,
}

impl Bounded {
    /// An exact input (error 0).
    pub fn exact(val: Vec<f32>, rows: usize, cols: usize) -> Self {
        assert_eq!(val.len(), rows * cols);
        Self { rows, cols, err: vec![0.0; val.len()], val }
    }
    fn mat(&self) -> MatRef<'_> {
        MatRef::row_major(&self.val, self.rows, self.cols)
    }
}

/// `y = x·W + b` by the reference, with the bound of an f32 GEMM whose input carries `x.err`:
/// `|Δx||W| + γ·(k + 3)·u·(|x||W| + |b|) + u·|y|`.
pub fn linear_b(x: &Bounded, w: MatRef<'_>, b: Option<&[f32]>) -> Bounded {
    let (n, k, m) = (x.rows, x.cols, w.layout.cols);
    let mut val = vec![0.0; n * m];
    ref_linear(x.mat(), w, b, MatMut::row_major(&mut val, n, m)).unwrap();
    let mut err = vec![0.0; n * m];
    for r in 0..n {
        for j in 0..m {
            let (mut prop, mut mag) = (0.0, b.map_or(0.0, |b| f64::from(b[j]).abs()));
            for p in 0..k {
                let wv = f64::from(w.at(p, j)).abs();
                prop += x.err[r * k + p] * wv;
                mag += f64::from(x.val[r * k + p]).abs() * wv;
            }
            err[r * m + j] =
                prop + GAMMA * (k as f64 + 3.0) * U * mag + U * f64::from(val[r * m + j]).abs();
        }
    }
    Bounded { rows: n, cols: m, val, err }
}

/// Layer norm of each row by the reference, with the bound of the f32 two-pass kernel (lane
/// sums of `d/16 + 16` terms) plus the propagation of `x.err` through the normalisation's
/// Jacobian `∂y_j/∂x_l = γ_j·s·(δ_jl − 1/d − c_j·c_l·s²/d)`, `s = 1/√(σ² + eps)`.
pub fn layer_norm_b(x: &Bounded, gamma: &[f32], beta: &[f32], eps: f32) -> Bounded {
    let (n, d) = (x.rows, x.cols);
    let mut val = vec![0.0; n * d];
    let w = LayerNormWeights { gamma, beta };
    ref_layer_norm(x.mat(), &w, eps, MatMut::row_major(&mut val, n, d)).unwrap();
    let mut err = vec![0.0; n * d];
    let chain = (d / 16 + 16 + 2) as f64;
    for r in 0..n {
        let row: Vec<f64> = x.val[r * d..(r + 1) * d].iter().map(|&v| f64::from(v)).collect();
        let dx = &x.err[r * d..(r + 1) * d];
        let df = d as f64;
        let mu = row.iter().sum::<f64>() / df;
        let c: Vec<f64> = row.iter().map(|v| v - mu).collect();
        let ss: f64 = c.iter().map(|v| v * v).sum();
        let var = ss / df;
        let s = 1.0 / (var + f64::from(eps)).sqrt();
        let mean_abs = row.iter().map(|v| v.abs()).sum::<f64>() / df;
        let sum_abs_c: f64 = c.iter().map(|v| v.abs()).sum();
        // Own rounding: mean, centred values, sum of squares, 1/√.
        let e_mu = chain * U * mean_abs;
        let d_ss = 2.0 * e_mu * sum_abs_c + 2.0 * U * ss + chain * U * ss;
        let rel_s = 0.5 * (d_ss / df + U * var) / (var + f64::from(eps)) + 4.0 * U;
        // Propagation of the input bounds.
        let mean_dx = dx.iter().sum::<f64>() / df;
        let cdx: f64 = c.iter().zip(dx).map(|(c, e)| c.abs() * e).sum::<f64>() / df;
        for j in 0..d {
            let g = f64::from(gamma[j]).abs();
            let own = g * ((e_mu + U * c[j].abs()) * s + c[j].abs() * s * rel_s)
                + 3.0 * U * (g * c[j].abs() * s + f64::from(beta[j]).abs());
            let prop = g * s * (dx[j] + mean_dx + c[j].abs() * s * s * cdx);
            err[r * d + j] = prop + GAMMA * own + U * f64::from(val[r * d + j]).abs();
        }
    }
    Bounded { rows: n, cols: d, val, err }
}

/// [`attention_variants_b`] without variants.
#[allow(clippy::too_many_arguments)]
pub fn attention_b(
    q: &Bounded,
    k: &Bounded,
    v: &Bounded,
    batch: usize,
    h: usize,
    hkv: usize,
    scale: f32,
    mask: &Mask<'_>,
) -> Bounded {
    attention_variants_b(q, k, v, batch, h, hkv, scale, mask, &Variants::NONE)
}

/// Multi-head attention of bounded Q `[b·nq, h·dk]`, K `[b·nk, hkv·dk]`, V `[b·nk, hkv·dv]`
/// with `variants` by the reference, with the bound of the f32 kernel: score errors `Δs_ij`
/// from the inputs' bounds and the `dk`-term dot product (carried through a softcap by its
/// slope `sech² ≤ 1`), plus the softcap's own error ([`softcap_error`]) and a few roundings of
/// the ALiBi term and of the sum of the terms; softmax weights perturbed by at most
/// `p_ij·(e^{2·max_j Δs_ij} − 1)` (a sink is an exact logit); the weighted sum of `nk` values
/// accumulated in f32 with a 1-ULP exp and online rescaling (`γ·(nk + 16)·u·Σ_j p_ij|v_j|`);
/// and the weights below `e^(−64)` that the kernels flush to 0 (at most
/// [`flushed_weight`](attn_tests::numerics::flushed_weight) `= f` each, against a row sum ≥ 1),
/// with results in the subnormal range: `2⁻¹²⁶ + f·Σ_visible |v_j|`.
#[allow(clippy::too_many_arguments)]
pub fn attention_variants_b(
    q: &Bounded,
    k: &Bounded,
    v: &Bounded,
    batch: usize,
    h: usize,
    hkv: usize,
    scale: f32,
    mask: &Mask<'_>,
    variants: &Variants<'_>,
) -> Bounded {
    let nq = q.rows / batch.max(1);
    let nk = k.rows / batch.max(1);
    let dk = q.cols.checked_div(h).unwrap_or(0);
    let dv = v.cols.checked_div(hkv).unwrap_or(0);
    let mut val = vec![0.0; q.rows * h * dv];
    ref_attention(
        TensorRef::new(&q.val, Tensor4Layout::bshd(batch, nq, h, dk)),
        TensorRef::new(&k.val, Tensor4Layout::bshd(batch, nk, hkv, dk)),
        TensorRef::new(&v.val, Tensor4Layout::bshd(batch, nk, hkv, dv)),
        scale,
        mask,
        variants,
        TensorMut::new(&mut val, Tensor4Layout::bshd(batch, nq, h, dv)),
        None,
    )
    .unwrap();
    let mut err = vec![0.0; val.len()];
    let sc = f64::from(scale).abs();
    let group = h / hkv.max(1);
    let (qc, kc, vc, oc) = (q.cols, k.cols, v.cols, h * dv);
    let off = Variants::offset(mask, nq, nk);
    let cap = |s: f64| variants.softcap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh());
    let cap_err = variants.softcap.map_or(0.0, |c| softcap_error(f64::from(c)));
    for b in 0..batch {
        for hh in 0..h {
            let g = hh / group;
            let slope = variants.alibi.map_or(0.0, |a| f64::from(a[hh]));
            for i in 0..nq {
                let qi = (b * nq + i) * qc + hh * dk;
                let mut logits = Vec::with_capacity(nk + 1);
                let mut ds_max: f64 = 0.0;
                for j in 0..nk {
                    let in_window = variants.window.is_none_or(|w| w.contains(i, j, off));
                    let Some(t) = mask.term(b, hh, i, j, nq, nk).filter(|_| in_window) else {
                        logits.push(None);
                        continue;
                    };
                    let kj = (b * nk + j) * kc + g * dk;
                    let (mut dot, mut mag, mut prop) = (0.0, 0.0, 0.0);
                    for d in 0..dk {
                        let (a, c) = (f64::from(q.val[qi + d]), f64::from(k.val[kj + d]));
                        dot += a * c;
                        mag += (a * c).abs();
                        prop += q.err[qi + d] * c.abs() + a.abs() * k.err[kj + d];
                    }
                    let alibi = slope * (j as f64 - i as f64 - off as f64);
                    let s = cap(f64::from(scale) * dot) + f64::from(t) + alibi;
                    let terms = sc * mag + f64::from(t).abs() + alibi.abs() + s.abs();
                    let ds = sc * prop + GAMMA * (dk as f64 + 4.0) * U * terms + cap_err;
                    ds_max = ds_max.max(ds);
                    logits.push(Some(s));
                }
                if let Some(s) = variants.sinks {
                    logits.push(Some(f64::from(s[hh])));
                }
                let (p, _) = attn_reference::softmax::softmax_row(&logits);
                let amp = (2.0 * ds_max).exp_m1();
                for d in 0..dv {
                    let (mut mag, mut prop, mut visible) = (0.0, 0.0, 0.0);
                    for j in (0..nk).filter(|&j| logits[j].is_some()) {
                        visible += f64::from(v.val[(b * nk + j) * vc + g * dv + d]).abs();
                    }
                    // The sink's weight (position nk) carries no value.
                    for (j, &pj) in p[..nk].iter().enumerate() {
                        if pj == 0.0 {
                            continue;
                        }
                        let vj = (b * nk + j) * vc + g * dv + d;
                        mag += pj * f64::from(v.val[vj]).abs();
                        prop += pj * v.err[vj];
                    }
                    let oi = (b * nq + i) * oc + hh * dv + d;
                    err[oi] = amp * mag
                        + prop
                        + GAMMA * (nk as f64 + 16.0) * U * mag
                        + U * f64::from(val[oi]).abs()
                        + f64::from(f32::MIN_POSITIVE)
                        + attn_tests::numerics::flushed_weight() * visible;
                }
            }
        }
    }
    Bounded { rows: q.rows, cols: oc, val, err }
}

/// The reference's MHA (or cross-attention when `x2` is given) output, stage by stage, with its
/// bound. `x1: [batch·n1, in_dim]`, `x2: [batch·n2, kv_in_dim]` contiguous.
pub fn mha_b(
    p: &MhaParams,
    x1: &Bounded,
    x2: Option<&Bounded>,
    batch: usize,
    mask: &Mask<'_>,
) -> Bounded {
    let w = p.weights();
    let x2 = x2.unwrap_or(x1);
    let q = linear_b(x1, w.wq, w.bq);
    let k = linear_b(x2, w.wk, w.bk);
    let v = linear_b(x2, w.wv, w.bv);
    let c = &p.cfg;
    let (h, hkv) = (c.num_heads, c.kv_heads);
    let o = attention_variants_b(&q, &k, &v, batch, h, hkv, c.scale(), mask, &w.variants);
    let y = linear_b(&o, w.wo, w.bo);
    // The stage-by-stage values are the reference module's own: check it once here.
    if x1.rows > 0 && std::ptr::eq(x1, x2) {
        let n = x1.rows / batch;
        let mut yr = vec![0.0; y.val.len()];
        let seq = Tensor4Layout::batch_seq(batch, n, c.in_dim);
        ref_mha(c, &w, TensorRef::new(&x1.val, seq), mask, TensorMut::new(&mut yr, seq)).unwrap();
        assert_eq!(yr, y.val, "reference stages reproduce the reference module");
    }
    y
}

/// The reference's encoder block, stage by stage, with its bound.
pub fn encoder_b(p: &EncoderParams, x: &Bounded, batch: usize, mask: &Mask<'_>) -> Bounded {
    let a = mha_b(&p.attn, x, None, batch, mask);
    let add = |a: &Bounded, b: &Bounded| {
        let val: Vec<f32> = a.val.iter().zip(&b.val).map(|(x, y)| x + y).collect();
        let err =
            (0..val.len()).map(|i| a.err[i] + b.err[i] + U * f64::from(val[i]).abs()).collect();
        Bounded { rows: a.rows, cols: a.cols, val, err }
    };
    let r1 = add(x, &a);
    let h = layer_norm_b(&r1, &p.g1, &p.be1, p.cfg.eps);
    let w = p.weights();
    let mut hid = linear_b(&h, w.ff.w1, w.ff.b1);
    // Lipschitz constant of the activation: 1 for ReLU, < 1.13 for GELU; its own error: the
    // rounding of the f32 result for ReLU, the kernels' published GELU bound (which includes
    // that rounding) for GELU.
    let lip = match p.cfg.activation {
        Activation::Relu => 1.0,
        Activation::GeluTanh => 1.13,
    };
    for (v, e) in hid.val.iter_mut().zip(hid.err.iter_mut()) {
        let x = *v;
        let exact = attn_reference::activate(p.cfg.activation, f64::from(x));
        *v = exact as f32;
        let own = match p.cfg.activation {
            Activation::Relu => U * exact.abs(),
            Activation::GeluTanh => gelu_tanh_bound(x, exact) + U * exact.abs(),
        };
        *e = *e * lip + own;
    }
    let f = linear_b(&hid, w.ff.w2, w.ff.b2);
    let r2 = add(&f, &h);
    layer_norm_b(&r2, &p.g2, &p.be2, p.cfg.eps)
}

/// Asserts `|got − want| ≤ err` elementwise (NaN matching NaN), naming the first failure.
pub fn assert_bounded(got: &[f32], want: &Bounded, what: &str) {
    assert_eq!(got.len(), want.val.len(), "{what}: length");
    for (i, &g) in got.iter().enumerate() {
        let w = want.val[i];
        let e = (f64::from(g) - f64::from(w)).abs();
        assert!(
            e <= want.err[i] || (g.is_nan() && w.is_nan()),
            "{what}[{i}]: got {g}, want {w}, |error| {e:e} > bound {:e}",
            want.err[i]
        );
    }
}
