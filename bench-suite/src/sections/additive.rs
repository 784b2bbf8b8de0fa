//! Additive (Bahdanau) attention `O = softmax(wᵀ·tanh(Q·Wq + K·Wk))·V`, one head, d = 64,
//! N = Nq = Nk = 1024 and 4096, hidden width da = 64 and 128 (the `mask` label of each shape
//! names its `da`):
//!
//! - ours ([`AdditiveAttention`], streamed) beside an unfused composition of our own kernels
//!   ([`Problem::unfused`]: projection SGEMMs, the `N × N` score matrix materialised with the
//!   rational tanh, the softmax, an SGEMM for `P·V`) and the reference at the smallest case.
//!   FLOPs count what is common to all three and dominant: per score `da` tanh evaluations and
//!   multiply-adds, so `2·(da + dv)` per (query, key) pair (the tanh's own operations are not
//!   counted); the rate is a throughput to compare in the same row, not a fraction of the FMA
//!   peak to aim at;
//! - the tanh throughput: our scoring alone (the kernel with `dv = 0` and a logsumexp output:
//!   the scores and the online softmax's exps, no `P·V`) beside our exp-based softmax over a
//!   score matrix of the same `N × N`, in scores (elements) per second each, in alternating
//!   calls. A score costs `da` tanh evaluations against the softmax's one exp per element.

use attn_kernels::attention::{AdditiveAttention, AdditiveWeights};
use attn_kernels::gemm::sgemm;
use attn_kernels::math::tanh_rational;
use attn_kernels::softmax::scale_mask_softmax_inplace;
use attn_kernels::Parallelism;
use attn_reference::softmax::softmax_row;
use attn_reference::{
    Mask, MatLayout, MatMut, MatRef, Result, Tensor4Layout, TensorMut, TensorRef,
};
use attn_tests::numerics::{additive_score_bound, streamed_row_rel_bound, U};
use rayon::prelude::*;

use super::{Call, Ctx, Work};
use crate::check::{compare, Rng};
use crate::record::Shape;

const OP: &str = "additive";

/// One head of additive attention: `q: [nq, d]`, `k, v: [nk, d]` (`v` may be narrower, `dv`),
/// `wq, wk: [d, da]`, `w: [da]`, all row-major.
pub struct Problem {
    /// Sizes, as recorded (`mask` names `da`).
    pub shape: Shape,
    nq: usize,
    nk: usize,
    d: usize,
    dv: usize,
    da: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    w: Vec<f32>,
}

impl Problem {
    /// Random operands: `q, k, v, w` in [−1, 1), `wq, wk` in [−1, 1)/√d so that the tanh
    /// arguments are of order 1 (neither all saturated nor all linear).
    pub fn new(n: (usize, usize), d: usize, dv: usize, da: usize, label: &'static str) -> Self {
        let (nq, nk) = n;
        let mut rng = Rng::new((nq * 31 + nk * 7 + d + da) as u64);
        let scaled = |rng: &mut Rng, len| {
            let s = 1.0 / (d.max(1) as f32).sqrt();
            rng.vec(len).into_iter().map(|x| x * s).collect::<Vec<_>>()
        };
        let (q, k, v) = (rng.vec(nq * d), rng.vec(nk * d), rng.vec(nk * dv));
        let (wq, wk, w) = (scaled(&mut rng, d * da), scaled(&mut rng, d * da), rng.vec(da));
        let shape = Shape::Attn { batch: 1, heads: 1, kv_heads: 1, nq, nk, dk: d, dv, mask: label };
        Problem { shape, nq, nk, d, dv, da, q, k, v, wq, wk, w }
    }

