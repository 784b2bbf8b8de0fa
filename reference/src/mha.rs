//! The seed's `MultiHeadAttention` and `CrossAttention` modules: Q/K/V projections, per-head
//! scaled dot-product attention, concatenation of the heads and the output projection.
//!
//! The layer's shape lives in [`MhaConfig`], its caller-owned weights in [`MhaWeights`]; the
//! kernels' layers take the same two descriptors. Activations are batches of sequences,
//! `[batch, 1, n, dim]` tensors (see [`Tensor4Layout::batch_seq`]).

use crate::alloc;
use crate::attention::{attention, default_scale};
use crate::error::{expect_dim, Error, Result};
use crate::linear::linear;
use crate::mask::Mask;
use crate::shape::{MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};

/// The shape of a multi-head attention layer (self- or cross-attention).
///
/// Queries come from an input of width `in_dim`, keys and values from one of width `kv_in_dim`
/// (equal to `in_dim` for self-attention). Each of the `num_heads` query heads has width
/// `k_dim`; the `kv_heads` key/value heads have widths `k_dim` and `v_dim` (`k_dim ≠ v_dim` is
/// allowed). `kv_heads = num_heads` is ordinary multi-head attention, a divisor of it is GQA,
/// 1 is MQA: query head `h` reads K/V head `h / (num_heads / kv_heads)`. The output has width
/// `in_dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MhaConfig {
    /// Width of the query-side input and of the output (the seed's `in_dim`, `in_dim1`).
    pub in_dim: usize,
    /// Width of the key/value-side input (the seed's `in_dim2`; `in_dim` for self-attention).
    pub kv_in_dim: usize,
    /// Per-head width of queries and keys.
    pub k_dim: usize,
    /// Per-head width of values.
    pub v_dim: usize,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads; must divide `num_heads`.
    pub kv_heads: usize,
}

impl MhaConfig {
    /// Self-attention as the seed's `MultiHeadAttention(in_dim, k_dim, v_dim, num_heads)`.
    pub const fn new(in_dim: usize, k_dim: usize, v_dim: usize, num_heads: usize) -> Self {
        Self { in_dim, kv_in_dim: in_dim, k_dim, v_dim, num_heads, kv_heads: num_heads }
    }

    /// Cross-attention as the seed's `CrossAttention(in_dim1, in_dim2, k_dim, v_dim, num_heads)`.
    pub const fn cross(
        in_dim1: usize,
        in_dim2: usize,
        k_dim: usize,
        v_dim: usize,
        num_heads: usize,
    ) -> Self {
        Self { in_dim: in_dim1, kv_in_dim: in_dim2, k_dim, v_dim, num_heads, kv_heads: num_heads }
    }

    /// The same layer with `kv_heads` key/value heads (GQA; 1 for MQA).
    pub const fn with_kv_heads(self, kv_heads: usize) -> Self {
        Self { kv_heads, ..self }
    }

    /// PyTorch's `nn.MultiheadAttention(embed_dim, num_heads)` shape: every head has width
    /// `embed_dim / num_heads`.
    ///
    /// Errors: `num_heads = 0`; `num_heads` not dividing `embed_dim`.
    pub fn from_embed_dim(embed_dim: usize, num_heads: usize) -> Result<Self> {
        if num_heads == 0 {
            return Err(Error::ZeroHeads { arg: "num_heads" });
        }
        if embed_dim % num_heads != 0 {
            return Err(Error::HeadsNotDivisible {
                arg: "embed_dim",
                hidden: embed_dim,
                heads: num_heads,
            });
        }
        let head = embed_dim / num_heads;
        Ok(Self::new(embed_dim, head, head, num_heads))
    }

    /// Checks the head counts and that the projection widths fit in `usize`.
    ///
    /// Errors: `num_heads = 0` or `kv_heads = 0` ([`Error::ZeroHeads`]), `kv_heads` not dividing
    /// `num_heads` ([`Error::KvHeadsNotDividing`]).
    pub fn check(&self) -> Result<()> {
        if self.num_heads == 0 {
            return Err(Error::ZeroHeads { arg: "num_heads" });
        }
        if self.kv_heads == 0 {
            return Err(Error::ZeroHeads { arg: "kv_heads" });
        }
        if self.num_heads % self.kv_heads != 0 {
            return Err(Error::KvHeadsNotDividing {
                q_heads: self.num_heads,
                kv_heads: self.kv_heads,
            });
        }
        alloc::product("k_dim", &[self.num_heads, self.k_dim])?;
        alloc::product("v_dim", &[self.num_heads, self.v_dim])?;
        Ok(())
    }

    /// Width of the query projection, `num_heads · k_dim` (saturating).
    pub const fn q_width(&self) -> usize {
        self.num_heads.saturating_mul(self.k_dim)
    }
    /// Width of the key projection, `kv_heads · k_dim` (saturating).
    pub const fn k_width(&self) -> usize {
        self.kv_heads.saturating_mul(self.k_dim)
    }
    /// Width of the value projection, `kv_heads · v_dim` (saturating).
    pub const fn v_width(&self) -> usize {
        self.kv_heads.saturating_mul(self.v_dim)
    }
    /// Width of the concatenated heads, `num_heads · v_dim` (saturating).
    pub const fn o_width(&self) -> usize {
        self.num_heads.saturating_mul(self.v_dim)
    }
    /// The score scale, `1/√k_dim` as in the seed.
    pub fn scale(&self) -> f32 {
        default_scale(self.k_dim)
    }
}

