//! `MultiHeadAttention` and `CrossAttention` on the kernels: Q/K/V projections on the GEMM, the
//! heads on the attention kernel, the output projection on the GEMM.
//!
//! Workspace (f32 elements, see [`mha_workspace_len`]), carved front to back:
//!
//! ```text
//! projections, at least batch·n1·in_dim long:
//!   self-attention:  QKV [batch·n, q_w + k_w + v_w]   (row-interleaved: Q | K | V columns)
//!   cross-attention: Q   [batch·n1, q_w]  then  KV [batch·n2, k_w + v_w]
//! heads [batch·n1, num_heads·v_dim]   (the concatenated attention output)
//! ```
//!
//! Weights and activations may be f32, bf16 or f16 (`W`, `A`): the projections widen them
//! while the GEMM packs, so Q, K, V and the heads are f32 in the workspace and the attention
//! runs on f32. A half-precision output is the f32 output projection rounded once: that
//! projection is staged in the projections' region (dead once the heads are computed, which
//! is why it is at least `batch·n1·in_dim` long) and converted into `y`.
//!
//! The projections write the heads side by side in one row so that the attention kernel reads
//! them as `[batch, seq, heads, dim]` strided views, with no transpose or copy. When the caller's
//! `wq`, `wk`, `wv` are adjacent column blocks of one buffer (a concatenated `[in, q_w+k_w+v_w]`
//! weight, as engines usually store it), the three projections are one GEMM (see
//! `project`): A is packed (or read) once instead of three times, which measured never slower
//! and faster on large layers (`fused_qkv_timing` in tests/tests/suite/layers.rs;
//! `docs/perf-journal.md`, 2026-11-29, when A was packed at every width past 128 columns).
//! Separate buffers give three GEMMs into the same workspace, same results up to the GEMM's
//! blocking.

use std::ptr;

use attn_core::error::expect_dim;
use attn_core::{
    Mask, MatLayout, MatMut, MatRef, MhaConfig, MhaWeights, Result, Tensor4Layout, TensorMut,
    TensorRef,
};

use super::kernel_calls::{attention, gemm};
use super::linear::fill_rows;
use super::workspace::{self, count, fold_batch, take, total};
use crate::arch::convert::{convert_slice, Convertible};
use crate::par::Parallelism;

/// Workspace (in `f32` elements) that [`multi_head_attention_in`] (`n_q = n_kv = n`) and
/// [`cross_attention_in`] need for `batch` sequences of `n_q` queries and `n_kv` keys, whatever
/// the element types: `batch · (max(n_q·q_w + n_kv·(k_w + v_w), n_q·in_dim) + n_q·o_w)` with
/// the widths of [`MhaConfig`] (the maximum is the first term whenever `q_w ≥ in_dim`, as in
/// the usual `q_w = in_dim`). Saturates at `usize::MAX` (no slice is that long, so such a call
/// reports a too-small workspace).
pub fn mha_workspace_len(cfg: &MhaConfig, batch: usize, n_q: usize, n_kv: usize) -> usize {
    total(&[projections_len(cfg, batch, n_q, n_kv), count(&[batch, n_q, cfg.o_width()])])
}

/// The projections' region of the workspace (see the module docs), saturating.
fn projections_len(cfg: &MhaConfig, batch: usize, n_q: usize, n_kv: usize) -> usize {
    let qkv = total(&[
        count(&[batch, n_q, cfg.q_width()]),
        count(&[batch, n_kv, cfg.k_width().saturating_add(cfg.v_width())]),
    ]);
    qkv.max(count(&[batch, n_q, cfg.in_dim]))
}

allocating_form! {
    /// The seed's `MultiHeadAttention.forward` on the kernels, allocating its workspace: see
    /// [`multi_head_attention_in`].
    pub fn multi_head_attention<W, A>(
        cfg: &MhaConfig,
        w: &MhaWeights<'_, W>,
        x: TensorRef<'_, A>,
        mask: &Mask<'_>,
        y: TensorMut<'_, A>,
    ) => multi_head_attention_in;
    checks: {
        expect_dim("cfg", "kv_in_dim", cfg.in_dim, cfg.kv_in_dim)?;
        check(cfg, w, (&x, "x"), (&x, "x"), mask, &y)
    };
    workspace: {
        let [batch, _, n, _] = x.layout.dims;
        mha_workspace_len(cfg, batch, n, n)
    };
}

