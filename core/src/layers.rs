//! The layers' descriptors: the shape of a multi-head (or cross-) attention layer, of an encoder
//! block and of its feed-forward, and the caller-owned weights of each, with the checks that
//! every implementation runs first. Weights are `[in, out]` (`y = x·W + b`); activations are
//! `[batch, 1, seq, dim]` tensors ([`Tensor4Layout::batch_seq`](crate::Tensor4Layout::batch_seq)).
//!
//! Every weight type has an element type parameter `T`, `f32` by default: engines keep their
//! weights in bf16 or f16, and the kernels' layers take them as they are (widened exactly, the
//! products accumulated in f32). The checks here are the same for every `T`.

use crate::attention::default_scale;
use crate::error::{checked_product, expect_dim, expect_finite, Error, Result};
use crate::shape::MatRef;
use crate::variants::Variants;

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
        if !embed_dim.is_multiple_of(num_heads) {
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
        if !self.num_heads.is_multiple_of(self.kv_heads) {
            return Err(Error::KvHeadsNotDividing {
                q_heads: self.num_heads,
                kv_heads: self.kv_heads,
            });
        }
        checked_product("k_dim", &[self.num_heads, self.k_dim])?;
        checked_product("v_dim", &[self.num_heads, self.v_dim])?;
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
/// (a PyTorch `[out, in]` weight is its transposed view).
///
/// Shapes for a config `c`: `wq: [c.in_dim, c.q_width()]`, `wk: [c.kv_in_dim, c.k_width()]`,
/// `wv: [c.kv_in_dim, c.v_width()]`, `wo: [c.o_width(), c.in_dim]`; biases of the matching
/// output widths. Columns `h·k_dim .. (h+1)·k_dim` of the Q projection belong to head `h` (the
/// seed's `view(batch, n, heads, k_dim)`), likewise for K, V and the concatenated output.
///
/// `variants` are the layer's attention [`Variants`] (sliding window, logit softcap, sinks,
/// ALiBi; [`Variants::NONE`] for plain attention): they belong to a layer as its weights do (a
/// gpt-oss layer has its own learned sinks and its own window, Gemma 2 alternates local and
/// global layers), so they are set up with it and every call of it uses them. Sinks and slopes
/// hold one value per query head (`c.num_heads`).
///
/// `T` is the element type of the matrices and biases (`f32`, or `bf16`/`f16` for the kernels'
/// layers); the sinks and slopes of the variants stay f32.
#[derive(Clone, Copy, Debug)]
pub struct MhaWeights<'a, T = f32> {
    /// Query projection.
    pub wq: MatRef<'a, T>,
    /// Key projection.
    pub wk: MatRef<'a, T>,
    /// Value projection.
    pub wv: MatRef<'a, T>,
    /// Output projection.
    pub wo: MatRef<'a, T>,
    /// Query bias (the seed has none).
    pub bq: Option<&'a [T]>,
    /// Key bias (the seed has none).
    pub bk: Option<&'a [T]>,
    /// Value bias (the seed has none).
    pub bv: Option<&'a [T]>,
    /// Output bias (the seed's `proj_o` has one).
    pub bo: Option<&'a [T]>,
    /// The heads' attention variants ([`Variants::NONE`]: plain attention).
    pub variants: Variants<'a>,
}

impl<T: Copy> MhaWeights<'_, T> {
    /// Checks every weight's shape against `cfg` and every view against its slice, then the
    /// variants against `cfg.num_heads` ([`Variants::check`]).
    ///
    /// Errors: [`Error::ShapeMismatch`] naming `wq`, `wk`, `wv`, `wo`, `bq`, `bk`, `bv` or `bo`;
    /// [`Error::OutOfBounds`] / [`Error::IndexOverflow`] for a view overrunning its slice; those
    /// of [`Variants::check`] (`softcap`, `sinks`, `alibi`).
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
        self.variants.check(cfg.num_heads)
    }
}

/// The feed-forward activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// `max(x, 0)`, the original transformer's choice (the default).
    #[default]
    Relu,
    /// GELU, tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (BERT, GPT-2).
    GeluTanh,
}

/// Caller-owned weights of the two-layer feed-forward: `w1: [d, ff]`, `b1: [ff]`,
/// `w2: [ff, d_out]`, `b2: [d_out]`.
#[derive(Clone, Copy, Debug)]
pub struct FeedForwardWeights<'a, T = f32> {
    /// First layer, `[d, ff]`.
    pub w1: MatRef<'a, T>,
    /// First bias, `[ff]`.
    pub b1: Option<&'a [T]>,
    /// Second layer, `[ff, d_out]`.
    pub w2: MatRef<'a, T>,
    /// Second bias, `[d_out]`.
    pub b2: Option<&'a [T]>,
}

impl<T: Copy> FeedForwardWeights<'_, T> {
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
pub struct EncoderWeights<'a, T = f32> {
    /// Self-attention weights.
    pub attn: MhaWeights<'a, T>,
    /// Layer norm after the attention residual (`[d]` each).
    pub norm1: LayerNormWeights<'a, T>,
    /// Feed-forward weights (`w1: [d, ff_dim]`, `w2: [ff_dim, d]`).
    pub ff: FeedForwardWeights<'a, T>,
    /// Layer norm after the feed-forward residual (`[d]` each).
    pub norm2: LayerNormWeights<'a, T>,
}

impl<T: Copy> EncoderWeights<'_, T> {
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

/// The learned affine parameters of a layer norm over `d` features.
#[derive(Clone, Copy, Debug)]
pub struct LayerNormWeights<'a, T = f32> {
    /// Scale γ, `[d]`.
    pub gamma: &'a [T],
    /// Shift β, `[d]`.
    pub beta: &'a [T],
}

/// Checks a layer-norm epsilon: finite and ≥ 0.
pub fn check_eps(eps: f32) -> Result<()> {
    expect_finite("eps", eps)?;
    if eps < 0.0 {
        return Err(Error::InvalidParameter { arg: "eps", requirement: "must be >= 0" });
    }
    Ok(())
}

/// Which position vectors `e_pos` are added to the input.
#[derive(Clone, Copy, Debug)]
pub enum PositionalEncoding<'a> {
    /// `e_pos` from the sinusoidal table `PE(pos, 2i) = sin(pos / 10000^(2i/d))`,
    /// `PE(pos, 2i+1) = cos(pos / 10000^(2i/d))`; the first row of every sequence is position
    /// `start` (non-zero when continuing a sequence, e.g. behind a KV cache).
    Sinusoidal {
        /// Position of the first row.
        start: usize,
    },
    /// A learned table `[max_pos, d]`: row `start + s` is added to sequence position `s`.
    Learned {
        /// The table.
        table: MatRef<'a>,
        /// Table row of the first sequence position.
        start: usize,
    },
}
