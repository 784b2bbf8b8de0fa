//! The reference's bad-input table: every public entry point rejects malformed arguments with
//! the shared typed [`Error`], every variant is produced somewhere, and every message names the
//! argument and the sizes. Then hostile-but-valid sizes (empty views with huge dimensions) that
//! must return quickly without a panic.

use attn_reference::attention::attention;
use attn_reference::matmul::matmul;
use attn_reference::softmax::{log_softmax, logsumexp, scale_mask_softmax, softmax};
use attn_reference::*;

/// One row of the table: what was called, what it returned, the error it must return, and the
/// fragments its message must contain.
struct Case {
    what: &'static str,
    got: Result<()>,
    want: Error,
    says: &'static [&'static str],
}

/// Position of a variant in the enum. Exhaustive on purpose: a new variant fails to compile
/// here until the table exercises it.
fn variant(e: &Error) -> usize {
    match e {
        Error::ShapeMismatch { .. } => 0,
        Error::OutOfBounds { .. } => 1,
        Error::IndexOverflow { .. } => 2,
        Error::AliasedOutput { .. } => 3,
        Error::ZeroHeads { .. } => 4,
        Error::HeadsNotDivisible { .. } => 5,
        Error::KvHeadsNotDividing { .. } => 6,
        Error::NonFinite { .. } => 7,
        Error::InvalidParameter { .. } => 8,
    }
}
const VARIANTS: usize = 9;

fn shape(arg: &'static str, dim: &'static str, expected: usize, actual: usize) -> Error {
    Error::ShapeMismatch { arg, dim, expected, actual }
}

const Z: [f32; 64] = [0.5; 64];

fn rm(rows: usize, cols: usize) -> MatRef<'static> {
    MatRef::row_major(&Z[..rows * cols], rows, cols)
}

fn bhsd(b: usize, h: usize, s: usize, d: usize) -> TensorRef<'static> {
    TensorRef::new(&Z[..b * h * s * d], Tensor4Layout::bhsd(b, h, s, d))
}

/// A valid MHA config, its weights and a 1 × 3 × 4 input, for the layer rows.
struct Layer {
    cfg: MhaConfig,
}

impl Layer {
    fn weights(&self) -> MhaWeights<'static> {
        let c = &self.cfg;
        MhaWeights {
            wq: rm(c.in_dim, c.q_width()),
            wk: rm(c.kv_in_dim, c.k_width()),
            wv: rm(c.kv_in_dim, c.v_width()),
            wo: rm(c.o_width(), c.in_dim),
            bq: None,
            bk: None,
            bv: None,
            bo: Some(&Z[..c.in_dim]),
            variants: Variants::NONE,
        }
    }
}

fn mha(cfg: MhaConfig, w: Option<MhaWeights<'_>>, x: TensorRef<'_>, mask: &Mask<'_>) -> Result<()> {
    let w = w.unwrap_or_else(|| Layer { cfg }.weights());
    let mut y = vec![0.0; 3 * 4];
    multi_head_attention(
        &cfg,
        &w,
        x,
        mask,
        TensorMut::new(&mut y, Tensor4Layout::batch_seq(1, 3, 4)),
    )
}

fn seq(n: usize, d: usize) -> TensorRef<'static> {
    TensorRef::new(&Z[..n * d], Tensor4Layout::batch_seq(1, n, d))
}