    fn weights(&self) -> AdditiveWeights<'_> {
        AdditiveWeights {
            wq: MatRef::new(&self.wq, MatLayout::row_major(self.d, self.da)),
            wk: MatRef::new(&self.wk, MatLayout::row_major(self.d, self.da)),
            w: &self.w,
        }
    }

    /// Elements of the output.
    pub fn out_len(&self) -> usize {
        self.nq * self.dv
    }

    /// FLOPs of one call as the module docs count them.
    pub fn flops(&self) -> f64 {
        (self.nq * self.nk) as f64 * 2.0 * (self.da + self.dv) as f64
    }

    /// Ours, into `o` (and the logsumexps into `lse` when given).
    pub fn ours(&self, o: &mut [f32], lse: Option<&mut [f32]>, threads: usize) -> Result<()> {
        let (nq, nk, d, dv) = (self.nq, self.nk, self.d, self.dv);
        let a = AdditiveAttention::new(
            TensorRef::new(&self.q, Tensor4Layout::bhsd(1, 1, nq, d)),
            TensorRef::new(&self.k, Tensor4Layout::bhsd(1, 1, nk, d)),
            TensorRef::new(&self.v, Tensor4Layout::bhsd(1, 1, nk, dv)),
            self.weights(),
        )
        .parallelism(Parallelism::threads(threads));
        let a = match lse {
            Some(l) => a.lse(l),
            None => a,
        };
        a.run(TensorMut::new(o, Tensor4Layout::bhsd(1, 1, nq, dv)))
    }

    /// The unfused composition of our kernels, the way a framework without an additive kernel
    /// runs it, one query row at a time for the `[nk, da]` tanh intermediate (the whole
    /// `[nq, nk, da]` tensor would be 8 GiB at N = 4096, da = 128):
    /// 1. `A = Q·Wq`, `B = K·Wk` (SGEMM);
    /// 2. per query row `i` (rows split over the threads): `E = A_i + B` (`[nk, da]`, a
    ///    broadcast add), `E ← tanh(E)` (our rational tanh, as the kernel's), `S_i = E·w` (SGEMM, `n = 1`),
    ///    into the materialised `nq × nk` score matrix;
    /// 3. `P = softmax(S)` (our fused softmax, in place);
    /// 4. `O = P·V` (SGEMM).
    pub fn unfused(&self, o: &mut [f32], threads: usize) -> Result<()> {
        let (nq, nk, d, dv, da) = (self.nq, self.nk, self.d, self.dv, self.da);
        let par = Parallelism::threads(threads);
        let wts = self.weights();
        let mut a = vec![0.0f32; nq * da];
        let mut b = vec![0.0f32; nk * da];
        let rm = MatRef::new;
        sgemm(1.0, rm(&self.q, MatLayout::row_major(nq, d)), wts.wq, 0.0, mm(&mut a, nq, da), par)?;
        sgemm(1.0, rm(&self.k, MatLayout::row_major(nk, d)), wts.wk, 0.0, mm(&mut b, nk, da), par)?;
        let mut s = vec![0.0f32; nq * nk];
        let w = MatRef::new(&self.w, MatLayout::row_major(da, 1));
        let rows_per_task = nq.div_ceil(par.count()).max(1);
        par.install(|| {
            s.par_chunks_mut(rows_per_task * nk.max(1)).enumerate().try_for_each(|(c, rows)| {
                let mut e = vec![0.0f32; nk * da];
                for (r, srow) in rows.chunks_mut(nk.max(1)).enumerate() {
                    let arow = &a[(c * rows_per_task + r) * da..][..da];
                    for (erow, brow) in e.chunks_exact_mut(da).zip(b.chunks_exact(da)) {
                        for ((x, &p), &q) in erow.iter_mut().zip(arow).zip(brow) {
                            *x = p + q;
                        }
                    }
                    tanh_rational(&mut e);
                    let e = MatRef::new(&e, MatLayout::row_major(nk, da));
                    sgemm(1.0, e, w, 0.0, mm(srow, nk, 1), Parallelism::Sequential)?;
                }
                Ok(())
            })
        })?;
        let ls = Tensor4Layout::bhsd(1, 1, nq, nk);
        scale_mask_softmax_inplace(TensorMut::new(&mut s, ls), 1.0, &Mask::None, None, par)?;
        let (p, v) =
            (rm(&s, MatLayout::row_major(nq, nk)), rm(&self.v, MatLayout::row_major(nk, dv)));
        sgemm(1.0, p, v, 0.0, mm(o, nq, dv), par)
    }

    /// The reference: `attn_reference::additive_scores` (f64, each score rounded once), the
    /// reference softmax of each row in f64, and `P·V` in f64.
    pub fn reference(&self, o: &mut [f32]) -> Result<()> {
        let (nq, nk, d, dv) = (self.nq, self.nk, self.d, self.dv);
        let wts = self.weights();
        let rw = attn_reference::AdditiveWeights { wq: wts.wq, wk: wts.wk, w: wts.w };
        let mut s = vec![0.0f32; nq * nk];
        attn_reference::additive_scores(
            MatRef::new(&self.q, MatLayout::row_major(nq, d)),
            MatRef::new(&self.k, MatLayout::row_major(nk, d)),
            &rw,
            mm(&mut s, nq, nk),
        )?;
        for (srow, orow) in s.chunks_exact(nk.max(1)).zip(o.chunks_exact_mut(dv.max(1))) {
            let logits: Vec<Option<f64>> = srow.iter().map(|&x| Some(f64::from(x))).collect();
            let (p, _) = softmax_row(&logits);
            for (c, x) in orow.iter_mut().enumerate() {
                *x = p
                    .iter()
                    .enumerate()
                    .map(|(j, pj)| pj * f64::from(self.v[j * dv + c]))
                    .sum::<f64>() as f32;
            }
        }
        Ok(())
    }

    /// The reference output in f64 and each element's bound: per row, `δ` = the largest
    /// score bound ([`additive_score_bound`], plus `2u·|s|` for the reference's rounding of
    /// the score), then [`streamed_row_rel_bound`]`(δ, nk)·Σ_j p_j·|v_j|`. The unfused
    /// composition is covered too: its score is the same chain (an SGEMM dot product over
    /// `da` for the FMA chain), its softmax is not streamed (fewer roundings) and its `P·V` is
    /// a dot product of length `nk`.
    fn bound(&self) -> (Vec<f32>, Vec<f64>) {
        let (nq, nk, d, dv, da) = (self.nq, self.nk, self.d, self.dv, self.da);
        let (mut want, mut bound) = (vec![0.0f32; nq * dv], vec![0.0f64; nq * dv]);
        for i in 0..nq {
            let mut delta: f64 = 0.0;
            let mut logits = Vec::with_capacity(nk);
            for j in 0..nk {
                let (mut x, mut mq, mut mk) =
                    (vec![0.0f64; da], vec![0.0f64; da], vec![0.0f64; da]);
                for a in 0..da {
                    for p in 0..d {
                        let y = f64::from(self.q[i * d + p]) * f64::from(self.wq[p * da + a]);
                        x[a] += y;
                        mq[a] += y.abs();
                        let y = f64::from(self.k[j * d + p]) * f64::from(self.wk[p * da + a]);
                        x[a] += y;
                        mk[a] += y.abs();
                    }
                }
                let s: f64 = (0..da).map(|a| f64::from(self.w[a]) * x[a].tanh()).sum();
                logits.push(Some(s));
                delta = delta
                    .max(additive_score_bound(&self.w, &x, &mq, &mk, d, d) + 2.0 * U * s.abs());
            }
            let (p, _) = softmax_row(&logits);
            let rel = streamed_row_rel_bound(delta, nk);
            for c in 0..dv {
                let (mut o, mut m) = (0.0f64, 0.0f64);
                for (j, pj) in p.iter().enumerate() {
                    let vv = f64::from(self.v[j * dv + c]);
                    o += pj * vv;
                    m += pj * vv.abs();
                }
                want[i * dv + c] = o as f32;
                bound[i * dv + c] = rel * m + 2.0 * U * o.abs() + f64::from(f32::MIN_POSITIVE);
            }
        }
        (want, bound)
    }
}

