//! The transformer encoder block the seeds sketch, in the original post-norm arrangement:
//! self-attention + residual + layer norm, then a two-layer feed-forward + residual + layer norm.

use crate::alloc;
use crate::error::{expect_dim, Result};
use crate::linear::linear;
use crate::mask::Mask;
use crate::mha::{multi_head_attention, MhaConfig, MhaWeights};
use crate::norm::{check_eps, layer_norm, LayerNormWeights};
use crate::shape::{MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};

/// The feed-forward activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// `max(x, 0)`, the original transformer's choice (the default).
    #[default]
    Relu,
    /// GELU, tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (BERT, GPT-2).
    GeluTanh,
}

impl Activation {
    /// The activation of `x`, in f64. NaN stays NaN for both.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            // `x.max(0.0)` would turn NaN into 0; keep it visible.
            Activation::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            Activation::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
        }
    }
}

/// Caller-owned weights of the two-layer feed-forward: `w1: [d, ff]`, `b1: [ff]`,
/// `w2: [ff, d_out]`, `b2: [d_out]`.
#[derive(Clone, Copy, Debug)]
pub struct FeedForwardWeights<'a> {
    /// First layer, `[d, ff]`.
    pub w1: MatRef<'a>,
    /// First bias, `[ff]`.
    pub b1: Option<&'a [f32]>,
    /// Second layer, `[ff, d_out]`.
    pub w2: MatRef<'a>,
    /// Second bias, `[d_out]`.
    pub b2: Option<&'a [f32]>,
}

impl FeedForwardWeights<'_> {
    /// Checks the shapes against input width `d`, hidden width `ff` and output width `d_out`,
    /// and the views against their slices. Errors name `w1`, `b1`, `w2`, `b2`.
    pub fn check(&self, d: usize, ff: usize, d_out: usize) -> Result<()> {
        self.w1.layout.expect_shape("w1", d, ff)?;
        self.w2.layout.expect_shape("w2", ff, d_out)?;
        if let Some(b) = self.b1 {
            expect_dim("b1", "len", ff, b.len())?;
        }
        if let Some(b) = self.b2 {
            expect_dim("b2", "len", d_out, b.len())?;
        }
        self.w1.check("w1")?;
        self.w2.check("w2")
    }
}

/// Two-layer feed-forward `y = act(x·W1 + b1)·W2 + b2` for `x: [n, d]`, `y: [n, d_out]`.
///
/// Each linear layer accumulates in f64 and rounds once; the hidden activations are rounded to
/// f32 after the activation, as an f32 engine stores them.
///
/// Errors: [`FeedForwardWeights::check`] with `d = x` cols, `ff = w1` cols, `d_out = w2` cols;
/// `y` ≠ `[n, d_out]`; views overrunning their slices.
pub fn feed_forward(
    x: MatRef<'_>,
    w: &FeedForwardWeights<'_>,
    act: Activation,
    y: MatMut<'_>,
) -> Result<()> {
    let (n, d, ff, d_out) = (x.layout.rows, x.layout.cols, w.w1.layout.cols, w.w2.layout.cols);
    w.check(d, ff, d_out)?;
    y.layout.expect_shape("y", n, d_out)?;
    x.check("x")?;
    y.check("y")?;
    if y.layout.is_empty() {
        return Ok(());
    }
    let mut hidden = alloc::zeros("hidden", &[n, ff])?;
    linear(x, w.w1, w.b1, MatMut::row_major(&mut hidden, n, ff))?;
    for v in &mut hidden {
        *v = act.apply(f64::from(*v)) as f32;
    }
    linear(MatRef::row_major(&hidden, n, ff), w.w2, w.b2, y)
}

/// The shape of an encoder block: a self-attention layer (`attn.kv_in_dim = attn.in_dim`), the
/// feed-forward hidden width, its activation, and the layer-norm epsilon (finite, ≥ 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EncoderConfig {
    /// The self-attention layer; its `in_dim` is the model width `d`.
    pub attn: MhaConfig,
    /// Feed-forward hidden width.
    pub ff_dim: usize,
    /// Feed-forward activation.
    pub activation: Activation,
    /// Layer-norm epsilon, shared by both norms.
    pub eps: f32,
}

impl EncoderConfig {
    /// Checks the attention config, that it is self-attention, and the epsilon.
    pub fn check(&self) -> Result<()> {
        self.attn.check()?;
        expect_dim("cfg", "kv_in_dim", self.attn.in_dim, self.attn.kv_in_dim)?;
        check_eps(self.eps)
    }
}