/// Caller-owned weights of a multi-head attention layer, each `[in, out]` so that `y = x·W + b`
/// (see [`linear`]; a PyTorch `[out, in]` weight is its transposed view).
///
/// Shapes for a config `c`: `wq: [c.in_dim, c.q_width()]`, `wk: [c.kv_in_dim, c.k_width()]`,
/// `wv: [c.kv_in_dim, c.v_width()]`, `wo: [c.o_width(), c.in_dim]`; biases of the matching
/// output widths. Columns `h·k_dim .. (h+1)·k_dim` of the Q projection belong to head `h` (the
/// seed's `view(batch, n, heads, k_dim)`), likewise for K, V and the concatenated output.
#[derive(Clone, Copy, Debug)]
pub struct MhaWeights<'a> {
    /// Query projection.
    pub wq: MatRef<'a>,
    /// Key projection.
    pub wk: MatRef<'a>,
    /// Value projection.
    pub wv: MatRef<'a>,
    /// Output projection.
    pub wo: MatRef<'a>,
    /// Query bias (the seed has none).
    pub bq: Option<&'a [f32]>,
    /// Key bias (the seed has none).
    pub bk: Option<&'a [f32]>,
    /// Value bias (the seed has none).
    pub bv: Option<&'a [f32]>,
    /// Output bias (the seed's `proj_o` has one).
    pub bo: Option<&'a [f32]>,
}

impl MhaWeights<'_> {
    /// Checks every weight's shape against `cfg` and every view against its slice.
    ///
    /// Errors: [`Error::ShapeMismatch`] naming `wq`, `wk`, `wv`, `wo`, `bq`, `bk`, `bv` or `bo`;
    /// [`Error::OutOfBounds`] / [`Error::IndexOverflow`] for a view overrunning its slice.
    pub fn check(&self, cfg: &MhaConfig) -> Result<()> {
        let mats = [
            ("wq", &self.wq, cfg.in_dim, cfg.q_width()),
            ("wk", &self.wk, cfg.kv_in_dim, cfg.k_width()),
            ("wv", &self.wv, cfg.kv_in_dim, cfg.v_width()),
            ("wo", &self.wo, cfg.o_width(), cfg.in_dim),
        ];
        for (arg, w, rows, cols) in mats {
            w.layout.expect_shape(arg, rows, cols)?;
            w.check(arg)?;
        }
        let biases = [
            ("bq", self.bq, cfg.q_width()),
            ("bk", self.bk, cfg.k_width()),
            ("bv", self.bv, cfg.v_width()),
            ("bo", self.bo, cfg.in_dim),
        ];
        for (arg, b, len) in biases {
            if let Some(b) = b {
                expect_dim(arg, "len", len, b.len())?;
            }
        }
        Ok(())
    }
}

/// The seed's `MultiHeadAttention.forward`: for each batch `b`, with `X = x[b]: [n, in_dim]`,
///
/// `Q = X·Wq + bq`, `K = X·Wk + bk`, `V = X·Wv + bv`, split into heads by columns;
/// `head_h = softmax(Q_h·K_gᵀ / √k_dim + mask)·V_g` with `g = h / (num_heads / kv_heads)`;
/// `y[b] = concat_h(head_h)·Wo + bo`.
///
/// `x` and `y` are `[batch, 1, n, in_dim]` tensors ([`Tensor4Layout::batch_seq`] for contiguous
/// `[batch, n, in_dim]` storage). The mask addresses `[batch, num_heads, n, n]`; unlike the
/// seed's −1e9 fill, a fully masked row contributes a zero attention row (so that row of `y` is
/// `bo`). Each stage (projections, attention, output projection) is a reference call that
/// accumulates in f64 and rounds its result to f32, as an f32 engine does between stages.
/// `n = 0` or `batch = 0` gives an empty output.
///
/// Errors: the config ([`MhaConfig::check`]), `cfg.kv_in_dim ≠ cfg.in_dim`, the weights
/// ([`MhaWeights::check`]), `x` with more than one head or a width other than `in_dim`, `y` ≠
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
/// `[batch, num_heads, n1, n2]` (a causal mask's default offset is `n2 − n1`). `n2 = 0` gives
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
    attention(
        TensorRef::new(&q, Tensor4Layout::bshd(batch, n1, h, dk)),
        TensorRef::new(&k, Tensor4Layout::bshd(batch, n2, hkv, dk)),
        TensorRef::new(&v, Tensor4Layout::bshd(batch, n2, hkv, dv)),
        cfg.scale(),
        mask,
        TensorMut::new(&mut o, Tensor4Layout::bshd(batch, n1, h, dv)),
        None,
    )?;
    for b in 0..batch {
        linear(MatRef::new(&o, slab(b, n1, ow)), w.wo, w.bo, y.matrix_mut(b, 0))?;
    }
    Ok(())
}
