//! The unfused path: per `(batch, query head)`, materialise the scores `S = scale·(Q·Kᵀ)`
//! (`Nq × Nk`, one SGEMM, then the scale), apply the mask and a row softmax in place, then
//! `O = P·V` (a second SGEMM) and divide each row by its sum. It needs `Nq·(Nk + dv)` floats per task, which is the
//! point of comparison with the flash path; it is kept for equivalence tests and benchmarks,
//! not for production use. Operands stored in another type than f32 (bf16, f16, int8 K/V)
//! are converted to f32 per head first, the same values the other paths read.

use rayon::prelude::*;

use attn_core::{AnyRef, MatLayout, MatMut, MatRef, Result};

use super::blocks::{axpy, exp_row, pos_inf_weights, KvAny, Strided};
use super::sink::Sink;
use super::variants::softcap;
use super::{matrix, row_of, zeros, Problem, ScoreBlock};
use crate::arch::{vectorize, Isa, Kernel, Portable, Simd};
use crate::gemm::sgemm_with_isa;
use crate::par::Parallelism;

/// Runs the unfused path over all heads, writing through `sink`. With fewer heads than
/// threads the SGEMMs get the threads instead.
pub(super) fn run(isa: Isa, p: &Problem<'_>, sink: &Sink<'_>, par: Parallelism) -> Result<()> {
    let tasks = p.batch.saturating_mul(p.hq);
    if p.nq == 0 || tasks == 0 {
        return Ok(());
    }
    if par.count() == 1 || tasks < par.count() {
        (0..tasks).try_for_each(|t| head(isa, p, sink, t, par))
    } else {
        par.install(|| {
            (0..tasks)
                .into_par_iter()
                .with_min_len(1)
                .try_for_each(|t| head(isa, p, sink, t, Parallelism::Sequential))
        })
    }
}

/// Head `t mod hq` of batch `t / hq`.
fn head(isa: Isa, p: &Problem<'_>, sink: &Sink<'_>, t: usize, par: Parallelism) -> Result<()> {
    let (b, h) = (t / p.hq, t % p.hq);
    let kh = h / p.group;
    let (nq, nk, dv) = (p.nq, p.nk, p.dv);
    // 1. S = Q·Kᵀ (Kᵀ is K's view transposed: no copy), scaled with the mask below. Not as
    //    the SGEMM's α: α = 0 skips the product (BLAS), where the reference's scale·(q·k) is
    //    NaN for an infinite q·k.
    let mut sc = zeros("k", nq.checked_mul(nk))?;
    let dk = p.dk;
    let qbuf;
    let q = match p.q {
        AnyRef::F32(q) => MatRef::new(q.data, matrix(&q.layout, b, h)),
        _ => {
            let mut buf = zeros("q", nq.checked_mul(dk))?;
            for (i, row) in buf.chunks_exact_mut(dk.max(1)).enumerate().take(nq) {
                for (d, x) in row[..dk].iter_mut().enumerate() {
                    *x = p.q.at_f64(b, h, i, d) as f32; // exact: an f32 value widened
                }
            }
            qbuf = buf;
            MatRef::row_major(&qbuf, nq, dk)
        }
    };
    let kbuf;
    let ks = match p.keys(b, kh) {
        KvAny::F32(m) => m,
        other => {
            kbuf = widen_head(isa, other, nk, dk)?;
            Strided { data: &kbuf, offset: 0, rs: dk, cs: 1 }
        }
    };
    let kt = MatRef::new(ks.data, MatLayout::strided(nk, dk, ks.rs, ks.cs, ks.offset).transposed());
    sgemm_with_isa(isa, 1.0, q, kt, 0.0, MatMut::row_major(&mut sc, nq, nk), par)?;
    // 2. Mask and softmax rows (unnormalised; each row keeps its max and sum).
    let (maxes, sums) = vectorize(isa, SoftmaxRows { p, b, h, sc: &mut sc });
    // 3. O = P·V, normalised once per row. A zero weight must contribute exactly 0 (the
    //    reference skips it), but the SGEMM would form 0·∞ = NaN at a ±∞/NaN value (e.g. an
    //    unwritten KV-cache slot under the mask): when the head has both, P·V skips the zero
    //    weights row by row instead (vectorised along dv; this path is for tests and benches).
    let mut o = zeros("v", nq.checked_mul(dv))?;
    if nk > 0 && dv > 0 {
        let vbuf;
        let vs = match p.values(b, kh) {
            KvAny::F32(m) => m,
            other => {
                vbuf = widen_head(isa, other, nk, dv)?;
                Strided { data: &vbuf, offset: 0, rs: dv, cs: 1 }
            }
        };
        let mut tmp = vec![0.0f32; dv];
        let nonfinite_v =
            (0..nk).any(|j| row_of(&vs, j, dv, &mut tmp).iter().any(|x| !x.is_finite()));
        if nonfinite_v && sc.contains(&0.0) {
            vectorize(isa, SkipZeroPv { p, values: vs, sc: &sc, o: &mut o });
        } else {
            let v = MatRef::new(vs.data, MatLayout::strided(nk, dv, vs.rs, vs.cs, vs.offset));
            let pm = MatRef::new(&sc, MatLayout::row_major(nq, nk));
            sgemm_with_isa(isa, 1.0, pm, v, 0.0, MatMut::row_major(&mut o, nq, dv), par)?;
        }
    }
    for i in 0..nq {
        let (inv, lse) = p.finish(h, maxes[i], sums[i], sink.has_lse());
        let row = &o[i * dv..(i + 1) * dv];
        // Outside any ISA's code: the portable vectors (this path is for tests and benches).
        sink.write_row(Portable, b, h, i, lse, |d| row[d] * inv);
    }
    Ok(())
}

