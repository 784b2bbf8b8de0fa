//! Scaled dot-product attention `O = softmax(scale·Q·Kᵀ + mask)·V` over `[batch, heads]`,
//! three ways:
//!
//! - [`flash`]: the streaming kernel. Each task takes one tile of queries of one head and
//!   streams the keys in blocks, keeping a running row maximum `m` and sum `l` (online
//!   softmax): when a block raises the maximum, the partial output is rescaled by
//!   `e^(m_old − m_new)`; the division by `l` happens once at the end. Memory beyond the
//!   operands is per-thread scratch (a few tiles), never `Nq × Nk`. Causal blocks entirely above
//!   the diagonal are never visited. Tasks are `(batch, head, query tile)`, spread over rayon.
//! - [`decode`]: for a handful of queries over many keys (`Nq ≤ 16`, generation with a KV
//!   cache). All query heads of a GQA group and all queries form the rows, the keys of each
//!   `(batch, K/V head)` are split into chunks fixed by `Nk` (threads take whole chunks, so the
//!   result does not depend on the thread count), and the chunks' partial results
//!   are merged by their logsumexp (flash-decoding). Each key/value row is read once.
//! - [`attention_unfused`]: scores materialised per head, then softmax, then `P·V`; kept as a
//!   second implementation for equivalence tests and benchmarks.
//!
//! [`attention`] / [`attention_with_isa`] pick the decode path for `Nq ≤ 16` and the flash path
//! otherwise. Every entry point has the semantics, checks and errors of
//! `attn_reference::attention::attention` (they share [`check_attention`]): any strides (so
//! `[b, s, h, d]` and `[b, h, s, d]` storage both work without copies), `Nq ≠ Nk`, `d_k ≠ d_v`,
//! GQA/MQA (query head `h` reads K/V head `h / (H_q / H_kv)`, no copies), every [`Mask`]; a
//! fully masked row gives zeros and logsumexp −∞; `Nq = 0` or `Nk = 0` are fine. A call with
//! nothing to write (an empty output view and no logsumexp entry) returns at once whatever its
//! other dimensions (`2⁴⁰` rows of width 0, `2⁵⁰` keys of width 0), as the reference does; with
//! `d_k = d_v = 0` the logsumexps are computed without visiting the keys. No allocation or loop
//! is sized by a dimension whose product with a zero dimension is empty.
//!
//! Numerics: the query tile is packed pre-multiplied by `scale` (a nonzero product that would
//! underflow to zero is kept as the smallest subnormal of its sign, so an underflow cannot turn
//! `scale·q·(±∞)` into `0·∞ = NaN`; see `scale_query`); accumulation is f32; the
//! exponential is the softmax module's: its table exp (1.5 ULP) on key blocks whose scores all
//! lie within 87 of the running max, the full-range 1-ULP exp elsewhere.
//!
//! Overflow (one convention for every path and the reference, see
//! [`attn_reference::softmax::saturate_logit`]): a score `scale·q·k + mask` is an f32 value; one
//! that overflows f32 is `±∞`, like a `±∞` bias. `−∞` scores get weight 0 (a row of only `−∞`
//! is fully masked: zeros, logsumexp −∞); the `+∞` scores of a row share its weight evenly (the
//! output row is the mean of their values, the logsumexp `+∞`); a NaN score gives a NaN row.
//! The reference rounds its f64 scores to `±∞` where f32 would overflow. Where an
//! intermediate of the f32 dot product overflows although the score itself would not
//! (`|scale|·Σ_d |q_d·k_d|` or `|scale·q_d|` near `f32::MAX`), the score can come out `±∞` or
//! NaN depending on the summation order: that is outside the supported range. A key of zero
//! weight (masked, or whose weight
//! underflows) contributes exactly 0 even when its value is `±∞`/NaN (an unwritten KV-cache
//! slot), as in the reference; empty head dimensions (`d_k = 0`, `d_v = 0`) accept any strides.
//!
//! Layout of this module: `blocking` (block sizes and thresholds, with their cache
//! reasoning), `blocks` (the flash block products on the GEMM micro-kernels, the decode tiles
//! and row helpers, over [`crate::arch::Simd`]), `sink` (the shared row writer of the
//! parallel loops, which claims each output row once), `flash`, `decode`, `unfused` (the
//! three algorithms, each written once over the vector trait, in safe code).