/// Caller-owned weights of an encoder block.
#[derive(Clone, Copy, Debug)]
pub struct EncoderWeights<'a> {
    /// Self-attention weights.
    pub attn: MhaWeights<'a>,
    /// Layer norm after the attention residual (`[d]` each).
    pub norm1: LayerNormWeights<'a>,
    /// Feed-forward weights (`w1: [d, ff_dim]`, `w2: [ff_dim, d]`).
    pub ff: FeedForwardWeights<'a>,
    /// Layer norm after the feed-forward residual (`[d]` each).
    pub norm2: LayerNormWeights<'a>,
}

impl EncoderWeights<'_> {
    /// Checks every weight against `cfg`. Errors name the weight (`wq` …, `norm1.gamma`,
    /// `norm2.beta`, `w1` …).
    pub fn check(&self, cfg: &EncoderConfig) -> Result<()> {
        let d = cfg.attn.in_dim;
        self.attn.check(&cfg.attn)?;
        expect_dim("norm1.gamma", "len", d, self.norm1.gamma.len())?;
        expect_dim("norm1.beta", "len", d, self.norm1.beta.len())?;
        self.ff.check(d, cfg.ff_dim, d)?;
        expect_dim("norm2.gamma", "len", d, self.norm2.gamma.len())?;
        expect_dim("norm2.beta", "len", d, self.norm2.beta.len())
    }
}

/// One post-norm transformer encoder block ("Attention Is All You Need", §3.1), for each batch
/// `b` with `X = x[b]: [n, d]`:
///
/// `H = LayerNorm₁(X + MultiHeadAttention(X, mask))`,
/// `y[b] = LayerNorm₂(H + act(H·W1 + b1)·W2 + b2)`.
///
/// Post-norm: each layer norm follows its residual sum (pre-norm blocks, which normalise before
/// the sub-layer, are a different function). The activation is `cfg.activation` (ReLU by
/// default, as in the original). `x` and `y` are `[batch, 1, n, d]`; the mask addresses
/// `[batch, num_heads, n, n]`. Each stage is a reference call rounded to f32 (the residual sums
/// too), as an f32 engine stores its intermediates. `n = 0` gives an empty output.
///
/// Errors: [`EncoderConfig::check`], [`EncoderWeights::check`], and those of
/// [`multi_head_attention`] for `x`, `y` and the mask.
pub fn encoder_block(
    cfg: &EncoderConfig,
    w: &EncoderWeights<'_>,
    x: TensorRef<'_>,
    mask: &Mask<'_>,
    mut y: TensorMut<'_>,
) -> Result<()> {
    cfg.check()?;
    w.check(cfg)?;
    let [batch, _, n, _] = x.layout.dims;
    let d = cfg.attn.in_dim;
    x.layout.expect_dims("x", [batch, 1, n, d])?;
    y.layout.expect_dims("y", [batch, 1, n, d])?;
    x.check("x")?;
    y.check("y")?;
    mask.check(batch, cfg.attn.num_heads, n, n)?;
    if y.layout.is_empty() {
        return Ok(());
    }
    let seq = Tensor4Layout::batch_seq(batch, n, d);
    let mut a = alloc::zeros("attn", &[batch, n, d])?;
    multi_head_attention(&cfg.attn, &w.attn, x, mask, TensorMut::new(&mut a, seq))?;
    let mut h = alloc::zeros("h", &[batch, n, d])?;
    let mut f = alloc::zeros("ff", &[batch, n, d])?;
    for b in 0..batch {
        let slab = MatLayout::strided(n, d, d, 1, b * n * d);
        // r = X + attention(X), in place over the attention output.
        for s in 0..n {
            for j in 0..d {
                let i = slab.index(s, j);
                a[i] = (f64::from(x.at(b, 0, s, j)) + f64::from(a[i])) as f32;
            }
        }
        layer_norm(MatRef::new(&a, slab), &w.norm1, cfg.eps, MatMut::new(&mut h, slab))?;
        feed_forward(MatRef::new(&h, slab), &w.ff, cfg.activation, MatMut::new(&mut f, slab))?;
        for (fi, hi) in f[b * n * d..(b + 1) * n * d].iter_mut().zip(&h[b * n * d..]) {
            *fi = (f64::from(*fi) + f64::from(*hi)) as f32;
        }
        layer_norm(MatRef::new(&f, slab), &w.norm2, cfg.eps, y.matrix_mut(b, 0))?;
    }
    Ok(())
}