/// Multi-head self-attention into a caller-owned workspace: for each batch `b`, `X = x[b]`,
///
/// `Q = X·Wq + bq`, `K = X·Wk + bk`, `V = X·Wv + bv`, split into heads by columns;
/// `head_h = softmax(Q_h·K_gᵀ / √k_dim + mask)·V_g` with `g = h / (num_heads / kv_heads)`;
/// `y[b] = concat_h(head_h)·Wo + bo`
///
/// with the attention variants `w.variants` on the heads (window, softcap, sinks, ALiBi: see
/// [`Attention`](crate::attention::Attention); the window and ALiBi measure from the mask's
/// causal offset, 0 for self-attention without a causal mask)
/// (the reference's `attn_reference::multi_head_attention`, same conventions: `x`, `y` are
/// `[batch, 1, n, in_dim]`, the mask addresses `[batch, num_heads, n, n]`, a fully masked row
/// gives `y = bo`). `workspace` must hold [`mha_workspace_len`]`(cfg, batch, n, n)` elements;
/// its contents on entry do not matter and on return are unspecified. No activation buffer is
/// allocated (the kernels' own per-thread packing/tile buffers aside).
///
/// The weights (`W`) and the activations `x`, `y` (`A`) are each f32, bf16 or f16: the result
/// is the f32 layer's on the exact values they represent, each output rounded once to `A`
/// (see the [module docs](self)).
///
/// Errors: those of the reference, in the same order; then [`Error::OutOfBounds`] naming
/// `workspace` when it is too short.
///
/// [`Error::OutOfBounds`]: crate::Error::OutOfBounds
pub fn multi_head_attention_in<W: Convertible, A: Convertible>(
    cfg: &MhaConfig,
    w: &MhaWeights<'_, W>,
    x: TensorRef<'_, A>,
    mask: &Mask<'_>,
    y: TensorMut<'_, A>,
    workspace: &mut [f32],
    par: Parallelism,
) -> Result<()> {
    expect_dim("cfg", "kv_in_dim", cfg.in_dim, cfg.kv_in_dim)?;
    forward(cfg, w, (x, "x"), None, mask, y, workspace, par)
}

allocating_form! {
    /// The seed's `CrossAttention.forward` on the kernels, allocating its workspace: see
    /// [`cross_attention_in`].
    pub fn cross_attention<W, A>(
        cfg: &MhaConfig,
        w: &MhaWeights<'_, W>,
        x1: TensorRef<'_, A>,
        x2: TensorRef<'_, A>,
        mask: &Mask<'_>,
        y: TensorMut<'_, A>,
    ) => cross_attention_in;
    checks: check(cfg, w, (&x1, "x1"), (&x2, "x2"), mask, &y);
    workspace: mha_workspace_len(cfg, x1.layout.batch(), x1.layout.seq(), x2.layout.seq());
}

/// Cross-attention into a caller-owned workspace: queries from `x1: [batch, 1, n1, in_dim]`,
/// keys and values from `x2: [batch, 1, n2, kv_in_dim]`, output `y: [batch, 1, n1, in_dim]`:
///
/// `Q = X1·Wq + bq`, `K = X2·Wk + bk`, `V = X2·Wv + bv`;
/// `head_h = softmax(Q_h·K_gᵀ / √k_dim + mask)·V_g`; `y[b] = concat_h(head_h)·Wo + bo`
///
/// (the reference's `attn_reference::cross_attention`; the mask addresses
/// `[batch, num_heads, n1, n2]`). `workspace` must hold
/// [`mha_workspace_len`]`(cfg, batch, n1, n2)` elements. K and V are one GEMM when `wk` and
/// `wv` are adjacent column blocks of one buffer. Element types as for
/// [`multi_head_attention_in`].
///
/// Errors: those of the reference, in the same order; then a too-short `workspace`.
#[allow(clippy::too_many_arguments)] // the reference's arguments plus workspace and threads
pub fn cross_attention_in<W: Convertible, A: Convertible>(
    cfg: &MhaConfig,
    w: &MhaWeights<'_, W>,
    x1: TensorRef<'_, A>,
    x2: TensorRef<'_, A>,
    mask: &Mask<'_>,
    y: TensorMut<'_, A>,
    workspace: &mut [f32],
    par: Parallelism,
) -> Result<()> {
    forward(cfg, w, (x1, "x1"), Some((x2, "x2")), mask, y, workspace, par)
}

