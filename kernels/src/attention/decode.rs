//! The decode path (flash-decoding): few queries, many keys.
//!
//! For each `(batch, K/V head)` the rows are every query of every query head of the GQA group
//! (`group · nq` rows share the same keys, so each key/value row is read once for all of
//! them). The keys are split into chunks; each `(batch, K/V head, chunk)` task runs the online
//! softmax over its chunk in blocks of `DECODE_BC` keys and returns its unnormalised partial
//! state `(m, l, O)`. The partials of a head are then merged by their logsumexp:
//! `M = max_c m_c`, `L = Σ_c e^(m_c − M)·l_c`, `O = Σ_c e^(m_c − M)·O_c / L`.
//!
//! The work is bandwidth-bound (each K/V element feeds `group · nq` FMAs), so the block loop
//! is built to stream: the score pass (`decode_qk_block`) runs register tiles of up to 4 rows ×
//! 2–8 keys with vectors along the head dimension, finished by a transposed reduction, and
//! prefetches the key rows ahead and the block's value rows; the P·V pass (`decode_pv_block`)
//! runs tiles of up to 4 rows × 2–8 value vectors, so each K/V vector is loaded once for all
//! rows. A block is small (16 keys) so its K and V rows are still in L1 when the second pass
//! reads them.
//!
//! The split into chunks depends on the visible key range only ([`split`]: all `nk` keys, or
//! those a window or causal mask leaves to the queries), and the merge visits the chunks in
//! order, so the result is bitwise identical whatever the thread count (threads only decide
//! which chunks run where).

use rayon::prelude::*;

use attn_core::{AnyMut, Element, Result, TensorMut};

use super::blocking::{DECODE_BC, DECODE_MAX_CHUNKS, DECODE_MIN_CHUNK};
use super::blocks::{
    axpy, decode_pv_block, decode_qk_block, exp_row, pos_inf_weights, row_max, KvAny, KvMat,
    Strided,
};
use super::variants::softcap;
use super::{zeros, Problem};
use crate::arch::{vectorize, Isa, Kernel, Simd};
use crate::math::exp::exp_rr2_p7_scalar;
use crate::par::Parallelism;

/// Unnormalised online-softmax state of one chunk: per row the running maximum of the
/// scores (`f32::MIN` when nothing was visible), the sum of `e^(s − m)` and the weighted sum
/// of values (`rows × dv`).
struct Partial {
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
}

/// Runs the decode path and writes `o` and `lse`. Fails only when a task's scratch cannot be
/// allocated (see [`Chunk`]); `o` and `lse` are then left untouched.
pub(super) fn run(
    isa: Isa,
    p: &Problem<'_>,
    o: AnyMut<'_>,
    lse: Option<&mut [f32]>,
    par: Parallelism,
) -> Result<()> {
    let heads = p.batch.saturating_mul(p.hkv);
    if heads == 0 || p.nq == 0 {
        return Ok(());
    }
    // The keys any query may see (all of them but for a causal mask or a window).
    let (k0, k1) = (p.key_start(0), p.key_end(p.nq - 1).max(p.key_start(0)));
    let (chunks, chunk_len) = split(k1 - k0);
    let task = |t: usize| {
        let (bk, c) = (t / chunks, t % chunks);
        let c0 = k0.saturating_add(c * chunk_len).min(k1);
        let c1 = c0.saturating_add(chunk_len).min(k1);
        chunk(isa, Chunk { p, b: bk / p.hkv, kh: bk % p.hkv, c0, c1 })
    };
    // Rows (batch·hq·nq) are bounded by the output or lse slice (the caller returned early
    // when neither has an element), so this product is too; saturating all the same.
    let tasks = heads.saturating_mul(chunks);
    // The thread count only picks who runs the chunks, never how the keys are split.
    let partials: Vec<Partial> = if par.count() == 1 || tasks == 1 {
        (0..tasks).map(task).collect::<Result<_>>()?
    } else {
        par.install(|| (0..tasks).into_par_iter().with_min_len(1).map(task).collect::<Result<_>>())?
    };
    let acc = zeros("v", Some(p.dv))?;
    match o {
        AnyMut::F32(o) => vectorize(isa, Merge { p, partials: &partials, chunks, o, lse, acc }),
        AnyMut::BF16(o) => vectorize(isa, Merge { p, partials: &partials, chunks, o, lse, acc }),
        AnyMut::F16(o) => vectorize(isa, Merge { p, partials: &partials, chunks, o, lse, acc }),
    }
    Ok(())
}

