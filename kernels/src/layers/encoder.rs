//! The two-layer feed-forward and the post-norm encoder block on the kernels.
//!
//! Encoder workspace (f32 elements, see [`encoder_workspace_len`]), carved front to back:
//!
//! ```text
//! A  [batch·n, d]   attention output, + x (residual 1); later the feed-forward output, + H
//! H  [batch·n, d]   LayerNorm₁(A): the feed-forward input and residual 2
//! S  max(MHA workspace, [batch·n, ff_dim])   the attention's scratch, then the hidden layer
//! ```
//!
//! The attention is done with S before the feed-forward needs it, so the two share it.
//!
//! Weights and activations may be f32, bf16 or f16 (`W`, `A`): every intermediate above is f32,
//! the inputs are widened exactly where they are read (the GEMMs' packing, the residual), and
//! a half-precision `y` is LayerNorm₂ computed into H and rounded once.

use attn_core::{
    Activation, DType, EncoderConfig, EncoderWeights, FeedForwardWeights, Mask, MatLayout, MatMut,
    MatRef, Result, Tensor4Layout, TensorMut, TensorRef,
};

use super::linear::linear;
use super::mha::{self, mha_workspace_len};
use super::norm::layer_norm;
use super::workspace::{self, count, fold_batch, take, total};
use crate::arch::convert::Convertible;
use crate::par::Parallelism;

/// Workspace (in `f32` elements) of [`feed_forward_in`] for `n` rows and hidden width `ff`:
/// `n·ff` (saturating).
pub fn feed_forward_workspace_len(n: usize, ff: usize) -> usize {
    count(&[n, ff])
}

allocating_form! {
    /// Two-layer feed-forward `y = act(x·W1 + b1)·W2 + b2` for `x: [n, d]`, `y: [n, d_out]`,
    /// allocating its hidden layer: see [`feed_forward_in`].
    pub fn feed_forward<X, W>(
        x: MatRef<'_, X>,
        w: &FeedForwardWeights<'_, W>,
        act: Activation,
        y: MatMut<'_>,
    ) => feed_forward_in;
    checks: check_ff(&x, w, &y);
    workspace: feed_forward_workspace_len(x.layout.rows, w.w1.layout.cols);
}

/// Two-layer feed-forward `y = act(x·W1 + b1)·W2 + b2` (`attn_reference::feed_forward`), the
/// hidden layer `[n, ff]` in `workspace` (at least [`feed_forward_workspace_len`] elements).
///
/// Both layers are [`linear`] calls (GEMM with the bias folded in). The activation is applied
/// in place on the hidden layer: ReLU keeps NaN (`x < 0 ? 0 : x`), GELU (tanh form) is the
/// vectorised [`gelu_tanh`](crate::math::gelu_tanh), within its stated bound of the exact value.
/// `x` and the weights may each be f32, bf16 or f16 (widened exactly, as [`linear`]); `y` and the
/// hidden layer are f32.
///
/// Errors: those of the reference, in the same order; then a too-short `workspace`.
pub fn feed_forward_in<X: Convertible, W: Convertible>(
    x: MatRef<'_, X>,
    w: &FeedForwardWeights<'_, W>,
    act: Activation,
    y: MatMut<'_>,
    workspace: &mut [f32],
    par: Parallelism,
) -> Result<()> {
    check_ff(&x, w, &y)?;
    let (n, ff) = (x.layout.rows, w.w1.layout.cols);
    workspace::expect_len(workspace, feed_forward_workspace_len(n, ff))?;
    if y.layout.is_empty() {
        return Ok(());
    }
    let hidden = &mut workspace[..n * ff];
    linear(x, w.w1, w.b1, MatMut::row_major(hidden, n, ff), par)?;
    activate(hidden, act);
    linear(MatRef::row_major(hidden, n, ff), w.w2, w.b2, y, par)
}

fn check_ff<X: Convertible, W: Convertible>(
    x: &MatRef<'_, X>,
    w: &FeedForwardWeights<'_, W>,
    y: &MatMut<'_>,
) -> Result<()> {
    let (n, d, ff, d_out) = (x.layout.rows, x.layout.cols, w.w1.layout.cols, w.w2.layout.cols);
    w.check(d, ff, d_out)?;
    y.layout.expect_shape("y", n, d_out)?;
    x.check("x")?;
    y.check("y")
}

/// The activation, in place.
fn activate(h: &mut [f32], act: Activation) {
    match act {
        // Not `max(0.0)`, which would turn NaN into 0.
        Activation::Relu => h.iter_mut().for_each(|v| *v = if *v < 0.0 { 0.0 } else { *v }),
        Activation::GeluTanh => crate::math::gelu_tanh(h),
    }
}

/// Workspace (in `f32` elements) of [`encoder_block_in`] for `batch` sequences of `n` tokens:
/// `2·batch·n·d + max(mha_workspace_len(cfg.attn, batch, n, n), batch·n·ff_dim)` (saturating).
pub fn encoder_workspace_len(cfg: &EncoderConfig, batch: usize, n: usize) -> usize {
    let act = count(&[batch, n, cfg.attn.in_dim]);
    let scratch = mha_workspace_len(&cfg.attn, batch, n, n).max(count(&[batch, n, cfg.ff_dim]));
    total(&[act, act, scratch])
}

allocating_form! {
    /// One post-norm encoder block, allocating its workspace: see [`encoder_block_in`].
    pub fn encoder_block<W, A>(
        cfg: &EncoderConfig,
        w: &EncoderWeights<'_, W>,
        x: TensorRef<'_, A>,
        mask: &Mask<'_>,
        y: TensorMut<'_, A>,
    ) => encoder_block_in;
    checks: check_encoder(cfg, w, &x, mask, &y);
    workspace: encoder_workspace_len(cfg, x.layout.batch(), x.layout.seq());
}