fn cases() -> Vec<Case> {
    let cfg = MhaConfig::new(4, 2, 2, 2);
    let layer = Layer { cfg };
    let ff = FeedForwardWeights { w1: rm(4, 6), b1: None, w2: rm(6, 4), b2: None };
    let ln = LayerNormWeights { gamma: &Z[..4], beta: &Z[..4] };
    let enc_cfg = EncoderConfig { attn: cfg, ff_dim: 6, activation: Activation::Relu, eps: 1e-5 };
    let enc_w = EncoderWeights { attn: layer.weights(), norm1: ln, ff, norm2: ln };
    let enc = |cfg: &EncoderConfig, w: &EncoderWeights<'_>| {
        let mut y = vec![0.0; 12];
        encoder_block(
            cfg,
            w,
            seq(3, 4),
            &Mask::None,
            TensorMut::new(&mut y, Tensor4Layout::batch_seq(1, 3, 4)),
        )
    };
    let keep = [true; 9];
    let mut buf = vec![0.0f32; 64];
    let mut lse = vec![0.0f32; 64];

    let mut c = vec![
        // ---- matmul
        Case {
            what: "matmul: inner dimensions disagree",
            got: matmul(1.0, rm(2, 3), rm(4, 2), 0.0, MatMut::row_major(&mut buf[..4], 2, 2)),
            want: shape("b", "rows", 3, 4),
            says: &["`b`", "rows must be 3, got 4"],
        },
        Case {
            what: "matmul: C has the wrong shape",
            got: matmul(1.0, rm(2, 3), rm(3, 2), 0.0, MatMut::row_major(&mut buf[..6], 2, 3)),
            want: shape("c", "cols", 2, 3),
            says: &["`c`", "cols must be 2, got 3"],
        },
        Case {
            what: "matmul: A overruns its slice",
            got: matmul(
                1.0,
                MatRef::row_major(&Z[..5], 2, 3),
                rm(3, 2),
                0.0,
                MatMut::row_major(&mut buf[..4], 2, 2),
            ),
            want: Error::OutOfBounds { arg: "a", required: 6, len: 5 },
            says: &["`a`", "needs 6 elements", "has 5"],
        },
        Case {
            what: "matmul: B offset overruns its slice",
            got: matmul(
                1.0,
                rm(2, 3),
                MatRef::new(&Z[..6], MatLayout::strided(3, 2, 2, 1, 1)),
                0.0,
                MatMut::row_major(&mut buf[..4], 2, 2),
            ),
            want: Error::OutOfBounds { arg: "b", required: 7, len: 6 },
            says: &["`b`", "needs 7", "has 6"],
        },
        Case {
            what: "matmul: strides overflow usize",
            got: matmul(
                1.0,
                MatRef::new(&Z, MatLayout::strided(2, 2, usize::MAX, 1, 0)),
                rm(2, 2),
                0.0,
                MatMut::row_major(&mut buf[..4], 2, 2),
            ),
            want: Error::IndexOverflow { arg: "a" },
            says: &["`a`", "overflow"],
        },
        Case {
            what: "matmul: C rows alias (zero row stride)",
            got: matmul(
                1.0,
                rm(2, 2),
                rm(2, 2),
                0.0,
                MatMut::new(&mut buf[..4], MatLayout::strided(2, 2, 0, 1, 0)),
            ),
            want: Error::AliasedOutput { arg: "c" },
            says: &["`c`", "zero stride"],
        },
        Case {
            what: "matmul: NaN alpha",
            got: matmul(f32::NAN, rm(2, 2), rm(2, 2), 0.0, MatMut::row_major(&mut buf[..4], 2, 2)),
            want: Error::NonFinite { arg: "alpha", value: f32::NAN },
            says: &["`alpha`", "finite", "NaN"],
        },
        Case {
            what: "matmul: infinite beta",
            got: matmul(
                1.0,
                rm(2, 2),
                rm(2, 2),
                f32::INFINITY,
                MatMut::row_major(&mut buf[..4], 2, 2),
            ),
            want: Error::NonFinite { arg: "beta", value: f32::INFINITY },
            says: &["`beta`", "inf"],
        },
        // ---- linear
        Case {
            what: "linear: W rows ≠ x cols",
            got: linear(rm(3, 4), rm(5, 2), None, MatMut::row_major(&mut buf[..6], 3, 2)),
            want: shape("w", "rows", 4, 5),
            says: &["`w`", "rows must be 4, got 5"],
        },
        Case {
            what: "linear: bias length",
            got: linear(rm(3, 4), rm(4, 2), Some(&Z[..3]), MatMut::row_major(&mut buf[..6], 3, 2)),
            want: shape("b", "len", 2, 3),
            says: &["`b`", "len must be 2, got 3"],
        },
        Case {
            what: "linear: y rows",
            got: linear(rm(3, 4), rm(4, 2), None, MatMut::row_major(&mut buf[..4], 2, 2)),
            want: shape("y", "rows", 3, 2),
            says: &["`y`", "rows must be 3, got 2"],
        },
        Case {
            what: "linear: x overruns",
            got: linear(
                MatRef::row_major(&Z[..11], 3, 4),
                rm(4, 2),
                None,
                MatMut::row_major(&mut buf[..6], 3, 2),
            ),
            want: Error::OutOfBounds { arg: "x", required: 12, len: 11 },
            says: &["`x`", "12", "11"],
        },
        // ---- scores
        Case {
            what: "scores: q and k widths differ",
            got: dot_product_scores(rm(2, 3), rm(4, 5), MatMut::row_major(&mut buf[..8], 2, 4)),
            want: shape("k", "cols", 3, 5),
            says: &["`k`", "cols must be 3, got 5"],
        },
        Case {
            what: "scores: s shape",
            got: dot_product_scores(rm(2, 3), rm(4, 3), MatMut::row_major(&mut buf[..6], 2, 3)),
            want: shape("s", "cols", 4, 3),
            says: &["`s`", "cols must be 4, got 3"],
        },
        Case {
            what: "scaled scores: infinite scale",
            got: scaled_dot_product_scores(
                rm(2, 3),
                rm(4, 3),
                f32::NEG_INFINITY,
                MatMut::row_major(&mut buf[..8], 2, 4),
            ),
            want: Error::NonFinite { arg: "scale", value: f32::NEG_INFINITY },
            says: &["`scale`", "-inf"],
        },
        Case {
            what: "scores: k overruns",
            got: dot_product_scores(
                rm(2, 3),
                MatRef::row_major(&Z[..11], 4, 3),
                MatMut::row_major(&mut buf[..8], 2, 4),
            ),
            want: Error::OutOfBounds { arg: "k", required: 12, len: 11 },
            says: &["`k`", "12", "11"],
        },
        Case {
            what: "additive: Wk rows ≠ key width",
            got: additive_scores(
                rm(2, 3),
                rm(4, 5),
                &AdditiveWeights { wq: rm(3, 2), wk: rm(4, 2), w: &Z[..2] },
                MatMut::row_major(&mut buf[..8], 2, 4),
            ),
            want: shape("wk", "rows", 5, 4),
            says: &["`wk`", "rows must be 5, got 4"],
        },
        Case {
            what: "additive: w length ≠ hidden width",
            got: additive_scores(
                rm(2, 3),
                rm(4, 5),
                &AdditiveWeights { wq: rm(3, 2), wk: rm(5, 2), w: &Z[..3] },
                MatMut::row_major(&mut buf[..8], 2, 4),
            ),
            want: shape("w", "len", 2, 3),
            says: &["`w`", "len must be 2, got 3"],
        },
        Case {
            what: "additive: Wq rows ≠ query width",
            got: additive_scores(
                rm(2, 3),
                rm(4, 5),
                &AdditiveWeights { wq: rm(2, 2), wk: rm(5, 2), w: &Z[..2] },
                MatMut::row_major(&mut buf[..8], 2, 4),
            ),
            want: shape("wq", "rows", 3, 2),
            says: &["`wq`", "rows must be 3, got 2"],
        },
        // ---- softmax family
        Case {
            what: "softmax: y shape",
            got: softmax(rm(2, 3), MatMut::row_major(&mut buf[..4], 2, 2)),
            want: shape("y", "dim", 3, 2),
            says: &["`y`", "dim must be 3, got 2"],
        },
        Case {
            what: "log_softmax: x overruns (was an index panic)",
            got: log_softmax(
                MatRef::row_major(&Z[..5], 2, 3),
                MatMut::row_major(&mut buf[..6], 2, 3),
            ),
            want: Error::OutOfBounds { arg: "x", required: 6, len: 5 },
            says: &["`x`", "needs 6", "has 5"],
        },
        Case {
            what: "logsumexp: x overruns",
            got: logsumexp(MatRef::row_major(&Z[..5], 2, 3)).map(drop),
            want: Error::OutOfBounds { arg: "x", required: 6, len: 5 },
            says: &["`x`", "needs 6"],
        },
        Case {
            what: "logsumexp: an empty view whose row count cannot be allocated",
            got: logsumexp(MatRef::row_major(&[], usize::MAX / 2, 0)).map(drop),
            want: Error::InvalidParameter {
                arg: "x",
                requirement: "the sizes imply a scratch buffer that cannot be allocated",
            },
            says: &["`x`", "cannot be allocated"],
        },
        Case {
            what: "scale_mask_softmax: NaN scale",
            got: scale_mask_softmax(
                bhsd(1, 1, 2, 3),
                f32::NAN,
                &Mask::None,
                TensorMut::new(&mut buf[..6], Tensor4Layout::bhsd(1, 1, 2, 3)),
                None,
            ),
            want: Error::NonFinite { arg: "scale", value: f32::NAN },
            says: &["`scale`", "NaN"],
        },
        Case {
            what: "scale_mask_softmax: mask nk",
            got: scale_mask_softmax(
                bhsd(1, 1, 2, 3),
                1.0,
                &Mask::keep_mat(&keep, 1, 1, 2, 4),
                TensorMut::new(&mut buf[..6], Tensor4Layout::bhsd(1, 1, 2, 3)),
                None,
            ),
            want: shape("mask", "nk", 3, 4),
            says: &["`mask`", "nk must be 3, got 4"],
        },
        Case {
            what: "scale_mask_softmax: mask slice too short",
            got: scale_mask_softmax(
                bhsd(1, 1, 2, 3),
                1.0,
                &Mask::keep_mat(&keep[..5], 1, 1, 2, 3),
                TensorMut::new(&mut buf[..6], Tensor4Layout::bhsd(1, 1, 2, 3)),
                None,
            ),
            want: Error::OutOfBounds { arg: "mask", required: 6, len: 5 },
            says: &["`mask`", "needs 6", "has 5"],
        },
        Case {
            what: "scale_mask_softmax: lse length",
            got: scale_mask_softmax(
                bhsd(1, 2, 2, 3),
                1.0,
                &Mask::None,
                TensorMut::new(&mut buf[..12], Tensor4Layout::bhsd(1, 2, 2, 3)),
                Some(&mut lse[..3]),
            ),
            want: shape("lse", "len", 4, 3),
            says: &["`lse`", "len must be 4, got 3"],
        },
        Case {
            what: "scale_mask_softmax: y aliased over heads",
            got: scale_mask_softmax(
                bhsd(1, 2, 2, 3),
                1.0,
                &Mask::None,
                TensorMut::new(
                    &mut buf[..6],
                    Tensor4Layout::strided([1, 2, 2, 3], [0, 0, 3, 1], 0),
                ),
                None,
            ),
            want: Error::AliasedOutput { arg: "y" },
            says: &["`y`", "zero stride"],
        },
        // ---- attention
        Case {
            what: "attention: zero query heads",
            got: attention(
                bhsd(1, 0, 2, 3),
                bhsd(1, 1, 2, 3),
                bhsd(1, 1, 2, 3),
                1.0,
                &Mask::None,
                TensorMut::new(&mut buf[..0], Tensor4Layout::bhsd(1, 0, 2, 3)),
                None,
            ),
            want: Error::ZeroHeads { arg: "q" },
            says: &["`q`", "heads must be > 0, got 0"],
        },
        Case {
            what: "attention: zero K/V heads",
            got: attention(
                bhsd(1, 2, 2, 3),
                bhsd(1, 0, 2, 3),
                bhsd(1, 0, 2, 3),
                1.0,
                &Mask::None,
                TensorMut::new(&mut buf[..12], Tensor4Layout::bhsd(1, 2, 2, 3)),
                None,
            ),
            want: Error::ZeroHeads { arg: "k" },
            says: &["`k`", "got 0"],
        },
        Case {
            what: "attention: 2 K/V heads for 3 query heads",
            got: attention(
                bhsd(1, 3, 2, 3),
                bhsd(1, 2, 2, 3),
                bhsd(1, 2, 2, 3),
                1.0,
                &Mask::None,
                TensorMut::new(&mut buf[..18], Tensor4Layout::bhsd(1, 3, 2, 3)),
                None,
            ),
            want: Error::KvHeadsNotDividing { q_heads: 3, kv_heads: 2 },
            says: &["`kv_heads`", "2 K/V heads must divide 3 query heads"],
        },
        Case {
            what: "attention: key width ≠ query width",
            got: attention(
                bhsd(1, 1, 2, 3),
                bhsd(1, 1, 2, 4),
                bhsd(1, 1, 2, 3),
                1.0,
                &Mask::None,
                TensorMut::new(&mut buf[..6], Tensor4Layout::bhsd(1, 1, 2, 3)),
                None,
            ),
            want: shape("k", "dim", 3, 4),
            says: &["`k`", "dim must be 3, got 4"],
        },
        Case {
            what: "attention: V length ≠ K length",
            got: attention(
                bhsd(1, 1, 2, 3),
                bhsd(1, 1, 4, 3),
                bhsd(1, 1, 5, 3),
                1.0,
                &Mask::None,
                TensorMut::new(&mut buf[..6], Tensor4Layout::bhsd(1, 1, 2, 3)),
                None,
            ),
            want: shape("v", "seq", 4, 5),
            says: &["`v`", "seq must be 4, got 5"],
        },
        Case {
            what: "attention: K batch",
            got: attention(
                bhsd(2, 1, 2, 3),
                bhsd(1, 1, 4, 3),
                bhsd(1, 1, 4, 3),
                1.0,
                &Mask::None,
                TensorMut::new(&mut buf[..12], Tensor4Layout::bhsd(2, 1, 2, 3)),
                None,
            ),
            want: shape("k", "batch", 2, 1),
            says: &["`k`", "batch must be 2, got 1"],
        },
        Case {
            what: "attention: output width ≠ value width",
            got: attention(
                bhsd(1, 1, 2, 3),
                bhsd(1, 1, 4, 3),
                bhsd(1, 1, 4, 2),
                1.0,
                &Mask::None,
                TensorMut::new(&mut buf[..6], Tensor4Layout::bhsd(1, 1, 2, 3)),
                None,
            ),
            want: shape("o", "dim", 2, 3),
            says: &["`o`", "dim must be 2, got 3"],
        },
        Case {
            what: "attention: lse length",
            got: attention(
                bhsd(1, 1, 2, 3),
                bhsd(1, 1, 4, 3),
                bhsd(1, 1, 4, 3),
                1.0,
                &Mask::None,
                TensorMut::new(&mut buf[..6], Tensor4Layout::bhsd(1, 1, 2, 3)),
                Some(&mut lse[..1]),
            ),
            want: shape("lse", "len", 2, 1),
            says: &["`lse`", "len must be 2, got 1"],
        },
        Case {
            what: "attention: lse length whose product overflows (was an overflow panic)",
            got: attention(
                TensorRef::new(&[], Tensor4Layout::strided([usize::MAX, 1, 2, 0], [0; 4], 0)),
                TensorRef::new(&[], Tensor4Layout::strided([usize::MAX, 1, 3, 0], [0; 4], 0)),
                TensorRef::new(&[], Tensor4Layout::strided([usize::MAX, 1, 3, 0], [0; 4], 0)),
                1.0,
                &Mask::CAUSAL,
                TensorMut::new(&mut [], Tensor4Layout::strided([usize::MAX, 1, 2, 0], [0; 4], 0)),
                Some(&mut lse[..1]),
            ),
            want: shape("lse", "len", usize::MAX, 1),
            says: &["`lse`", "got 1"],
        },
        Case {
            what: "attention: contiguous layout whose stride products overflow (saturated)",
            got: attention(
                TensorRef::new(&Z, Tensor4Layout::bhsd(2, usize::MAX, 2, 2)),
                bhsd(2, 1, 2, 2),
                bhsd(2, 1, 2, 2),
                1.0,
                &Mask::None,
                TensorMut::new(&mut buf, Tensor4Layout::bhsd(2, usize::MAX, 2, 2)),
                None,
            ),
            want: Error::IndexOverflow { arg: "q" },
            says: &["`q`", "overflow usize"],
        },
        Case {
            what: "attention: mask heads",
            got: attention(
                bhsd(1, 2, 2, 3),
                bhsd(1, 1, 4, 3),
                bhsd(1, 1, 4, 3),
                1.0,
                &Mask::key_padding(&keep, 1, 1, 2, 4),
                TensorMut::new(&mut buf[..12], Tensor4Layout::bhsd(1, 2, 2, 3)),
                None,
            ),
            want: shape("mask", "heads", 2, 1),
            says: &["`mask`", "heads must be 2, got 1"],
        },
        Case {
            what: "attention: bias mask overruns",
            got: attention(
                bhsd(2, 1, 2, 3),
                bhsd(2, 1, 4, 3),
                bhsd(2, 1, 4, 3),
                1.0,
                &Mask::Bias { bias: &Z[..15], layout: Tensor4Layout::bhsd(2, 1, 2, 4) },
                TensorMut::new(&mut buf[..12], Tensor4Layout::bhsd(2, 1, 2, 3)),
                None,
            ),
            want: Error::OutOfBounds { arg: "mask", required: 16, len: 15 },
            says: &["`mask`", "16", "15"],
        },
        Case {
            what: "attention: infinite scale",
            got: attention(
                bhsd(1, 1, 2, 3),
                bhsd(1, 1, 4, 3),
                bhsd(1, 1, 4, 3),
                f32::INFINITY,
                &Mask::None,
                TensorMut::new(&mut buf[..6], Tensor4Layout::bhsd(1, 1, 2, 3)),
                None,
            ),
            want: Error::NonFinite { arg: "scale", value: f32::INFINITY },
            says: &["`scale`", "inf"],
        },
        Case {
            what: "attention: K/V of zero width but too many keys to allocate a row for",
            got: attention(
                bhsd(1, 1, 1, 0),
                TensorRef::new(&[], Tensor4Layout::bhsd(1, 1, usize::MAX, 0)),
                TensorRef::new(&[], Tensor4Layout::bhsd(1, 1, usize::MAX, 0)),
                1.0,
                &Mask::None,
                TensorMut::new(&mut [], Tensor4Layout::bhsd(1, 1, 1, 0)),
                Some(&mut lse[..1]),
            ),
            want: Error::InvalidParameter {
                arg: "k",
                requirement: "the sizes imply a scratch buffer that cannot be allocated",
            },
            says: &["`k`", "cannot be allocated"],
        },
        // ---- multi-head and cross-attention
        Case {
            what: "MhaConfig::from_embed_dim: 10 not divisible by 3 heads",
            got: MhaConfig::from_embed_dim(10, 3).map(drop),
            want: Error::HeadsNotDivisible { arg: "embed_dim", hidden: 10, heads: 3 },
            says: &["`embed_dim`", "hidden size 10", "3 heads"],
        },
        Case {
            what: "MhaConfig::from_embed_dim: zero heads",
            got: MhaConfig::from_embed_dim(8, 0).map(drop),
            want: Error::ZeroHeads { arg: "num_heads" },
            says: &["`num_heads`", "got 0"],
        },
        Case {
            what: "MHA: zero heads",
            got: mha(MhaConfig::new(4, 2, 2, 0), None, seq(3, 4), &Mask::None),
            want: Error::ZeroHeads { arg: "num_heads" },
            says: &["`num_heads`", "got 0"],
        },
        Case {
            what: "MHA: zero K/V heads",
            got: mha(cfg.with_kv_heads(0), Some(layer.weights()), seq(3, 4), &Mask::None),
            want: Error::ZeroHeads { arg: "kv_heads" },
            says: &["`kv_heads`", "got 0"],
        },
        Case {
            what: "MHA: 3 K/V heads for 4 query heads",
            got: mha(MhaConfig::new(4, 1, 1, 4).with_kv_heads(3), None, seq(3, 4), &Mask::None),
            want: Error::KvHeadsNotDividing { q_heads: 4, kv_heads: 3 },
            says: &["`kv_heads`", "3 K/V heads must divide 4 query heads"],
        },
        Case {
            what: "MHA: head widths overflow usize",
            got: mha(
                MhaConfig::new(4, usize::MAX, 2, 2),
                Some(layer.weights()),
                seq(3, 4),
                &Mask::None,
            ),
            want: Error::InvalidParameter {
                arg: "k_dim",
                requirement: "the sizes imply a scratch buffer that cannot be allocated",
            },
            says: &["`k_dim`"],
        },
        Case {
            what: "MHA: input width ≠ in_dim",
            got: mha(cfg, None, seq(3, 5), &Mask::None),
            want: shape("x", "dim", 4, 5),
            says: &["`x`", "dim must be 4, got 5"],
        },
        Case {
            what: "MHA: input with two heads",
            got: mha(cfg, None, bhsd(1, 2, 3, 4), &Mask::None),
            want: shape("x", "heads", 1, 2),
            says: &["`x`", "heads must be 1, got 2"],
        },
        Case {
            what: "MHA: W_o has the wrong shape",
            got: mha(
                cfg,
                Some(MhaWeights { wo: rm(4, 3), ..layer.weights() }),
                seq(3, 4),
                &Mask::None,
            ),
            want: shape("wo", "cols", 4, 3),
            says: &["`wo`", "cols must be 4, got 3"],
        },
        Case {
            what: "MHA: W_q rows",
            got: mha(
                cfg,
                Some(MhaWeights { wq: rm(3, 4), ..layer.weights() }),
                seq(3, 4),
                &Mask::None,
            ),
            want: shape("wq", "rows", 4, 3),
            says: &["`wq`", "rows must be 4, got 3"],
        },
        Case {
            what: "MHA: query bias length",
            got: mha(
                cfg,
                Some(MhaWeights { bq: Some(&Z[..3]), ..layer.weights() }),
                seq(3, 4),
                &Mask::None,
            ),
            want: shape("bq", "len", 4, 3),
            says: &["`bq`", "len must be 4, got 3"],
        },
        Case {
            what: "MHA: W_v overruns its slice",
            got: mha(
                cfg,
                Some(MhaWeights { wv: MatRef::row_major(&Z[..15], 4, 4), ..layer.weights() }),
                seq(3, 4),
                &Mask::None,
            ),
            want: Error::OutOfBounds { arg: "wv", required: 16, len: 15 },
            says: &["`wv`", "16", "15"],
        },
        Case {
            what: "MHA: a cross-attention config",
            got: mha(MhaConfig::cross(4, 5, 2, 2, 2), None, seq(3, 4), &Mask::None),
            want: shape("cfg", "kv_in_dim", 4, 5),
            says: &["`cfg`", "kv_in_dim must be 4, got 5"],
        },
        Case {
            what: "MHA: mask over the wrong number of queries",
            got: mha(cfg, None, seq(3, 4), &Mask::keep_mat(&keep, 1, 2, 2, 3)),
            want: shape("mask", "nq", 3, 2),
            says: &["`mask`", "nq must be 3, got 2"],
        },
        Case {
            what: "cross-attention: x2 batch ≠ x1 batch",
            got: cross_attention(
                &MhaConfig::cross(4, 2, 2, 2, 2),
                &Layer { cfg: MhaConfig::cross(4, 2, 2, 2, 2) }.weights(),
                seq(3, 4),
                TensorRef::new(&Z[..8], Tensor4Layout::batch_seq(2, 2, 2)),
                &Mask::None,
                TensorMut::new(&mut buf[..12], Tensor4Layout::batch_seq(1, 3, 4)),
            ),
            want: shape("x2", "batch", 1, 2),
            says: &["`x2`", "batch must be 1, got 2"],
        },
        Case {
            what: "cross-attention: x2 width ≠ kv_in_dim",
            got: cross_attention(
                &MhaConfig::cross(4, 2, 2, 2, 2),
                &Layer { cfg: MhaConfig::cross(4, 2, 2, 2, 2) }.weights(),
                seq(3, 4),
                seq(2, 3),
                &Mask::None,
                TensorMut::new(&mut buf[..12], Tensor4Layout::batch_seq(1, 3, 4)),
            ),
            want: shape("x2", "dim", 2, 3),
            says: &["`x2`", "dim must be 2, got 3"],
        },
        Case {
            what: "cross-attention: output length ≠ query length",
            got: cross_attention(
                &MhaConfig::cross(4, 2, 2, 2, 2),
                &Layer { cfg: MhaConfig::cross(4, 2, 2, 2, 2) }.weights(),
                seq(3, 4),
                seq(5, 2),
                &Mask::None,
                TensorMut::new(&mut buf[..20], Tensor4Layout::batch_seq(1, 5, 4)),
            ),
            want: shape("y", "seq", 3, 5),
            says: &["`y`", "seq must be 3, got 5"],
        },
        // ---- layer norm, feed-forward, encoder
        Case {
            what: "layer_norm: NaN eps",
            got: layer_norm(rm(2, 4), &ln, f32::NAN, MatMut::row_major(&mut buf[..8], 2, 4)),
            want: Error::NonFinite { arg: "eps", value: f32::NAN },
            says: &["`eps`", "NaN"],
        },
        Case {
            what: "layer_norm: negative eps",
            got: layer_norm(rm(2, 4), &ln, -1e-5, MatMut::row_major(&mut buf[..8], 2, 4)),
            want: Error::InvalidParameter { arg: "eps", requirement: "must be >= 0" },
            says: &["`eps`", ">= 0"],
        },
        Case {
            what: "layer_norm: gamma length",
            got: layer_norm(
                rm(2, 4),
                &LayerNormWeights { gamma: &Z[..3], beta: &Z[..4] },
                0.0,
                MatMut::row_major(&mut buf[..8], 2, 4),
            ),
            want: shape("gamma", "len", 4, 3),
            says: &["`gamma`", "len must be 4, got 3"],
        },
        Case {
            what: "layer_norm: beta length",
            got: layer_norm(
                rm(2, 4),
                &LayerNormWeights { gamma: &Z[..4], beta: &Z[..5] },
                0.0,
                MatMut::row_major(&mut buf[..8], 2, 4),
            ),
            want: shape("beta", "len", 4, 5),
            says: &["`beta`", "len must be 4, got 5"],
        },
        Case {
            what: "feed_forward: W2 rows ≠ hidden width",
            got: feed_forward(
                rm(2, 4),
                &FeedForwardWeights { w2: rm(5, 4), ..ff },
                Activation::Relu,
                MatMut::row_major(&mut buf[..8], 2, 4),
            ),
            want: shape("w2", "rows", 6, 5),
            says: &["`w2`", "rows must be 6, got 5"],
        },
        Case {
            what: "feed_forward: b1 length",
            got: feed_forward(
                rm(2, 4),
                &FeedForwardWeights { b1: Some(&Z[..4]), ..ff },
                Activation::GeluTanh,
                MatMut::row_major(&mut buf[..8], 2, 4),
            ),
            want: shape("b1", "len", 6, 4),
            says: &["`b1`", "len must be 6, got 4"],
        },
        Case {
            what: "encoder: infinite eps",
            got: enc(&EncoderConfig { eps: f32::INFINITY, ..enc_cfg }, &enc_w),
            want: Error::NonFinite { arg: "eps", value: f32::INFINITY },
            says: &["`eps`", "inf"],
        },
        Case {
            what: "encoder: cross-attention config",
            got: enc(&EncoderConfig { attn: MhaConfig::cross(4, 3, 2, 2, 2), ..enc_cfg }, &enc_w),
            want: shape("cfg", "kv_in_dim", 4, 3),
            says: &["`cfg`", "kv_in_dim must be 4, got 3"],
        },
        Case {
            what: "encoder: norm2 beta length",
            got: enc(
                &enc_cfg,
                &EncoderWeights {
                    norm2: LayerNormWeights { gamma: &Z[..4], beta: &Z[..2] },
                    ..enc_w
                },
            ),
            want: shape("norm2.beta", "len", 4, 2),
            says: &["`norm2.beta`", "len must be 4, got 2"],
        },
        Case {
            what: "encoder: W1 width ≠ ff_dim",
            got: enc(&EncoderConfig { ff_dim: 8, ..enc_cfg }, &enc_w),
            want: shape("w1", "cols", 8, 6),
            says: &["`w1`", "cols must be 8, got 6"],
        },
        Case {
            what: "encoder: zero heads",
            got: enc(&EncoderConfig { attn: MhaConfig::new(4, 2, 2, 0), ..enc_cfg }, &enc_w),
            want: Error::ZeroHeads { arg: "num_heads" },
            says: &["`num_heads`"],
        },
        // ---- positional encodings
        Case {
            what: "learned PE: table too short for start + n",
            got: add_positional_encoding(
                seq(3, 4),
                &PositionalEncoding::Learned { table: rm(4, 4), start: 2 },
                TensorMut::new(&mut buf[..12], Tensor4Layout::batch_seq(1, 3, 4)),
            ),
            want: shape("table", "rows (at least)", 5, 4),
            says: &["`table`", "rows (at least) must be 5, got 4"],
        },
        Case {
            what: "learned PE: table width",
            got: add_positional_encoding(
                seq(3, 4),
                &PositionalEncoding::Learned { table: rm(4, 3), start: 0 },
                TensorMut::new(&mut buf[..12], Tensor4Layout::batch_seq(1, 3, 4)),
            ),
            want: shape("table", "cols", 4, 3),
            says: &["`table`", "cols must be 4, got 3"],
        },
        Case {
            what: "PE: output shape",
            got: add_positional_encoding(
                seq(3, 4),
                &PositionalEncoding::Sinusoidal { start: 0 },
                TensorMut::new(&mut buf[..8], Tensor4Layout::batch_seq(1, 2, 4)),
            ),
            want: shape("y", "seq", 3, 2),
            says: &["`y`", "seq must be 3, got 2"],
        },
        Case {
            what: "PE: start + n overflows",
            got: add_positional_encoding(
                seq(3, 4),
                &PositionalEncoding::Sinusoidal { start: usize::MAX - 1 },
                TensorMut::new(&mut buf[..12], Tensor4Layout::batch_seq(1, 3, 4)),
            ),
            want: Error::IndexOverflow { arg: "start" },
            says: &["`start`"],
        },
        Case {
            what: "sinusoidal table: aliased output",
            got: sinusoidal_table(0, MatMut::new(&mut buf[..8], MatLayout::strided(2, 4, 4, 0, 0))),
            want: Error::AliasedOutput { arg: "pe" },
            says: &["`pe`", "zero stride"],
        },
    ];
    c.shrink_to_fit();
    c
}