/// The key split of every `(batch, K/V head)`: `(chunks, keys per chunk)`, a function of `nk`
/// only. Chunks are [`DECODE_MIN_CHUNK`] keys (a multiple of the block, so chunk boundaries
/// fall on block boundaries), longer once a head would have more than [`DECODE_MAX_CHUNKS`];
/// every chunk but the last is full.
fn split(nk: usize) -> (usize, usize) {
    let chunk_len =
        nk.div_ceil(DECODE_MAX_CHUNKS).next_multiple_of(DECODE_BC).max(DECODE_MIN_CHUNK);
    (nk.div_ceil(chunk_len).max(1), chunk_len)
}

/// Merges the chunks of each head by logsumexp and writes the normalised rows. Runs as a
/// [`Kernel`]: the weighted sums of the chunks' output rows are vector FMAs (`axpy`), where
/// `f32::mul_add` outside the ISA's code would be a call to the software `fmaf` per element,
/// which cost more than the chunking itself (the same bits either way: a fused multiply-add
/// is rounded once). Each output value is rounded once to the output type `T`.
struct Merge<'r, 'a, 'o, T> {
    p: &'r Problem<'a>,
    partials: &'r [Partial],
    chunks: usize,
    o: TensorMut<'o, T>,
    lse: Option<&'r mut [f32]>,
    /// One output row's weighted sum, `dv` floats.
    acc: Vec<f32>,
}

impl<T: Element> Kernel for Merge<'_, '_, '_, T> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let Merge { p, partials, chunks, o, mut lse, mut acc } = self;
        let rows = p.group * p.nq;
        for (bk, parts) in partials.chunks(chunks).enumerate() {
            let (b, kh) = (bk / p.hkv, bk % p.hkv);
            for r in 0..rows {
                let (h, i) = (kh * p.group + r / p.nq, r % p.nq);
                let mx = parts.iter().map(|c| c.m[r]).fold(f32::MIN, f32::max);
                let mut total = 0.0f32;
                acc.fill(0.0);
                for c in parts {
                    // e^(m_c − M) in f64: two scalars per chunk, no need for the vector exp.
                    // Equal maxima weigh 1, also when both are +∞ (the +∞ keys share the
                    // weight).
                    let w = if c.m[r] == mx {
                        1.0
                    } else {
                        (f64::from(c.m[r]) - f64::from(mx)).exp() as f32
                    };
                    if w == 0.0 {
                        continue; // weight 0: contributes nothing, even an ∞ partial (0·∞)
                    }
                    total = w.mul_add(c.l[r], total);
                    axpy(s, w, &c.o[r * p.dv..(r + 1) * p.dv], &mut acc);
                }
                // NaN in any chunk must survive the merge (f32::max above skips NaN maxima).
                if parts.iter().any(|c| c.l[r].is_nan()) {
                    total = f32::NAN;
                }
                let (inv, row_lse) = p.finish(h, mx, total);
                for (d, a) in acc.iter().enumerate() {
                    let idx = o.layout.index(b, h, i, d);
                    o.data[idx] = T::from_f32(a * inv);
                }
                if let Some(out) = lse.as_deref_mut() {
                    out[(b * p.hq + h) * p.nq + i] = row_lse;
                }
            }
        }
    }
}

/// One task: keys `c0..c1` of K/V head `kh` of batch `b`, for all rows of the group. Its
/// scratch grows with `dk` and `dv`, which a zero-stride operand can make huge: allocated
/// fallibly, so such a call fails with `InvalidParameter` rather than aborting.
struct Chunk<'r, 'a> {
    p: &'r Problem<'a>,
    b: usize,
    kh: usize,
    c0: usize,
    c1: usize,
}