mod blocking;
mod blocks;
mod decode;
mod flash;
mod sink;
mod unfused;

use attn_core::attention::check_attention;
use attn_core::{Mask, MatLayout, Result, Tensor4Layout, TensorMut, TensorRef};

use crate::arch::{self, Isa};
use crate::par::Parallelism;
use blocks::Strided;

/// Attention with the default ISA ([`arch::selected`]): the decode path for `Nq ≤ 16`, the
/// flash path otherwise.
///
/// `q: [batch, hq, nq, dk]`, `k: [batch, hkv, nk, dk]`, `v: [batch, hkv, nk, dv]`,
/// `o: [batch, hq, nq, dv]` as strided views; `mask` over `[batch, hq, nq, nk]`; when given,
/// `lse` (`batch·hq·nq` floats, row-major over `[batch, hq, nq]`) receives
/// `ln Σ_j exp(scale·q_i·k_j + mask_ij)`. `scale` must be finite (see
/// [`default_scale`](attn_core::default_scale)).
///
/// Errors: those of [`check_attention`] (shapes, bounds, aliasing output, zero heads, K/V heads
/// not dividing query heads, non-finite scale, `lse` length).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: TensorMut<'_>,
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    attention_with_isa(arch::selected(), q, k, v, scale, mask, o, lse, par)
}

/// [`attention`] with an explicit ISA (an unsupported one is
/// `Error::InvalidParameter { arg: "isa", .. }`).
#[allow(clippy::too_many_arguments)]
pub fn attention_with_isa(
    isa: Isa,
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: TensorMut<'_>,
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    if q.layout.seq() <= blocking::DECODE_MAX_Q {
        decode(isa, q, k, v, scale, mask, o, lse, par)
    } else {
        flash(isa, q, k, v, scale, mask, o, lse, par)
    }
}

/// The flash (streaming, online-softmax) path for any `Nq`; same contract as [`attention`].
#[allow(clippy::too_many_arguments)]
pub fn flash(
    isa: Isa,
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: TensorMut<'_>,
    mut lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    let isa = isa.require()?;
    let p = Problem::new(q, k, v, scale, mask, &o, lse.as_deref())?;
    if p.trivial(&o, lse.as_deref_mut()) {
        return Ok(());
    }
    let sink = sink::Sink::new(o.data, o.layout, lse);
    flash::run(isa, &p, &sink, par);
    Ok(())
}

/// The decode (split-keys, logsumexp-merge) path for any `Nq`, meant for `Nq ≤ 16`; same
/// contract as [`attention`].
#[allow(clippy::too_many_arguments)]
pub fn decode(
    isa: Isa,
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: TensorMut<'_>,
    mut lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    let isa = isa.require()?;
    let p = Problem::new(q, k, v, scale, mask, &o, lse.as_deref())?;
    if p.trivial(&o, lse.as_deref_mut()) {
        return Ok(());
    }
    decode::run(isa, &p, o, lse, par);
    Ok(())
}

/// The unfused path: per head, the `Nq × Nk` score matrix is materialised, softmaxed and
/// multiplied by V. Same contract as [`attention`]; memory `O(Nq·Nk)` per thread.
#[allow(clippy::too_many_arguments)]
pub fn attention_unfused(
    isa: Isa,
    q: TensorRef<'_>,
    k: TensorRef<'_>,
    v: TensorRef<'_>,
    scale: f32,
    mask: &Mask<'_>,
    o: TensorMut<'_>,
    mut lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    let isa = isa.require()?;
    let p = Problem::new(q, k, v, scale, mask, &o, lse.as_deref())?;
    if p.trivial(&o, lse.as_deref_mut()) {
        return Ok(());
    }
    let sink = sink::Sink::new(o.data, o.layout, lse);
    unfused::run(isa, &p, &sink, par)
}

/// A checked attention problem: operands, sizes and mask.
pub(crate) struct Problem<'a> {
    q: TensorRef<'a>,
    k: TensorRef<'a>,
    v: TensorRef<'a>,
    mask: &'a Mask<'a>,
    /// The score scale, folded into the packed queries.
    scale2: f32,
    batch: usize,
    hq: usize,
    hkv: usize,
    /// Query heads per K/V head.
    group: usize,
    nq: usize,
    nk: usize,
    dk: usize,
    dv: usize,
}