/// Masks each score row of one head and replaces it by `e^(s − max)`; returns the maxima and
/// the sums.
struct SoftmaxRows<'r, 'a> {
    p: &'r Problem<'a>,
    b: usize,
    h: usize,
    sc: &'r mut [f32],
}

impl Kernel for SoftmaxRows<'_, '_> {
    type Output = (Vec<f32>, Vec<f32>);

    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> Self::Output {
        let SoftmaxRows { p, b, h, sc } = self;
        let (nq, nk) = (p.nq, p.nk);
        let (mut maxes, mut sums) = (vec![f32::MIN; nq], vec![0.0f32; nq]);
        if nk == 0 {
            return (maxes, sums);
        }
        for (i, row) in sc.chunks_exact_mut(nk).enumerate() {
            if p.scale2 != 1.0 {
                row.iter_mut().for_each(|x| *x *= p.scale2);
            }
            if let Some(c) = p.variants.softcap {
                softcap(s, row, c);
            }
            let blk = ScoreBlock { b, h, i0: i, rows: 1, j0: 0, nb: nk };
            p.apply_mask(s, blk, 1, row);
            p.apply_variants(blk, 1, row);
            let m = row.iter().fold(f32::MIN, |a, &x| if x > a { x } else { a });
            // A +∞ maximum (overflowed score, +∞ bias): the +∞ keys share the weight.
            sums[i] = if m == f32::INFINITY {
                pos_inf_weights(row, nk, 1, 0)
            } else {
                exp_row(s, row, m).0
            };
            maxes[i] = m;
        }
        (maxes, sums)
    }
}

/// All `nk` rows (`n` columns) of a K/V head of another type than f32, converted to a
/// contiguous f32 matrix.
fn widen_head(isa: Isa, m: KvAny<'_>, nk: usize, n: usize) -> Result<Vec<f32>> {
    let mut buf = zeros("k", nk.checked_mul(n))?;
    vectorize(isa, WidenHead { m, nk, n, buf: &mut buf });
    Ok(buf)
}

/// The body of [`widen_head`].
struct WidenHead<'r, 'a> {
    m: KvAny<'a>,
    nk: usize,
    n: usize,
    buf: &'r mut [f32],
}

impl Kernel for WidenHead<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        self.m.gather(s, 0, self.nk, self.n, self.buf);
    }
}

/// `O = P·V` for one head skipping zero weights (`o` is `nq × dv`, zeroed), for heads whose V
/// has non-finite values.
struct SkipZeroPv<'r, 'a> {
    p: &'r Problem<'a>,
    values: Strided<'r>,
    sc: &'r [f32],
    o: &'r mut [f32],
}

impl Kernel for SkipZeroPv<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let SkipZeroPv { p, values, sc, o } = self;
        let (nk, dv) = (p.nk, p.dv);
        let mut tmp = vec![0.0f32; dv];
        for (prow, orow) in sc.chunks_exact(nk).zip(o.chunks_exact_mut(dv)) {
            for (j, &w) in prow.iter().enumerate() {
                if w != 0.0 {
                    axpy(s, w, row_of(&values, j, dv, &mut tmp), orow);
                }
            }
        }
    }
}