/// Runs one chunk: dispatches once on the K/V storage types, before entering the ISA's code.
/// K and V of one type whose columns are contiguous are read in place in it (bf16/f16
/// widened, int8 dequantised in registers); otherwise (strided columns, or K and V of two
/// types) both are gathered block by block into f32 (the same values). Each source pair is
/// its own [`Kernel`], so each ISA compiles five functions of one body each: inlined into one
/// function, the five bodies made that function's optimisation superlinearly slow to compile.
fn chunk(isa: Isa, c: Chunk<'_, '_>) -> Result<Partial> {
    let (keys, values) = (c.p.keys(c.b, c.kh), c.p.values(c.b, c.kh));
    let (dk, dv) = (c.p.dk, c.p.dv);
    match (keys, values) {
        (KvAny::F32(k), KvAny::F32(v)) if k.in_place(dk) && v.in_place(dv) => {
            vectorize(isa, Sourced { c, values, kb: InPlace(k), vb: InPlace(v) })
        }
        (KvAny::BF16(k), KvAny::BF16(v)) if k.in_place(dk) && v.in_place(dv) => {
            vectorize(isa, Sourced { c, values, kb: InPlace(k), vb: InPlace(v) })
        }
        (KvAny::F16(k), KvAny::F16(v)) if k.in_place(dk) && v.in_place(dv) => {
            vectorize(isa, Sourced { c, values, kb: InPlace(k), vb: InPlace(v) })
        }
        (KvAny::Q8(k), KvAny::Q8(v)) if k.in_place(dk) && v.in_place(dv) => {
            vectorize(isa, Sourced { c, values, kb: InPlace(k), vb: InPlace(v) })
        }
        _ => {
            let (kb, vb) = (Gather::new(keys, dk, "k")?, Gather::new(values, dv, "v")?);
            vectorize(isa, Sourced { c, values, kb, vb })
        }
    }
}

/// A chunk with its key and value block sources: the [`Kernel`] of one source pair.
struct Sourced<'r, 'a, 'v, KB, VB> {
    c: Chunk<'r, 'a>,
    values: KvAny<'v>,
    kb: KB,
    vb: VB,
}

impl<KB: Blocks, VB: Blocks> Kernel for Sourced<'_, '_, '_, KB, VB> {
    type Output = Result<Partial>;

    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> Result<Partial> {
        let Sourced { c, values, kb, vb } = self;
        c.body(s, values, kb, vb)
    }
}

/// Where a task's key (or value) blocks come from: the matrix itself, read in place, or an
/// f32 copy gathered block by block.
trait Blocks {
    /// The matrix the tiles read.
    type M<'b>: KvMat
    where
        Self: 'b;
    /// Whether the rows are read in place (their later rows can be prefetched).
    const IN_PLACE: bool;
    /// Rows `j0..j0 + nb` as a matrix and the index of row `j0` in it.
    fn block<S: Simd>(&mut self, s: S, j0: usize, nb: usize) -> (Self::M<'_>, usize);
}

/// A matrix read in place.
struct InPlace<K>(K);

impl<K: KvMat> Blocks for InPlace<K> {
    type M<'b>
        = K
    where
        Self: 'b;
    const IN_PLACE: bool = true;
    #[inline(always)]
    fn block<S: Simd>(&mut self, _: S, j0: usize, _: usize) -> (K, usize) {
        (self.0, j0)
    }
}

/// A matrix (`n` columns, any type and strides) gathered into a contiguous f32 block.
struct Gather<'a> {
    m: KvAny<'a>,
    n: usize,
    buf: Vec<f32>,
}

impl<'a> Gather<'a> {
    /// Allocated fallibly: `n` can be huge for a zero-stride operand.
    fn new(m: KvAny<'a>, n: usize, arg: &'static str) -> Result<Self> {
        Ok(Gather { m, n, buf: zeros(arg, DECODE_BC.checked_mul(n))? })
    }
}

impl Blocks for Gather<'_> {
    type M<'b>
        = Strided<'b>
    where
        Self: 'b;
    const IN_PLACE: bool = false;
    #[inline(always)]
    fn block<S: Simd>(&mut self, s: S, j0: usize, nb: usize) -> (Strided<'_>, usize) {
        (gathered(s, self.m, j0, nb, self.n, &mut self.buf), 0)
    }
}