impl<'a> Problem<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        q: TensorRef<'a>,
        k: TensorRef<'a>,
        v: TensorRef<'a>,
        scale: f32,
        mask: &'a Mask<'a>,
        o: &TensorMut<'_>,
        lse: Option<&[f32]>,
    ) -> Result<Self> {
        let [batch, hq, hkv, nq, nk, dk, dv] = check_attention(&q, &k, &v, scale, mask, o, lse)?;
        Ok(Problem {
            q,
            k,
            v,
            mask,
            scale2: scale,
            batch,
            hq,
            hkv,
            group: hq / hkv,
            nq,
            nk,
            dk,
            dv,
        })
    }

    /// Handles the calls whose answer needs no key or value element, and says whether it did:
    /// nothing to write (the output view is empty and there is no logsumexp entry), or
    /// `d_k = d_v = 0` with logsumexp entries (every score is `scale·0 = 0` plus the mask, so
    /// `lse = ln Σ_j e^(mask_ij)`, in closed form for no mask and a causal one). Such a call
    /// may carry dimensions no slice bounds (`2⁴⁰` rows of width 0, `2⁵⁰` keys of width 0), so
    /// nothing here allocates or loops in proportion to a dimension whose product with a zero
    /// one is empty: the loop below runs over the `lse` slice, and over the keys only to read
    /// a keep-mask or bias, which has that many (broadcast) elements.
    fn trivial(&self, o: &TensorMut<'_>, lse: Option<&mut [f32]>) -> bool {
        let lse = lse.filter(|l| !l.is_empty());
        if o.layout.is_empty() && lse.is_none() {
            return true;
        }
        let Some(out) = lse else { return false };
        if self.dk != 0 || self.dv != 0 {
            return false;
        }
        // `out.len() = batch·hq·nq` was checked, so row indices decompose without overflow.
        let nk = self.nk;
        for (row, l) in out.iter_mut().enumerate() {
            let (bh, i) = (row / self.nq, row % self.nq);
            let (b, h) = (bh / self.hq, bh % self.hq);
            let count = |n: usize| if n == 0 { f32::NEG_INFINITY } else { (n as f64).ln() as f32 };
            *l = match self.mask {
                Mask::None => count(nk),
                Mask::Causal { .. } => count(self.key_end(i)),
                Mask::Keep { keep, layout } => {
                    count((0..nk).filter(|&j| keep[layout.index(b, h, i, j)]).count())
                }
                Mask::Bias { bias, layout } => {
                    let t = |j: usize| f64::from(bias[layout.index(b, h, i, j)]);
                    // The reference's softmax row over the logits t_j, streamed in f64.
                    let m = (0..nk).map(t).fold(f64::NEG_INFINITY, f64::max);
                    if (0..nk).any(|j| t(j).is_nan()) {
                        f32::NAN
                    } else if m.is_infinite() {
                        m as f32
                    } else {
                        (m + (0..nk).map(|j| (t(j) - m).exp()).sum::<f64>().ln()) as f32
                    }
                }
            };
        }
        true
    }

    /// Keys of K/V head `kh` of batch `b` as a `[nk, dk]` strided matrix.
    fn keys(&self, b: usize, kh: usize) -> Strided<'a> {
        let m = matrix(&self.k.layout, b, kh);
        Strided { data: self.k.data, offset: m.offset, rs: m.row_stride, cs: m.col_stride }
    }

    /// Values of K/V head `kh` of batch `b` as a `[nk, dv]` strided matrix.
    fn values(&self, b: usize, kh: usize) -> Strided<'a> {
        let m = matrix(&self.v.layout, b, kh);
        Strided { data: self.v.data, offset: m.offset, rs: m.row_stride, cs: m.col_stride }
    }

    /// Exclusive end of the keys any of the queries `0..=i_last` may see: `nk`, or for a causal
    /// mask the first key past the diagonal of query `i_last` (keys beyond are never visited).
    fn key_end(&self, i_last: usize) -> usize {
        match self.mask {
            Mask::Causal { offset } => {
                let off = Mask::causal_offset(*offset, self.nq, self.nk) as i128;
                (i_last as i128 + off + 1).clamp(0, self.nk as i128) as usize
            }
            _ => self.nk,
        }
    }

    /// Applies the mask to a block of scaled scores: `s[j·stride + r]` holds the score
    /// of query `i0 + r` (`r < rows`) and key `j0 + j` (`j < nb`) of head `(b, h)`. Masked
    /// scores become −∞ (overwritten, so a NaN score at a masked position is dropped as the
    /// reference drops it), a bias is added. Rows `rows..stride` are padding and
    /// may be touched.
    #[allow(clippy::too_many_arguments)]
    fn apply_mask(
        &self,
        b: usize,
        h: usize,
        i0: usize,
        rows: usize,
        j0: usize,
        nb: usize,
        stride: usize,
        s: &mut [f32],
    ) {
        match self.mask {
            Mask::None => {}
            Mask::Causal { offset } => {
                let off = Mask::causal_offset(*offset, self.nq, self.nk) as i128;
                for j in 0..nb {
                    // Query i sees key j0 + j iff i ≥ j0 + j − off: rows below that are masked.
                    let first = (j0 + j) as i128 - off - i0 as i128;
                    if first > 0 {
                        let n = (first as usize).min(stride);
                        s[j * stride..j * stride + n].fill(f32::NEG_INFINITY);
                    }
                }
            }
            Mask::Keep { keep, layout } => {
                for j in 0..nb {
                    for r in 0..rows {
                        if !keep[layout.index(b, h, i0 + r, j0 + j)] {
                            s[j * stride + r] = f32::NEG_INFINITY;
                        }
                    }
                }
            }
            Mask::Bias { bias, layout } => {
                for j in 0..nb {
                    for r in 0..rows {
                        s[j * stride + r] += bias[layout.index(b, h, i0 + r, j0 + j)];
                    }
                }
            }
        }
    }

    /// Query row `(b, h, i)` times `scale`, into `out[..dk]` (see [`scale_query`]).
    fn scaled_query(&self, b: usize, h: usize, i: usize, out: &mut [f32]) {
        for (d, x) in out[..self.dk].iter_mut().enumerate() {
            *x = scale_query(self.q.at(b, h, i, d), self.scale2);
        }
    }
}

