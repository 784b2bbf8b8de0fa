//! The seed's `MultiHeadAttention` and `CrossAttention` modules: Q/K/V projections, per-head
//! scaled dot-product attention, concatenation of the heads and the output projection.
//!
//! The layer's shape lives in [`MhaConfig`], its caller-owned weights in [`MhaWeights`]; the
//! kernels' layers take the same two descriptors. Activations are batches of sequences,
//! `[batch, 1, n, dim]` tensors (see [`Tensor4Layout::batch_seq`]).

use crate::alloc;
pub use attn_core::layers::{MhaConfig, MhaWeights};

use crate::attention::attention_with_variants;
use crate::error::{expect_dim, Result};
use crate::linear::linear;
use crate::mask::Mask;
use crate::shape::{MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};

/// The seed's `MultiHeadAttention.forward`: for each batch `b`, with `X = x[b]: [n, in_dim]`,
///
/// `Q = X·Wq + bq`, `K = X·Wk + bk`, `V = X·Wv + bv`, split into heads by columns;
/// `head_h = softmax(Q_h·K_gᵀ / √k_dim + mask)·V_g` with `g = h / (num_heads / kv_heads)`;
/// `y[b] = concat_h(head_h)·Wo + bo`.
///
/// With `w.variants` set, each head is [`crate::attention::attention_with_variants`] instead
/// (window, softcap, sink and ALiBi slope of query head `h`; the window and ALiBi measure from
/// the mask's causal offset, `0` for self-attention without a causal mask).
///
/// `x` and `y` are `[batch, 1, n, in_dim]` tensors ([`Tensor4Layout::batch_seq`] for contiguous
/// `[batch, n, in_dim]` storage). The mask addresses `[batch, num_heads, n, n]`; unlike the
/// seed's −1e9 fill, a fully masked row contributes a zero attention row (so that row of `y` is
/// `bo`). Each stage (projections, attention, output projection) is a reference call that
/// accumulates in f64 and rounds its result to f32, as an f32 engine does between stages.
/// `n = 0` or `batch = 0` gives an empty output.
///
/// Errors: `cfg.kv_in_dim ≠ cfg.in_dim`, the config ([`MhaConfig::check`]), the weights and
/// variants ([`MhaWeights::check`]), `x` with more than one head or a width other than `in_dim`, `y` ≠
/// `[batch, 1, n, in_dim]`, a mask of other dims, views overrunning their slices.
pub fn multi_head_attention(
    cfg: &MhaConfig,
    w: &MhaWeights<'_>,
    x: TensorRef<'_>,
    mask: &Mask<'_>,
    y: TensorMut<'_>,
) -> Result<()> {
    expect_dim("cfg", "kv_in_dim", cfg.in_dim, cfg.kv_in_dim)?;
    forward(cfg, w, (x, "x"), (x, "x"), mask, y)
}

/// The seed's `CrossAttention.forward`: queries from `x1: [batch, 1, n1, in_dim]`, keys and
/// values from `x2: [batch, 1, n2, kv_in_dim]`, output `y: [batch, 1, n1, in_dim]`:
///
/// `Q = X1·Wq + bq`, `K = X2·Wk + bk`, `V = X2·Wv + bv`;
/// `head_h = softmax(Q_h·K_gᵀ / √k_dim + mask)·V_g`; `y[b] = concat_h(head_h)·Wo + bo`.
///
/// The two sequences may differ in length and width. The mask addresses
/// `[batch, num_heads, n1, n2]` (a causal mask's default offset is `n2 − n1`, which the
/// variants' window and ALiBi also measure from, as
/// [`Variants::offset`](crate::variants::Variants::offset) says). `n2 = 0` gives
/// zero attention rows (`y = bo`); `n1 = 0` gives an empty output. Same stages and rounding as
/// [`multi_head_attention`].
///
/// Errors: as [`multi_head_attention`], for `x1` and `x2` (whose batch must match `x1`'s).
pub fn cross_attention(
    cfg: &MhaConfig,
    w: &MhaWeights<'_>,
    x1: TensorRef<'_>,
    x2: TensorRef<'_>,
    mask: &Mask<'_>,
    y: TensorMut<'_>,
) -> Result<()> {
    forward(cfg, w, (x1, "x1"), (x2, "x2"), mask, y)
}

fn forward(
    cfg: &MhaConfig,
    w: &MhaWeights<'_>,
    (x1, x1_arg): (TensorRef<'_>, &'static str),
    (x2, x2_arg): (TensorRef<'_>, &'static str),
    mask: &Mask<'_>,
    mut y: TensorMut<'_>,
) -> Result<()> {
    cfg.check()?;
    w.check(cfg)?;
    let [batch, _, n1, _] = x1.layout.dims;
    let n2 = x2.layout.seq();
    x1.layout.expect_dims(x1_arg, [batch, 1, n1, cfg.in_dim])?;
    x2.layout.expect_dims(x2_arg, [batch, 1, n2, cfg.kv_in_dim])?;
    y.layout.expect_dims("y", [batch, 1, n1, cfg.in_dim])?;
    x1.check(x1_arg)?;
    x2.check(x2_arg)?;
    y.check("y")?;
    mask.check(batch, cfg.num_heads, n1, n2)?;
    if y.layout.is_empty() {
        return Ok(());
    }
    let (h, hkv, dk, dv) = (cfg.num_heads, cfg.kv_heads, cfg.k_dim, cfg.v_dim);
    let (qw, kw, vw, ow) = (cfg.q_width(), cfg.k_width(), cfg.v_width(), cfg.o_width());
    let mut q = alloc::zeros("q", &[batch, n1, qw])?;
    let mut k = alloc::zeros("k", &[batch, n2, kw])?;
    let mut v = alloc::zeros("v", &[batch, n2, vw])?;
    let mut o = alloc::zeros("o", &[batch, n1, ow])?;
    // Batch b of a contiguous [batch, rows, cols] buffer.
    let slab = |b: usize, rows: usize, cols: usize| {
        MatLayout::strided(rows, cols, cols, 1, b * rows * cols)
    };
    for b in 0..batch {
        linear(x1.matrix(b, 0), w.wq, w.bq, MatMut::new(&mut q, slab(b, n1, qw)))?;
        linear(x2.matrix(b, 0), w.wk, w.bk, MatMut::new(&mut k, slab(b, n2, kw)))?;
        linear(x2.matrix(b, 0), w.wv, w.bv, MatMut::new(&mut v, slab(b, n2, vw)))?;
    }
    // [batch, n, heads·d] row-major is the [b, s, h, d] layout: heads split with no copy.
    attention_with_variants(
        TensorRef::new(&q, Tensor4Layout::bshd(batch, n1, h, dk)),
        TensorRef::new(&k, Tensor4Layout::bshd(batch, n2, hkv, dk)),
        TensorRef::new(&v, Tensor4Layout::bshd(batch, n2, hkv, dv)),
        cfg.scale(),
        mask,
        &w.variants,
        TensorMut::new(&mut o, Tensor4Layout::bshd(batch, n1, h, dv)),
        None,
    )?;
    for b in 0..batch {
        linear(MatRef::new(&o, slab(b, n1, ow)), w.wo, w.bo, y.matrix_mut(b, 0))?;
    }
    Ok(())
}