impl Chunk<'_, '_> {
    /// The chunk's online softmax with the key and value blocks from `kb` and `vb`.
    #[inline(always)]
    fn body<S: Simd, KB: Blocks, VB: Blocks>(
        self,
        s: S,
        values: KvAny<'_>,
        mut kb: KB,
        mut vb: VB,
    ) -> Result<Partial> {
        let Chunk { p, b, kh, c0, c1 } = self;
        let (dk, dv, nq) = (p.dk, p.dv, p.nq);
        let rows = p.group * nq;
        let mut part = Partial {
            m: vec![f32::MIN; rows],
            l: vec![0.0; rows],
            o: zeros("v", rows.checked_mul(dv))?,
        };
        // Rows are (head in group, query); every row is pre-scaled by scale.
        let mut qs = zeros("q", rows.checked_mul(dk))?;
        for r in 0..rows {
            let h = kh * p.group + r / nq;
            p.scaled_query(b, h, r % nq, &mut qs[r * dk..(r + 1) * dk]);
        }
        let mut sb = zeros("q", rows.checked_mul(DECODE_BC))?;
        let mut j0 = c0;
        while j0 < c1 {
            let nb = (c1 - j0).min(DECODE_BC);
            // Scores of every row against the block's keys: each key row is read once. Value
            // rows read in place are prefetched by the score pass.
            let pf = VB::IN_PLACE.then_some((values, j0, dv));
            let (k, kj) = kb.block(s, j0, nb);
            decode_qk_block(s, &qs, rows, dk, k, kj, nb, &mut sb, DECODE_BC, pf);
            if let Some(c) = p.variants.softcap {
                softcap(s, &mut sb[..rows * DECODE_BC], c);
            }
            if p.masks_scores() {
                for r in 0..rows {
                    let h = kh * p.group + r / nq;
                    let srow = &mut sb[r * DECODE_BC..r * DECODE_BC + nb];
                    p.apply_mask(b, h, r % nq, 1, j0, nb, 1, srow);
                    p.apply_variants(h, r % nq, 1, j0, nb, 1, srow);
                }
            }
            // Online softmax per row; the output rows are rescaled before accumulating.
            let mut guard = false;
            for r in 0..rows {
                let srow = &mut sb[r * DECODE_BC..r * DECODE_BC + nb];
                let m_old = part.m[r];
                let m_new = row_max(s, srow, m_old);
                // A +∞ maximum (overflowed score, +∞ bias): the +∞ keys share the weight.
                let sum = if m_new == f32::INFINITY {
                    pos_inf_weights(srow, nb, 1, 0)
                } else {
                    exp_row(s, srow, m_new)
                };
                // A zero weight (masked or underflowed) needs the guarded P·V tile.
                guard |= srow.contains(&0.0);
                // An unchanged maximum (the common case once it settles) needs no rescale.
                let alpha = if m_new == m_old { 1.0 } else { exp_rr2_p7_scalar(s, m_old - m_new) };
                part.l[r] = alpha.mul_add(part.l[r], sum);
                part.m[r] = m_new;
                // alpha = 0: the earlier keys now weigh 0 and contribute nothing, not 0·∞.
                let o_row = &mut part.o[r * dv..(r + 1) * dv];
                if alpha == 0.0 {
                    o_row.fill(0.0);
                } else if alpha != 1.0 {
                    o_row.iter_mut().for_each(|x| *x *= alpha);
                }
            }
            // Values: each value row is read once for all rows.
            let (v, vj) = vb.block(s, j0, nb);
            decode_pv_block(s, guard, &sb, DECODE_BC, rows, nb, v, vj, dv, &mut part.o);
            j0 += nb;
        }
        Ok(part)
    }
}

/// Rows `j0..j0 + nb` of `m` (`n` columns) widened or dequantised into `buf` (`nb·n` floats):
/// a contiguous f32 view whose row 0 is key `j0`.
#[inline(always)]
fn gathered<'t, S: Simd>(
    s: S,
    m: KvAny<'_>,
    j0: usize,
    nb: usize,
    n: usize,
    buf: &'t mut [f32],
) -> Strided<'t> {
    m.gather(s, j0, nb, n, buf);
    Strided { data: &buf[..nb * n], offset: 0, rs: n, cs: 1 }
}