layer_type! {
    /// A self-attention layer: its shape and the caller's weights, checked once.
    pub struct MultiHeadAttention<'w> { cfg: MhaConfig, weights: MhaWeights, noun: "layer" }
    /// Checks `cfg` (which must be self-attention) and the weights against it.
    ///
    /// Errors: `cfg.kv_in_dim ≠ cfg.in_dim`, [`MhaConfig::check`], [`MhaWeights::check`].
    fn new(cfg, weights) {
        expect_dim("cfg", "kv_in_dim", cfg.in_dim, cfg.kv_in_dim)?;
    }
    /// Workspace for `batch` sequences of `n` tokens ([`mha_workspace_len`]).
    fn workspace_len(batch, n) = mha_workspace_len(batch, n, n);
    fn forward<A>(x: TensorRef<'_, A>, mask: &Mask<'_>, y: TensorMut<'_, A>) =
        multi_head_attention, multi_head_attention_in;
}

layer_type! {
    /// A cross-attention layer: its shape and the caller's weights, checked once.
    pub struct CrossAttention<'w> { cfg: MhaConfig, weights: MhaWeights, noun: "layer" }
    /// Checks `cfg` and the weights against it.
    ///
    /// Errors: [`MhaConfig::check`], [`MhaWeights::check`].
    fn new(cfg, weights) {}
    /// Workspace for `batch` pairs of sequences of `n1` queries and `n2` keys.
    fn workspace_len(batch, n1, n2) = mha_workspace_len(batch, n1, n2);
    fn forward<A>(
        x1: TensorRef<'_, A>,
        x2: TensorRef<'_, A>,
        mask: &Mask<'_>,
        y: TensorMut<'_, A>
    ) = cross_attention, cross_attention_in;
}

/// The reference's checks, in its order, so both crates reject a call with the same error.
fn check<W: Convertible, A: Convertible, Y: Convertible>(
    cfg: &MhaConfig,
    w: &MhaWeights<'_, W>,
    (x1, x1_arg): (&TensorRef<'_, A>, &'static str),
    (x2, x2_arg): (&TensorRef<'_, A>, &'static str),
    mask: &Mask<'_>,
    y: &TensorMut<'_, Y>,
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
    mask.check(batch, cfg.num_heads, n1, n2)
}

/// Shared body of self- (`x2 = None`: keys from `x1`) and cross-attention; `y` of any type
/// (the encoder block writes f32 into its workspace whatever its activations' type).
#[allow(clippy::too_many_arguments)]
pub(super) fn forward<W: Convertible, A: Convertible, Y: Convertible>(
    cfg: &MhaConfig,
    w: &MhaWeights<'_, W>,
    (x1, x1_arg): (TensorRef<'_, A>, &'static str),
    x2: Option<(TensorRef<'_, A>, &'static str)>,
    mask: &Mask<'_>,
    y: TensorMut<'_, Y>,
    workspace: &mut [f32],
    par: Parallelism,
) -> Result<()> {
    let (x2, x2_arg) = x2.unwrap_or((x1, x1_arg));
    check(cfg, w, (&x1, x1_arg), (&x2, x2_arg), mask, &y)?;
    let [batch, _, n1, _] = x1.layout.dims;
    let n2 = x2.layout.seq();
    workspace::expect_len(workspace, mha_workspace_len(cfg, batch, n1, n2))?;
    if y.layout.is_empty() {
        return Ok(());
    }
    let (h, hkv, dk, dv) = (cfg.num_heads, cfg.kv_heads, cfg.k_dim, cfg.v_dim);
    let (qw, kw, vw, ow) = (cfg.q_width(), cfg.k_width(), cfg.v_width(), cfg.o_width());
    // The checks above bound every product below: the workspace holds them all.
    let mut ws = workspace;
    let proj = take(&mut ws, projections_len(cfg, batch, n1, n2));
    let heads = take(&mut ws, batch * n1 * ow);
    {
        // Projections: Q into a `[batch·n1, q_stride]` buffer at column 0, K and V into a
        // `[batch·n2, kv_stride]` one (the same buffer for self-attention) at columns `k_col`
        // and `k_col + kw`.
        let (q_data, q_stride, kv_data, kv_stride, k_col): (&[f32], usize, &[f32], usize, usize);
        if ptr::eq(x1.data, x2.data) && x1.layout == x2.layout {
            let wid = qw + kw + vw;
            let qkv = &mut proj[..batch * n1 * wid];
            let blocks = [(w.wq, w.bq), (w.wk, w.bk), (w.wv, w.bv)];
            project(x1, &blocks, as_seq(qkv, batch, n1, wid), par)?;
            let qkv: &[f32] = qkv;
            (q_data, q_stride, kv_data, kv_stride, k_col) = (qkv, wid, qkv, wid, qw);
        } else {
            let (q, kv) = proj.split_at_mut(batch * n1 * qw);
            project(x1, &[(w.wq, w.bq)], as_seq(q, batch, n1, qw), par)?;
            let kv = &mut kv[..batch * n2 * (kw + vw)];
            project(x2, &[(w.wk, w.bk), (w.wv, w.bv)], as_seq(kv, batch, n2, kw + vw), par)?;
            (q_data, q_stride, kv_data, kv_stride, k_col) = (q, qw, kv, kw + vw, 0);
        }
        // Heads side by side in a row: the [b, s, h, d] layout, strided.
        let split = |n: usize, hs: usize, d: usize, stride: usize, col: usize| {
            Tensor4Layout::strided([batch, hs, n, d], [n * stride, d, stride, 1], col)
        };
        attention(
            TensorRef::new(q_data, split(n1, h, dk, q_stride, 0)),
            TensorRef::new(kv_data, split(n2, hkv, dk, kv_stride, k_col)),
            TensorRef::new(kv_data, split(n2, hkv, dv, kv_stride, k_col + kw)),
            cfg.scale(),
            mask,
            &w.variants,
            TensorMut::new(&mut *heads, Tensor4Layout::bshd(batch, n1, h, dv)),
            par,
        )?;
    }
    let heads = TensorRef::new(&*heads, Tensor4Layout::batch_seq(batch, n1, ow));
    let TensorMut { data, layout } = y;
    match Y::as_f32_mut(data) {
        Some(data) => project(heads, &[(w.wo, w.bo)], TensorMut::new(data, layout), par),
        None => {
            // Staged in f32 in the projections' region, then rounded once into `y`.
            let stage = &mut proj[..batch * n1 * cfg.in_dim];
            project(heads, &[(w.wo, w.bo)], as_seq(stage, batch, n1, cfg.in_dim), par)?;
            store_rows(stage, TensorMut::new(data, layout))
        }
    }
}

/// `y ← src` rounded to `Y`, for a contiguous `[batch, n, dim]` `src` and a checked
/// `[batch, 1, n, dim]` `y` (its rows converted by vectors where contiguous).
pub(super) fn store_rows<Y: Convertible>(src: &[f32], y: TensorMut<'_, Y>) -> Result<()> {
    let [batch, _, n, dim] = y.layout.dims;
    for (r, row) in src.chunks_exact(dim.max(1)).take(batch * n).enumerate() {
        let (b, s) = (r / n, r % n);
        if y.layout.strides[3] == 1 {
            let at = y.layout.index(b, 0, s, 0);
            convert_slice(row, &mut y.data[at..at + dim])?;
        } else {
            for (d, &v) in row.iter().enumerate() {
                y.data[y.layout.index(b, 0, s, d)] = Y::from_f32(v);
            }
        }
    }
    Ok(())
}

/// A contiguous `[batch, n, width]` buffer as a `[batch, 1, n, width]` tensor.
fn as_seq(buf: &mut [f32], batch: usize, n: usize, width: usize) -> TensorMut<'_> {
    TensorMut::new(buf, Tensor4Layout::batch_seq(batch, n, width))
}