/// One query element pre-multiplied by the score scale, `x·scale` rounded to f32, except that a
/// product of two nonzero factors that underflows to zero becomes the smallest subnormal of its
/// sign (2⁻¹⁴⁹, off by at most that much). So a scaled query element is zero only when the
/// element or the scale is, and an infinite key element meets it as in the reference's
/// `scale·(q·k)` (`±∞`, never the `0·∞ = NaN` of an underflowed factor).
#[inline(always)]
pub(crate) fn scale_query(x: f32, scale: f32) -> f32 {
    let y = x * scale;
    if y == 0.0 && x != 0.0 && scale != 0.0 {
        f32::from_bits(1).copysign(y)
    } else {
        y
    }
}

/// `l.matrix(b, h)` with the offset in wrapping arithmetic. A checked view with an element
/// has an in-range offset, so this is exact then; an empty view (a zero dimension) may have
/// any strides (e.g. so large that `b·stride` overflows), and its offset is never used to
/// index, so wrapping only avoids the overflow panic.
fn matrix(l: &Tensor4Layout, b: usize, h: usize) -> MatLayout {
    let offset = l
        .offset
        .wrapping_add(b.wrapping_mul(l.strides[0]))
        .wrapping_add(h.wrapping_mul(l.strides[1]));
    MatLayout::strided(l.dims[2], l.dims[3], l.strides[2], l.strides[3], offset)
}

/// Row `row` of a strided matrix as a contiguous slice of `n` floats: borrowed when the columns
/// are contiguous, gathered into `tmp` otherwise. An empty row (`n = 0`) is the empty slice:
/// the matrix then has no element, and its offset and row stride may point anywhere.
fn row_of<'t>(m: &Strided<'t>, row: usize, n: usize, tmp: &'t mut [f32]) -> &'t [f32] {
    if n == 0 {
        return &[];
    }
    let start = m.offset + row * m.rs;
    if m.cs == 1 || n <= 1 {
        &m.data[start..start + n]
    } else {
        for (c, x) in tmp[..n].iter_mut().enumerate() {
            *x = m.data[start + c * m.cs];
        }
        &tmp[..n]
    }
}
