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
//!   `(batch, K/V head)` are split into chunks across threads, and the chunks' partial results
//!   are merged by their logsumexp (flash-decoding). Each key/value row is read once.
//! - [`attention_unfused`]: scores materialised per head, then softmax, then `P·V`; kept as a
//!   second implementation for equivalence tests and benchmarks.
//!
//! [`attention`] / [`attention_with_isa`] pick the decode path for `Nq ≤ 16` and the flash path
//! otherwise. Every entry point has the semantics, checks and errors of
//! `attn_reference::attention::attention` (they share [`check_attention`]): any strides (so
//! `[b, s, h, d]` and `[b, h, s, d]` storage both work without copies), `Nq ≠ Nk`, `d_k ≠ d_v`,
//! GQA/MQA (query head `h` reads K/V head `h / (H_q / H_kv)`, no copies), every [`Mask`]; a
//! fully masked row gives zeros and logsumexp −∞; `Nq = 0` or `Nk = 0` are fine.
//!
//! Numerics: the query tile is packed pre-multiplied by `scale`; accumulation is f32; the
//! exponential is the softmax module's: its table exp (1.5 ULP) on key blocks whose scores all
//! lie within 87 of the running max, the full-range 1-ULP exp elsewhere. A `+∞` bias entry
//! is outside the supported range (the reference gives such a row all the weight at the `+∞`
//! positions; here the row becomes NaN). A key of zero weight (masked, or whose weight
//! underflows) contributes exactly 0 even when its value is `±∞`/NaN (an unwritten KV-cache
//! slot), as in the reference; empty head dimensions (`d_k = 0`, `d_v = 0`) accept any strides.
//!
//! Layout of this module: `blocking` (block sizes and thresholds, with their cache
//! reasoning), `simd` (the ISA layer: vector trait, and the flash block products on the GEMM
//! micro-kernels; the only place with intrinsics), `sink` (the shared row writer of the
//! parallel loops, which claims each output row once), `flash`,
//! `decode`, `unfused` (the three algorithms, each written once over the ISA trait).

mod blocking;
mod decode;
mod flash;
pub(crate) mod simd;
mod sink;
mod unfused;

use attn_core::attention::check_attention;
use attn_core::{Mask, MatLayout, Result, Tensor4Layout, TensorMut, TensorRef};

use crate::arch::{self, Isa};
use crate::par::Parallelism;
use simd::Strided;

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
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    let isa = isa.require()?;
    let p = Problem::new(q, k, v, scale, mask, &o, lse.as_deref())?;
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
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    let isa = isa.require()?;
    let p = Problem::new(q, k, v, scale, mask, &o, lse.as_deref())?;
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
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    let isa = isa.require()?;
    let p = Problem::new(q, k, v, scale, mask, &o, lse.as_deref())?;
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

    /// Query row `(b, h, i)` times `scale`, into `out[..dk]`.
    fn scaled_query(&self, b: usize, h: usize, i: usize, out: &mut [f32]) {
        for (d, x) in out[..self.dk].iter_mut().enumerate() {
            *x = self.q.at(b, h, i, d) * self.scale2;
        }
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