/// One post-norm transformer encoder block (`attn_reference::encoder_block`), for each batch
/// `b` with `X = x[b]: [n, d]`:
///
/// `H = LayerNorm₁(X + MultiHeadAttention(X, mask))`,
/// `y[b] = LayerNorm₂(H + act(H·W1 + b1)·W2 + b2)`
///
/// with the attention variants `w.attn.variants` ([`MhaWeights`](attn_core::MhaWeights)), the
/// activation `cfg.activation` (ReLU by default, as in the original transformer) and
/// both norms after their residual sums (post-norm), as the reference. `x`, `y` are
/// `[batch, 1, n, d]`, the mask addresses `[batch, num_heads, n, n]`. `workspace` must hold
/// [`encoder_workspace_len`]`(cfg, batch, n)` elements; no activation buffer is allocated.
///
/// The weights (`W`) and `x`, `y` (`A`) are each f32, bf16 or f16: the result is the f32
/// block's on the exact values they represent, each output rounded once to `A` (module docs).
///
/// Errors: those of the reference, in the same order; then a too-short `workspace`.
pub fn encoder_block_in<W: Convertible, A: Convertible>(
    cfg: &EncoderConfig,
    w: &EncoderWeights<'_, W>,
    x: TensorRef<'_, A>,
    mask: &Mask<'_>,
    y: TensorMut<'_, A>,
    workspace: &mut [f32],
    par: Parallelism,
) -> Result<()> {
    check_encoder(cfg, w, &x, mask, &y)?;
    let [batch, _, n, d] = x.layout.dims;
    workspace::expect_len(workspace, encoder_workspace_len(cfg, batch, n))?;
    if y.layout.is_empty() {
        return Ok(());
    }
    let rows = batch * n;
    let mut ws = workspace;
    let a = take(&mut ws, rows * d);
    let h = take(&mut ws, rows * d);
    let scratch = ws;
    let seq = Tensor4Layout::batch_seq(batch, n, d);
    let mat = MatLayout::row_major(rows, d);

    let out = TensorMut::new(&mut *a, seq);
    mha::forward(&cfg.attn, &w.attn, (x, "x"), None, mask, out, scratch, par)?;
    // Residual 1: A = x + A (x may be strided).
    for b in 0..batch {
        for s in 0..n {
            let row = &mut a[(b * n + s) * d..][..d];
            for (j, v) in row.iter_mut().enumerate() {
                *v += x.at(b, 0, s, j).widen();
            }
        }
    }
    layer_norm(MatRef::new(a, mat), &w.norm1, cfg.eps, MatMut::new(h, mat))?;
    feed_forward_in(MatRef::new(h, mat), &w.ff, cfg.activation, MatMut::new(a, mat), scratch, par)?;
    // Residual 2: A = FF(H) + H.
    a.iter_mut().zip(h.iter()).for_each(|(f, h)| *f += h);
    norm_into(a, h, batch, n, d, w, cfg.eps, y)
}

/// `y = LayerNorm₂(A)` for the contiguous `[batch·n, d]` buffer `A` and the caller's `y`; a
/// half-precision `y` gets the f32 norm, computed into `h` (as long as `A`), rounded by vectors.
#[allow(clippy::too_many_arguments)]
fn norm_into<W: Convertible, A: Convertible>(
    a: &[f32],
    h: &mut [f32],
    batch: usize,
    n: usize,
    d: usize,
    w: &EncoderWeights<'_, W>,
    eps: f32,
    mut y: TensorMut<'_, A>,
) -> Result<()> {
    if A::DTYPE != DType::F32 {
        let mat = MatLayout::row_major(batch * n, d);
        layer_norm(MatRef::new(a, mat), &w.norm2, eps, MatMut::new(&mut *h, mat))?;
        return mha::store_rows(h, y);
    }
    if let Some(ym) = fold_batch(&y.layout) {
        return layer_norm(
            MatRef::row_major(a, batch * n, d),
            &w.norm2,
            eps,
            MatMut::new(y.data, ym),
        );
    }
    for b in 0..batch {
        let src = MatLayout::strided(n, d, d, 1, b * n * d);
        layer_norm(MatRef::new(a, src), &w.norm2, eps, y.matrix_mut(b, 0))?;
    }
    Ok(())
}

/// The reference's checks, in its order.
fn check_encoder<W: Convertible, A: Convertible>(
    cfg: &EncoderConfig,
    w: &EncoderWeights<'_, W>,
    x: &TensorRef<'_, A>,
    mask: &Mask<'_>,
    y: &TensorMut<'_, A>,
) -> Result<()> {
    cfg.check()?;
    w.check(cfg)?;
    let [batch, _, n, _] = x.layout.dims;
    let d = cfg.attn.in_dim;
    x.layout.expect_dims("x", [batch, 1, n, d])?;
    y.layout.expect_dims("y", [batch, 1, n, d])?;
    x.check("x")?;
    y.check("y")?;
    mask.check(batch, cfg.attn.num_heads, n, n)
}

layer_type! {
    /// An encoder block: its shape and the caller's weights, checked once.
    pub struct EncoderLayer<'w> { cfg: EncoderConfig, weights: EncoderWeights, noun: "block" }
    /// Checks `cfg` and the weights against it ([`EncoderConfig::check`],
    /// [`EncoderWeights::check`]).
    fn new(cfg, weights) {}
    /// Workspace for `batch` sequences of `n` tokens ([`encoder_workspace_len`]).
    fn workspace_len(batch, n) = encoder_workspace_len(batch, n);
    fn forward<A>(x: TensorRef<'_, A>, mask: &Mask<'_>, y: TensorMut<'_, A>) =
        encoder_block, encoder_block_in;
}