/// `y[:, :, :, block j columns] = x · W_j + b_j` for the weight blocks in order, their output
/// columns side by side in `y` (`[batch, 1, n, Σ cols]`, checked by the caller along with `x`
/// and the weights).
///
/// Consecutive blocks whose weights are adjacent column ranges of one buffer (slices starting
/// at the same address, same strides, the next block starting where the previous ends) are merged into one GEMM over the
/// combined view: the fused QKV projection, found from the caller's layout rather than by
/// copying weights. Biases are written into their column ranges first (zeros for a block without
/// one, when another in its group has one) and the GEMM accumulates with β = 1.
fn project<X: Convertible, W: Convertible>(
    x: TensorRef<'_, X>,
    blocks: &[(MatRef<'_, W>, Option<&[W]>)],
    y: TensorMut<'_>,
    par: Parallelism,
) -> Result<()> {
    let batch = x.layout.batch();
    let mut col = 0;
    let mut i = 0;
    while i < blocks.len() {
        // Grow the group while the next block continues this one's columns.
        let mut wl = blocks[i].0.layout;
        let mut end = i + 1;
        while end < blocks.len() && continues(&blocks[end - 1].0, &blocks[end].0) {
            wl.cols += blocks[end].0.layout.cols;
            end += 1;
        }
        // The group's blocks share their first element's address; the longest slice covers
        // the merged view (the last block's reaches its end).
        let data = blocks[i..end].iter().map(|(w, _)| w.data).max_by_key(|d| d.len());
        let wmat = MatRef::new(data.unwrap_or(blocks[i].0.data), wl);
        let has_bias = blocks[i..end].iter().any(|(_, b)| b.is_some());
        let yl = columns(&y.layout, col, wl.cols);
        match (fold_batch(&x.layout), fold_batch(&yl)) {
            (Some(xm), Some(ym)) => {
                let mut ym = MatMut::new(y.data, ym);
                if has_bias {
                    fill_biases(&mut ym, &blocks[i..end]);
                }
                gemm(1.0, MatRef::new(x.data, xm), wmat, f32::from(has_bias), ym, par)?;
            }
            _ => {
                for b in 0..batch {
                    let mut ym = MatMut::new(y.data, yl.matrix(b, 0));
                    if has_bias {
                        fill_biases(&mut ym, &blocks[i..end]);
                    }
                    gemm(1.0, x.matrix(b, 0), wmat, f32::from(has_bias), ym, par)?;
                }
            }
        }
        col += wl.cols;
        i = end;
    }
    Ok(())
}

/// True when `b` is the column range of `a`'s buffer right after `a`'s: both slices start at
/// the same address (their lengths may differ: through the C ABI each view's slice ends at its
/// own last element) and `b`'s offset is where `a`'s columns end.
fn continues<W>(a: &MatRef<'_, W>, b: &MatRef<'_, W>) -> bool {
    let (la, lb) = (a.layout, b.layout);
    ptr::eq(a.data.as_ptr(), b.data.as_ptr())
        && la.rows == lb.rows
        && la.row_stride == lb.row_stride
        && la.col_stride == lb.col_stride
        && la.cols.checked_mul(la.col_stride).and_then(|s| s.checked_add(la.offset))
            == Some(lb.offset)
}

/// Columns `col .. col + cols` of a `[batch, 1, n, width]` tensor.
fn columns(t: &Tensor4Layout, col: usize, cols: usize) -> Tensor4Layout {
    let mut sub = *t;
    sub.dims[3] = cols;
    sub.offset += col * t.strides[3];
    sub
}

/// Writes each block's bias (or zeros) into its columns of every row of `y`.
fn fill_biases<W: Convertible>(y: &mut MatMut<'_>, blocks: &[(MatRef<'_, W>, Option<&[W]>)]) {
    let mut col = 0;
    for (w, b) in blocks {
        let cols = w.layout.cols;
        let l = y.layout;
        let sub = MatLayout::strided(l.rows, cols, l.row_stride, l.col_stride, l.index(0, col));
        fill_rows(&mut MatMut::new(y.data, sub), *b);
        col += cols;
    }
}