#[test]
fn bad_input_table() {
    let cases = cases();
    let mut hit = [0usize; VARIANTS];
    for c in &cases {
        let e = match &c.got {
            Ok(()) => panic!("{}: accepted bad input, expected {:?}", c.what, c.want),
            Err(e) => e,
        };
        // NaN ≠ NaN, so compare NonFinite by its Display-able parts.
        match (e, &c.want) {
            (Error::NonFinite { arg, value }, Error::NonFinite { arg: a2, value: v2 }) => {
                assert_eq!(arg, a2, "{}", c.what);
                assert!(value == v2 || (value.is_nan() && v2.is_nan()), "{}: {value}", c.what);
            }
            _ => assert_eq!(e, &c.want, "{}", c.what),
        }
        let msg = e.to_string();
        for s in c.says {
            assert!(msg.contains(s), "{}: message {msg:?} lacks {s:?}", c.what);
        }
        hit[variant(e)] += 1;
    }
    assert!(hit.iter().all(|&n| n > 0), "variants never produced: {hit:?}");
}

/// Valid calls whose views are empty but whose other dimensions are huge: they must return at
/// once (no loop over the empty rows, no overflowing products, no capacity panic).
#[test]
fn empty_views_with_huge_dimensions_return_quickly() {
    let big = usize::MAX;
    matmul(
        1.0,
        MatRef::row_major(&[], big, 0),
        MatRef::row_major(&[], 0, 0),
        0.0,
        MatMut::row_major(&mut [], big, 0),
    )
    .unwrap();
    linear(
        MatRef::row_major(&[], big, 0),
        MatRef::row_major(&[], 0, 0),
        None,
        MatMut::row_major(&mut [], big, 0),
    )
    .unwrap();
    let t = Tensor4Layout::strided([big, big, big, 0], [0; 4], 0);
    scale_mask_softmax(
        TensorRef::new(&[], t),
        1.0,
        &Mask::CAUSAL,
        TensorMut::new(&mut [], t),
        None,
    )
    .unwrap();
    log_softmax(MatRef::row_major(&[], big, 0), MatMut::row_major(&mut [], big, 0)).unwrap();
    let e = Tensor4Layout::strided([big, 3, big, 0], [0; 4], 0);
    attention(
        TensorRef::new(&[], e),
        TensorRef::new(&[], e),
        TensorRef::new(&[], e),
        1.0,
        &Mask::CAUSAL,
        TensorMut::new(&mut [], e),
        None,
    )
    .unwrap();
    sinusoidal_table(0, MatMut::row_major(&mut [], big, 0)).unwrap();
    let s = Tensor4Layout::strided([big, 1, big, 0], [0; 4], 0);
    add_positional_encoding(
        TensorRef::new(&[], s),
        &PositionalEncoding::Sinusoidal { start: 0 },
        TensorMut::new(&mut [], s),
    )
    .unwrap();
    let cfg = MhaConfig::new(0, 2, 2, 2);
    let w = MhaWeights {
        wq: MatRef::row_major(&[], 0, 4),
        wk: MatRef::row_major(&[], 0, 4),
        wv: MatRef::row_major(&[], 0, 4),
        wo: MatRef::row_major(&[], 4, 0),
        bq: None,
        bk: None,
        bv: None,
        bo: None,
        variants: Variants::NONE,
    };
    multi_head_attention(&cfg, &w, TensorRef::new(&[], s), &Mask::None, TensorMut::new(&mut [], s))
        .unwrap();
    // A causal offset for nk far beyond isize::MAX saturates instead of overflowing.
    assert_eq!(Mask::causal_offset(None, 0, big), isize::MAX);
    assert_eq!(Mask::causal_offset(None, big, 0), -isize::MAX);
}