/// A row-major `rows × cols` output view.
fn mm(data: &mut [f32], rows: usize, cols: usize) -> MatMut<'_> {
    MatMut::row_major(data, rows, cols)
}

/// Checks ours and the unfused composition at each thread count against the f64 reference
/// ([`Problem::bound`]), and the timed reference against it too, on odd sizes.
fn check(ctx: &mut Ctx) {
    let p = Problem::new((37, 150), 24, 20, 40, "da40");
    let (want, bound) = p.bound();
    let mut got = vec![f32::NAN; p.out_len()];
    let verdict =
        p.reference(&mut got).map(|()| compare(&got, &want, &bound)).map_err(|e| e.to_string());
    ctx.check(OP, "reference", p.shape.clone(), 1, verdict);
    for &t in &ctx.threads.clone() {
        for name in ["attn-kernels", "unfused"] {
            let mut got = vec![f32::NAN; p.out_len()];
            let r =
                if name == "unfused" { p.unfused(&mut got, t) } else { p.ours(&mut got, None, t) };
            let verdict = r.map(|()| compare(&got, &want, &bound)).map_err(|e| e.to_string());
            ctx.check(OP, name, p.shape.clone(), t, verdict);
        }
    }
}

/// The `da` label of a shape.
fn label(da: usize) -> &'static str {
    match da {
        32 => "da32",
        64 => "da64",
        128 => "da128",
        _ => "da",
    }
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    check(ctx);
    let d = 64;
    let (sizes, hidden): (&[usize], &[usize]) =
        if ctx.quick { (&[256, 512], &[32]) } else { (&[1024, 4096], &[64, 128]) };
    let threads = ctx.threads.clone();
    for &da in hidden {
        for &n in sizes {
            let p = Problem::new((n, n), d, d, da, label(da));
            let work = Work::Flops(p.flops());
            let (mut o1, mut o2, mut o3) =
                (vec![0.0f32; p.out_len()], vec![0.0f32; p.out_len()], vec![0.0f32; p.out_len()]);
            let plot = Some((format!("additive-{}", label(da)), n as f64));
            for &t in &threads {
                // The largest case (two calls of seconds each, alternating) on one thread only:
                // the thread speed-up is measured on the others.
                if t > 1 && n == 4096 && da == 128 {
                    continue;
                }
                let mut ours = || p.ours(&mut o1, None, t).map_err(|e| e.to_string());
                let mut unfused = || p.unfused(&mut o2, t).map_err(|e| e.to_string());
                let mut reference = || p.reference(&mut o3).map_err(|e| e.to_string());
                // The reference (f64, one tanh at a time) only at the smallest case, one thread.
                let with_ref = t == 1 && n == sizes[0] && da == hidden[0];
                let imps: &mut [(&'static str, Call<'_>)] = if with_ref {
                    &mut [
                        ("attn-kernels", &mut ours),
                        ("unfused", &mut unfused),
                        ("reference", &mut reference),
                    ]
                } else {
                    &mut [("attn-kernels", &mut ours), ("unfused", &mut unfused)]
                };
                ctx.bench_alternating(OP, p.shape.clone(), t, work, plot.clone(), imps);
            }
        }
    }

    // The tanh throughput: our scoring alone against our softmax, scores (elements) per second.
    let (n, da) = if ctx.quick { (256, 32) } else { (1024, 64) };
    let label = if ctx.quick { "da32 scores" } else { "da64 scores" };
    let p = Problem::new((n, n), d, 0, da, label);
    let mut x = Rng::new(0x7a11).vec(n * n);
    let mut lse = vec![0.0f32; n];
    let work = Work::Elems { elems: (n * n) as f64, bytes: 8.0 * (n * n) as f64 };
    for &t in &threads {
        let mut scores = || p.ours(&mut [], Some(&mut lse), t).map_err(|e| e.to_string());
        let mut softmax = || {
            let l = Tensor4Layout::bhsd(1, 1, n, n);
            scale_mask_softmax_inplace(
                TensorMut::new(&mut x, l),
                1.0,
                &Mask::None,
                None,
                Parallelism::threads(t),
            )
            .map_err(|e| e.to_string())
        };
        let imps: &mut [(&'static str, Call<'_>)] =
            &mut [("attn-kernels scores", &mut scores), ("softmax", &mut softmax)];
        ctx.bench_alternating(OP, p.shape.clone(), t, work, None, imps);
    }
}
