//! The transformer encoder block the seeds sketch, in the original post-norm arrangement:
//! self-attention + residual + layer norm, then a two-layer feed-forward + residual + layer norm.

use crate::alloc;
use crate::error::Result;
use crate::linear::linear;
use crate::mask::Mask;
pub use attn_core::layers::{Activation, EncoderConfig, EncoderWeights, FeedForwardWeights};

use crate::mha::multi_head_attention;
use crate::norm::layer_norm;
use crate::shape::{MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};

/// The activation `act` of `x`, in f64. NaN stays NaN for both.
pub fn activate(act: Activation, x: f64) -> f64 {
    match act {
        // `x.max(0.0)` would turn NaN into 0; keep it visible.
        Activation::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        // 0.5·x·(1 + tanh(y)) = x / (1 + e^(−2y)): the same function, written so that it does
        // not cancel where tanh(y) → −1 (in f64, 1 + tanh(y) has lost every digit by x = −7.5,
        // where the f32 result is still a normal number).
        Activation::GeluTanh => {
            let y = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            x / (1.0 + (-2.0 * y).exp())
        }
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
        *v = activate(act, f64::from(*v)) as f32;
    }
    linear(MatRef::row_major(&hidden, n, ff), w.w2, w.b2, y)
}

/// One post-norm transformer encoder block ("Attention Is All You Need", §3.1), for each batch
/// `b` with `X = x[b]: [n, d]`:
///
/// `H = LayerNorm₁(X + MultiHeadAttention(X, mask))`,
/// `y[b] = LayerNorm₂(H + act(H·W1 + b1)·W2 + b2)`.
///
/// Post-norm: each layer norm follows its residual sum (pre-norm blocks, which normalise before
/// the sub-layer, are a different function). The activation is `cfg.activation` (ReLU by
/// default, as in the original); the attention has the variants `w.attn.variants` (see
/// [`multi_head_attention`]). `x` and `y` are `[batch, 1, n, d]`; the mask addresses
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