mod no_panic {
    //! Arbitrary small shapes, layouts (contiguous, column-major, zero and odd strides,
    //! offsets, `usize::MAX` strides and offsets), slice lengths, scalars, masks and special
    //! values: every call must return, Ok or a typed error, never panic. Shapes are mostly
    //! consistent (so the computing paths run) and sometimes perturbed (so the checks do).
    //! Dimensions stay ≤ 6 so zero-stride broadcasts cannot make the work unbounded.
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::select;

    const LEN: usize = 320;

    fn dim() -> impl Strategy<Value = usize> {
        select(vec![0usize, 1, 2, 3, 6])
    }
    /// `n` most of the time, another size sometimes.
    fn near(n: usize) -> impl Strategy<Value = usize> {
        prop_oneof![6 => Just(n), 1 => dim()]
    }
    fn stride() -> impl Strategy<Value = usize> {
        select(vec![0usize, 1, 2, 3, 7, 40, usize::MAX / 2, usize::MAX])
    }
    fn offset() -> impl Strategy<Value = usize> {
        select(vec![0usize, 1, 5, usize::MAX])
    }
    fn mat(rows: usize, cols: usize) -> impl Strategy<Value = MatLayout> {
        prop_oneof![
            3 => Just(MatLayout::row_major(rows, cols)),
            1 => Just(MatLayout::col_major(rows, cols)),
            2 => (stride(), stride(), offset())
                .prop_map(move |(rs, cs, o)| MatLayout::strided(rows, cols, rs, cs, o)),
        ]
    }
    fn t4(b: usize, h: usize, n: usize, d: usize) -> impl Strategy<Value = Tensor4Layout> {
        prop_oneof![
            3 => Just(Tensor4Layout::bhsd(b, h, n, d)),
            2 => Just(Tensor4Layout::bshd(b, n, h, d)),
            2 => ([stride(), stride(), stride(), stride()], offset())
                .prop_map(move |(s, o)| Tensor4Layout::strided([b, h, n, d], s, o)),
        ]
    }
    fn scalar() -> impl Strategy<Value = f32> {
        prop_oneof![
            4 => Just(0.5f32),
            1 => select(vec![1.0f32, 0.0, -0.5, f32::NAN, f32::INFINITY, 1e30]),
        ]
    }
    fn data() -> impl Strategy<Value = Vec<f32>> {
        let value = prop_oneof![
            6 => -2.0f32..2.0,
            1 => select(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, 1e-40]),
        ];
        prop_oneof![4 => Just(LEN), 1 => 0..LEN]
            .prop_flat_map(move |n| prop::collection::vec(value.clone(), n))
    }

    fn matrix_case() -> impl Strategy<Value = (MatLayout, MatLayout, MatLayout)> {
        (dim(), dim(), dim()).prop_flat_map(|(m, k, n)| {
            (
                (near(m), near(k)).prop_flat_map(|(r, c)| mat(r, c)),
                (near(k), near(n)).prop_flat_map(|(r, c)| mat(r, c)),
                (near(m), near(n)).prop_flat_map(|(r, c)| mat(r, c)),
            )
        })
    }

    type Attn = (Tensor4Layout, Tensor4Layout, Tensor4Layout, Tensor4Layout, Tensor4Layout);

    fn attention_case() -> impl Strategy<Value = Attn> {
        let heads = select(vec![(1usize, 1usize), (2, 1), (2, 2), (4, 2), (3, 2), (0, 1), (1, 0)]);
        (select(vec![0usize, 1, 2]), heads, dim(), dim(), dim(), dim()).prop_flat_map(
            |(b, (hq, hkv), nq, nk, dk, dv)| {
                (
                    (near(nq), near(dk)).prop_flat_map(move |(n, d)| t4(b, hq, n, d)),
                    (near(nk), near(dk)).prop_flat_map(move |(n, d)| t4(b, hkv, n, d)),
                    near(dv).prop_flat_map(move |d| t4(b, hkv, nk, d)),
                    (near(nq), near(dv)).prop_flat_map(move |(n, d)| t4(b, hq, n, d)),
                    prop_oneof![
                        3 => Just(Tensor4Layout::bhsd(b, hq, nq, nk)),
                        1 => Just(Tensor4Layout::broadcast_mat(b, hq, nq, nk)),
                        1 => Just(Tensor4Layout::broadcast_rows(b, hq, nq, nk)),
                        1 => (near(nk)).prop_flat_map(move |k| t4(b, hq, nq, k)),
                    ],
                )
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

        #[test]
        fn matrix_ops_never_panic(
            (la, lb, lc) in matrix_case(),
            (a, b, mut c) in (data(), data(), data()),
            (alpha, beta) in (scalar(), scalar()),
            bias in prop::option::of(data()),
        ) {
            let (ar, br) = (MatRef::new(&a, la), MatRef::new(&b, lb));
            let _ = matmul(alpha, ar, br, beta, MatMut::new(&mut c, lc));
            let bias = bias.as_deref().map(|v| &v[..v.len().min(lb.cols)]);
            let _ = linear(ar, br, bias, MatMut::new(&mut c, lc));
            let kt = MatRef::new(&b, lb.transposed());
            let _ = scaled_dot_product_scores(ar, kt, alpha, MatMut::new(&mut c, lc));
            let _ = softmax(ar, MatMut::new(&mut c, la));
            let _ = log_softmax(ar, MatMut::new(&mut c, lc));
            let _ = logsumexp(ar);
            let g = &b[..b.len().min(la.cols)];
            let ln = LayerNormWeights { gamma: g, beta: g };
            let _ = layer_norm(ar, &ln, beta.abs(), MatMut::new(&mut c, lc));
            let _ = sinusoidal_table(la.rows, MatMut::new(&mut c, lc));
            let aw = AdditiveWeights { wq: br, wk: br, w: &a[..a.len().min(lb.cols)] };
            let _ = additive_scores(ar, ar, &aw, MatMut::new(&mut c, lc));
            let ff = FeedForwardWeights { w1: br, b1: None, w2: kt, b2: bias };
            let _ = feed_forward(ar, &ff, Activation::GeluTanh, MatMut::new(&mut c, lc));
        }

        #[test]
        fn tensor_ops_never_panic(
            (lq, lk, lv, lo, lm) in attention_case(),
            (q, k, v, mut o) in (data(), data(), data(), data()),
            scale in scalar(),
            mask_kind in 0usize..4,
            offset in select(
                vec![None, Some(0isize), Some(-3), Some(isize::MAX), Some(isize::MIN)],
            ),
            lse_len in select(vec![None, Some(0usize), Some(1), Some(4), Some(12)]),
        ) {
            let keep: Vec<bool> = k.iter().map(|x| *x > 0.0).collect();
            let mask = match mask_kind {
                0 => Mask::None,
                1 => Mask::Causal { offset },
                2 => Mask::Keep { keep: &keep, layout: lm },
                _ => Mask::Bias { bias: &v, layout: lm },
            };
            let rows = lq.dims[0] * lq.dims[1] * lq.dims[2];
            let mut lse = lse_len.map(|n| vec![0.0f32; if n == 12 { rows } else { n }]);
            let (qr, kr) = (TensorRef::new(&q, lq), TensorRef::new(&k, lk));
            let vr = TensorRef::new(&v, lv);
            let om = TensorMut::new(&mut o, lo);
            let _ = attention(qr, kr, vr, scale, &mask, om, lse.as_deref_mut());
            let _ = scale_mask_softmax(
                TensorRef::new(&q, lm),
                scale,
                &mask,
                TensorMut::new(&mut o, lm),
                lse.as_deref_mut(),
            );
            let seq = Tensor4Layout { dims: [lq.dims[0], 1, lq.dims[2], lq.dims[3]], ..lq };
            let table = MatRef::new(&k, MatLayout::row_major(lk.dims[2] + 2, lq.dims[3]));
            for pe in [
                PositionalEncoding::Sinusoidal { start: lk.offset },
                PositionalEncoding::Learned { table, start: lk.dims[0] },
            ] {
                let _ = add_positional_encoding(
                    TensorRef::new(&q, seq), &pe, TensorMut::new(&mut o, seq),
                );
            }
        }

        #[test]
        fn layers_never_panic(
            (in_dim, kv_in, k_dim, v_dim) in (dim(), dim(), dim(), dim()),
            (heads, kv_heads) in select(
                vec![(1usize, 1usize), (2, 2), (2, 1), (4, 2), (0, 1), (3, 2), (2, 0)],
            ),
            (batch, n1, n2) in (select(vec![0usize, 1, 2]), dim(), dim()),
            (w, x, x2, mut y) in (data(), data(), data(), data()),
            (causal, eps) in (any::<bool>(), scalar()),
            perturb in (0usize..12, dim()),
        ) {
            let cfg = MhaConfig::cross(in_dim, kv_in, k_dim, v_dim, heads).with_kv_heads(kv_heads);
            let mut shapes = [
                (cfg.in_dim, cfg.q_width()),
                (cfg.kv_in_dim, cfg.k_width()),
                (cfg.kv_in_dim, cfg.v_width()),
                (cfg.o_width(), cfg.in_dim),
            ];
            if perturb.0 < 4 {
                shapes[perturb.0].1 = perturb.1;
            }
            let m = |(r, c): (usize, usize)| MatRef::new(&w, MatLayout::row_major(r, c));
            let bias = |len: usize| Some(&w[..w.len().min(len)]);
            let mw = MhaWeights {
                wq: m(shapes[0]),
                wk: m(shapes[1]),
                wv: m(shapes[2]),
                wo: m(shapes[3]),
                bq: bias(cfg.q_width()),
                bk: None,
                bv: bias(cfg.v_width()),
                bo: bias(in_dim),
                variants: Variants::NONE,
            };
            let l1 = Tensor4Layout::batch_seq(batch, n1, in_dim);
            let l2 = Tensor4Layout::batch_seq(batch, n2, kv_in);
            let (x1r, x2r) = (TensorRef::new(&x, l1), TensorRef::new(&x2, l2));
            let mask = if causal { Mask::CAUSAL } else { Mask::None };
            let _ = cross_attention(&cfg, &mw, x1r, x2r, &mask, TensorMut::new(&mut y, l1));
            let _ = multi_head_attention(&cfg, &mw, x1r, &mask, TensorMut::new(&mut y, l1));
            let g = &w[..w.len().min(in_dim)];
            let activation = Activation::Relu;
            let ecfg = EncoderConfig { attn: cfg, ff_dim: k_dim, activation, eps };
            let ew = EncoderWeights {
                attn: mw,
                norm1: LayerNormWeights { gamma: g, beta: g },
                ff: FeedForwardWeights {
                    w1: m((in_dim, k_dim)),
                    b1: None,
                    w2: m((k_dim, in_dim)),
                    b2: bias(in_dim),
                },
                norm2: LayerNormWeights { gamma: g, beta: g },
            };
            let _ = encoder_block(&ecfg, &ew, x1r, &mask, TensorMut::new(&mut y, l1));
        }
    }
}
