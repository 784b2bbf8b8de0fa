//! Additive (Bahdanau) attention `O = softmax(S + mask)·V` with the scores
//! `S_ij = wᵀ·tanh(q_i·Wq + k_j·Wk)` (row vectors, as in
//! `attn_reference::scores::additive_scores`), streamed: no `Nq × Nk` buffer.
//!
//! 1. Project once with the SGEMM: `A = Q·Wq` (`[Nq, da]` per query head, row-major) and
//!    `B = K·Wk` (per K/V head, stored transposed as `[da, Nk']`, `Nk'` = `Nk` rounded up to
//!    16 with zero padding, so that a vector of keys is one load per hidden unit).
//! 2. Exponentiate both projections once, `e^(2a)` and `e^(2b)` (full-range exp), for the
//!    *exp path* of the scores: with `E = e^(2(a + b)) = e^(2a)·e^(2b)`,
//!    `tanh(a + b) = 1 − 2/(E + 1)`, so a score is `S = W − 2·Σ_a w_a/(E_a + 1)` with
//!    `W = Σ_a w_a`: per (query, key, hidden unit) one multiply-add for `E + 1`, a reciprocal
//!    ([`Simd::recip`], an estimate and a Newton step) and a multiply-add, about a quarter of a
//!    tanh's operations. Its error is absolute (below `w_a·(2·(2·EXP_REL + u + RECIP_MAX_REL))`
//!    per term, before the sum's rounding): that is what moves a softmax weight, and it is
//!    the size of the rational tanh's few ULP of a result near ±1. It needs `|a|, |b| ≤ 20`
//!    (then `E` and `1/(E + 1)` are normal); query rows or blocks of keys with a projection
//!    beyond that, or not finite, take the *tanh path*: `Σ_a w_a·tanh(a + b)` with the
//!    rational tanh [`tanh_rational_simd`] (within
//!    [`TANH_RATIONAL_MAX_ULP`](crate::math::TANH_RATIONAL_MAX_ULP)).
//! 3. One task per `(batch, query head, tile of QR queries)`, `QR` the column width of the
//!    ISA's tile micro-kernel (`tile_kernel_for`); for each block of `BLOCK_K` keys (stopping
//!    at the causal diagonal of the tile's last query, and per row at its own), per query row:
//!    the scores (exp or tanh path), then the mask, then the online softmax of
//!    the flash path: running maximum `m` from `f32::MIN` (so `m − m'` is never `−∞ − (−∞)`),
//!    `α = e^(m − m')`, `P_j = e^(S_j − m')` with the 1-ULP exp, `l ← α·l + Σ P_j`. The row's
//!    `P` goes into column `r` of the tile's probability block, laid out as one packed B
//!    micro-panel (`[key][QR]`), and the block product `Oᵀ ← α·Oᵀ + Vᵀ·Pᵀ` runs on the GEMM
//!    micro-kernel as in the flash path ([`pv_block`]: keys of weight 0 contribute exactly
//!    nothing, so an `±∞`/NaN value there does not leak).
//! 4. Write `O/l` (zeros and logsumexp −∞ where `l = 0`: fully masked rows).
//!
//! `+∞` scores (only from a `+∞` bias: a finite `w` bounds `|S_ij| ≤ Σ|w_a|`) share their row's
//! weight evenly, a NaN score gives a NaN row, as in `attn_reference::softmax::softmax_row`.
//! Memory beyond the operands: the projections and their exps (`2·(batch·hq·Nq +
//! batch·hkv·Nk')·da` floats) and per-thread scratch of a tile.

use rayon::prelude::*;

use attn_core::{
    expect_dim, expect_finite, Error, Mask, MatLayout, MatMut, MatRef, Result, TensorMut, TensorRef,
};

use super::blocks::{pv_block, tile_rows, Strided};
use super::finish_plain;
use super::sink::Sink;
use crate::arch::{self, load, store, vectorize, Isa, Kernel, Simd};
use crate::gemm::pack::AlignedBuf;
use crate::gemm::sgemm_with_isa;
use crate::math::exp::{exp_rr2_p7, exp_rr2_p7_scalar, exp_slice_with_isa};
use crate::math::tanh::tanh_rational_simd;
use crate::par::Parallelism;

/// Largest query tile of any ISA (the tile micro-kernel's `NR`: 32 with AVX-512); the scratch
/// is sized for it.
const MAX_QR: usize = 32;
/// Keys per block: with `da ≤ 128` the block's projections (`da × 256 × 4` bytes ≤ 128 KiB)
/// stay in L2 across the tile's rows, and the probability block (`256 × QR` floats, 32 KiB at
/// `QR = 32`) in L1 for the `P·V` product, which rereads it once per `MR` value columns. A
/// multiple of every ISA's lane count.
const BLOCK_K: usize = 256;
/// The key projections are padded to a multiple of this (the widest vector), so that a vector
/// load at any lane-aligned key index below `Nk` stays inside the buffer.
const KEY_PAD: usize = 16;

/// The weights of additive scoring: `wq: [dq, da]`, `wk: [dk, da]`, `w: [da]`, shared by every
/// batch and head (the kernels' twin of `attn_reference::scores::AdditiveWeights`).
#[derive(Clone, Copy, Debug)]
pub struct AdditiveWeights<'a> {
    /// Query projection `[dq, da]`.
    pub wq: MatRef<'a>,
    /// Key projection `[dk, da]`.
    pub wk: MatRef<'a>,
    /// Output vector `[da]`.
    pub w: &'a [f32],
}

/// One additive-attention call `O = softmax(wᵀ·tanh(Q·Wq + K·Wk) + mask)·V` (module docs),
/// with every other setting named and defaulted, run by [`run`](Self::run).
///
/// `q: [batch, hq, nq, dq]`, `k: [batch, hkv, nk, dk]`, `v: [batch, hkv, nk, dv]`, output
/// `o: [batch, hq, nq, dv]`, strided views; `dq` and `dk` may differ; GQA/MQA when `hkv < hq`
/// (`hkv` divides `hq`, query head `h` reads K/V head `h / (hq / hkv)`). There is no score
/// scale (fold one into `w`). Settings and defaults:
///
/// | method | default |
/// | --- | --- |
/// | [`mask`](Self::mask) | [`Mask::None`] |
/// | [`lse`](Self::lse) | no logsumexp output |
/// | [`parallelism`](Self::parallelism) | [`Parallelism::Sequential`] |
/// | [`isa`](Self::isa) | [`arch::selected`] at [`run`](Self::run) |
///
/// ```
/// use attn_kernels::attention::{AdditiveAttention, AdditiveWeights};
/// use attn_kernels::{MatLayout, MatRef, Tensor4Layout, TensorMut, TensorRef};
///
/// // One head, 2 queries and 3 keys of width 2, hidden width 1, values all 1.
/// let (q, k, v) = (vec![0.5f32; 4], vec![0.25f32; 6], vec![1.0f32; 6]);
/// let (wq, wk, w) = ([1.0f32, -1.0], [0.5f32, 0.5], [2.0f32]);
/// let weights = AdditiveWeights {
///     wq: MatRef::new(&wq, MatLayout::row_major(2, 1)),
///     wk: MatRef::new(&wk, MatLayout::row_major(2, 1)),
///     w: &w,
/// };
/// let mut o = vec![0.0f32; 4];
/// AdditiveAttention::new(
///     TensorRef::new(&q, Tensor4Layout::bhsd(1, 1, 2, 2)),
///     TensorRef::new(&k, Tensor4Layout::bhsd(1, 1, 3, 2)),
///     TensorRef::new(&v, Tensor4Layout::bhsd(1, 1, 3, 2)),
///     weights,
/// )
/// .run(TensorMut::new(&mut o, Tensor4Layout::bhsd(1, 1, 2, 2)))?;
/// assert!(o.iter().all(|x| (x - 1.0).abs() < 1e-6));
/// # Ok::<(), attn_kernels::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "an attention problem computes nothing until `run`"]
pub struct AdditiveAttention<'a> {
    q: TensorRef<'a>,
    k: TensorRef<'a>,
    v: TensorRef<'a>,
    weights: AdditiveWeights<'a>,
    mask: Mask<'a>,
    lse: Option<&'a mut [f32]>,
    par: Parallelism,
    isa: Option<Isa>,
}

impl<'a> AdditiveAttention<'a> {
    /// The problem over these operands, every setting at its default. Nothing is checked until
    /// [`run`](Self::run).
    pub fn new(
        q: TensorRef<'a>,
        k: TensorRef<'a>,
        v: TensorRef<'a>,
        weights: AdditiveWeights<'a>,
    ) -> Self {
        AdditiveAttention {
            q,
            k,
            v,
            weights,
            mask: Mask::None,
            lse: None,
            par: Parallelism::Sequential,
            isa: None,
        }
    }

    /// The mask over `[batch, hq, nq, nk]` (default [`Mask::None`]).
    pub fn mask(mut self, mask: Mask<'a>) -> Self {
        self.mask = mask;
        self
    }

    /// Where to write the logsumexp of every query row: `batch·hq·nq` floats, row-major over
    /// `[batch, hq, nq]` (−∞ for a fully masked row); another length is
    /// `Error::ShapeMismatch { arg: "lse", .. }` at [`run`](Self::run).
    pub fn lse(mut self, lse: &'a mut [f32]) -> Self {
        self.lse = Some(lse);
        self
    }

    /// How many threads the call may use (default [`Parallelism::Sequential`]). The result is
    /// bitwise the same for every thread count.
    pub fn parallelism(mut self, par: Parallelism) -> Self {
        self.par = par;
        self
    }

    /// The ISA to run on (default [`arch::selected`]); one this CPU does not support is
    /// `Error::InvalidParameter { arg: "isa", .. }` at [`run`](Self::run).
    pub fn isa(mut self, isa: Isa) -> Self {
        self.isa = Some(isa);
        self
    }

    /// Checks the problem against the output `o: [batch, hq, nq, dv]` and computes it into `o`
    /// (and the logsumexps, if asked). Nothing is written when a check fails.
    ///
    /// Errors: an unsupported ISA; `ZeroHeads`, `KvHeadsNotDividing`; `ShapeMismatch` for `k`,
    /// `v`, `o` against `q`'s batch and heads and each other's sequence lengths, `wq` ≠
    /// `[dq, da]`, `wk` ≠ `[dk, da]`, `w` length ≠ `da` (with `da` = `wq`'s columns), the mask
    /// and `lse`; `OutOfBounds` and friends for views overrunning their slices; `AliasedOutput`;
    /// `NonFinite { arg: "wq" | "wk" | "w" }` for a non-finite weight; `InvalidParameter` when
    /// the projections cannot be allocated.
    pub fn run(mut self, o: TensorMut<'_>) -> Result<()> {
        let isa = self.isa.unwrap_or_else(arch::selected).require()?;
        let p = self.check(&o)?;
        let lse = self.lse.take().filter(|l| !l.is_empty());
        if (o.layout.is_empty() && lse.is_none()) || p.nq == 0 {
            return Ok(());
        }
        if p.dk == 0 && p.dv == 0 && p.da == 0 {
            // No element of K, V or the hidden layer: every score is the empty sum 0, and `nk`
            // is bounded by no slice, so the logsumexps come in closed form (a keep-mask or
            // bias is read, over its own elements), never from a loop over the keys.
            if let Some(out) = lse {
                self.lse_of_zero_scores(&p, out);
            }
            return Ok(());
        }
        let (a, bt) = self.project(isa, &p)?;
        let sink = Sink::new(o.data, o.layout, lse);
        let tiles = p.nq.div_ceil(tile_rows(isa));
        // Bounded by the rows of the output or lse slice, which are non-empty here.
        let tasks = p.batch.saturating_mul(p.hq).saturating_mul(tiles);
        let fast = Factors::new(isa, &p, &a, &bt, self.weights.w)?;
        let ctx = Ctx {
            p: &p,
            a: &a,
            bt: &bt,
            fast: &fast,
            v: self.v,
            w: self.weights.w,
            mask: &self.mask,
        };
        let task = |scr: &mut Scratch, t: usize| {
            vectorize(isa, Task { ctx: &ctx, sink: &sink, scr, t, tiles });
        };
        if self.par.count() == 1 || tasks == 1 {
            let mut scr = Scratch::new(p.dv)?;
            (0..tasks).for_each(|t| task(&mut scr, t));
            Ok(())
        } else {
            self.par.install(|| {
                (0..tasks).into_par_iter().with_min_len(1).try_for_each_init(
                    || Scratch::new(p.dv),
                    |scr, t| {
                        task(scr.as_mut().map_err(|e| e.clone())?, t);
                        Ok(())
                    },
                )
            })
        }
    }

    /// The logsumexp of every row when every score is 0: `ln` of the visible key count, or
    /// over a keep-mask or bias, `ln Σ_j e^(bias_j)` of its visible keys (rows in the order of
    /// [`lse`](Self::lse)).
    fn lse_of_zero_scores(&self, p: &Sizes, out: &mut [f32]) {
        for (row, l) in out.iter_mut().enumerate() {
            let (bh, i) = (row / p.nq, row % p.nq);
            let (b, h) = (bh / p.hq, bh % p.hq);
            let end = p.key_end(&self.mask, i);
            let logits = (0..end).map(|j| match self.mask {
                Mask::Keep { keep, layout } => keep[layout.index(b, h, i, j)].then_some(0.0),
                Mask::Bias { bias, layout } => Some(f64::from(bias[layout.index(b, h, i, j)])),
                Mask::None | Mask::Causal { .. } => Some(0.0),
            });
            *l = match self.mask {
                Mask::None | Mask::Causal { .. } if end == 0 => f32::NEG_INFINITY,
                Mask::None | Mask::Causal { .. } => (end as f64).ln() as f32,
                _ => super::lse_f64(logits) as f32,
            };
        }
    }

    /// The checks of [`run`](Self::run), returning the sizes.
    fn check(&self, o: &TensorMut<'_>) -> Result<Sizes> {
        let [batch, hq, nq, dq] = self.q.layout.dims;
        let [_, hkv, nk, dk] = self.k.layout.dims;
        let dv = self.v.layout.dims[3];
        let AdditiveWeights { wq, wk, w } = self.weights;
        let da = wq.layout.cols;
        attn_core::attention::check_heads(hq, hkv)?;
        self.k.layout.expect_dims("k", [batch, hkv, nk, dk])?;
        self.v.layout.expect_dims("v", [batch, hkv, nk, dv])?;
        o.layout.expect_dims("o", [batch, hq, nq, dv])?;
        wq.layout.expect_shape("wq", dq, da)?;
        wk.layout.expect_shape("wk", dk, da)?;
        expect_dim("w", "len", da, w.len())?;
        self.q.check("q")?;
        self.k.check("k")?;
        self.v.check("v")?;
        o.check("o")?;
        wq.check("wq")?;
        wk.check("wk")?;
        self.mask.check(batch, hq, nq, nk)?;
        if let Some(l) = self.lse.as_deref() {
            expect_dim("lse", "len", batch.saturating_mul(hq).saturating_mul(nq), l.len())?;
        }
        for (arg, m) in [("wq", wq), ("wk", wk)] {
            for r in 0..m.layout.rows {
                for c in 0..m.layout.cols {
                    expect_finite(arg, m.at(r, c))?;
                }
            }
        }
        for &x in w {
            expect_finite("w", x)?;
        }
        Ok(Sizes { batch, hq, hkv, nq, nk, dq, dk, dv, da, nkp: nk.div_ceil(KEY_PAD) * KEY_PAD })
    }

    /// `A = Q·Wq` per `(batch, query head)` as `[nq, da]` row-major, and `Bᵀ = (K·Wk)ᵀ` per
    /// `(batch, K/V head)` as `[da, nkp]` (padding keys 0), on the SGEMM.
    fn project(&self, isa: Isa, p: &Sizes) -> Result<(Vec<f32>, Vec<f32>)> {
        let qn = [p.batch, p.hq, p.nq, p.da];
        let kn = [p.batch, p.hkv, p.nkp, p.da];
        let mut a = try_zeros(qn.iter().try_fold(1usize, |x, &y| x.checked_mul(y)))?;
        let mut bt = try_zeros(kn.iter().try_fold(1usize, |x, &y| x.checked_mul(y)))?;
        let (w, par) = (self.weights, self.par);
        for b in 0..p.batch {
            // An empty inner dimension leaves the zeros (and the view may have any strides).
            if p.dq > 0 && p.da > 0 {
                for h in 0..p.hq {
                    let at = (b * p.hq + h) * p.nq * p.da;
                    let c = MatMut::row_major(&mut a[at..at + p.nq * p.da], p.nq, p.da);
                    sgemm_with_isa(isa, 1.0, self.q.matrix(b, h), w.wq, 0.0, c, par)?;
                }
            }
            if p.dk > 0 && p.da > 0 && p.nk > 0 {
                for kh in 0..p.hkv {
                    let at = (b * p.hkv + kh) * p.da * p.nkp;
                    let layout = MatLayout::strided(p.nk, p.da, 1, p.nkp, 0);
                    let c = MatMut::new(&mut bt[at..at + p.da * p.nkp], layout);
                    sgemm_with_isa(isa, 1.0, self.k.matrix(b, kh), w.wk, 0.0, c, par)?;
                }
            }
        }
        Ok((a, bt))
    }
}

/// The checked sizes of a problem; `nkp` is `nk` rounded up to [`KEY_PAD`].
struct Sizes {
    batch: usize,
    hq: usize,
    hkv: usize,
    nq: usize,
    nk: usize,
    dq: usize,
    dk: usize,
    dv: usize,
    da: usize,
    nkp: usize,
}

impl Sizes {
    /// Exclusive end of the keys query `i` may see (`nk`, or the causal diagonal).
    fn key_end(&self, mask: &Mask<'_>, i: usize) -> usize {
        match mask {
            Mask::Causal { offset } => {
                let off = Mask::causal_offset(*offset, self.nq, self.nk) as i128;
                (i as i128 + off + 1).clamp(0, self.nk as i128) as usize
            }
            _ => self.nk,
        }
    }
}

/// A zeroed buffer of `n` floats, or `InvalidParameter` when `n` overflowed or cannot be
/// allocated.
fn try_zeros(n: Option<usize>) -> Result<Vec<f32>> {
    let err = Error::InvalidParameter {
        arg: "k",
        requirement: "the sizes imply projections that cannot be allocated",
    };
    let n = n.ok_or(err.clone())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| err)?;
    v.resize(n, 0.0);
    Ok(v)
}

/// What every task reads.
struct Ctx<'r, 'a> {
    p: &'r Sizes,
    /// Query projections, `[batch, hq, nq, da]`.
    a: &'r [f32],
    /// Transposed key projections, `[batch, hkv, da, nkp]`.
    bt: &'r [f32],
    /// The exp path's factors `e^(2a)`, `e^(2b)` and flags (module docs).
    fast: &'r Factors,
    v: TensorRef<'a>,
    w: &'a [f32],
    mask: &'r Mask<'a>,
}

/// Per-thread scratch: one row of scores, the tile's probability block (a packed B
/// micro-panel, hence 64-byte aligned), and the running state of a tile: the accumulator
/// `Oᵀ` (`[dv][QR]`), its copy for a guarded block (see [`pv_block`]), maxima, sums and
/// rescale factors.
struct Scratch {
    s: Vec<f32>,
    p: AlignedBuf,
    o: Vec<f32>,
    save: Vec<f32>,
    m: [f32; MAX_QR],
    l: [f32; MAX_QR],
    alpha: [f32; MAX_QR],
}

impl Scratch {
    fn new(dv: usize) -> Result<Self> {
        let mut p = AlignedBuf::default();
        if !p.try_grow(BLOCK_K * MAX_QR) {
            return Err(Error::InvalidParameter {
                arg: "k",
                requirement: "the scratch buffer cannot be allocated",
            });
        }
        Ok(Scratch {
            s: vec![0.0; BLOCK_K],
            p,
            o: try_zeros(dv.checked_mul(MAX_QR))?,
            save: try_zeros(dv.checked_mul(MAX_QR))?,
            m: [f32::MIN; MAX_QR],
            l: [0.0; MAX_QR],
            alpha: [1.0; MAX_QR],
        })
    }
}

/// One task: query tile `t mod tiles` of head `t / tiles`.
struct Task<'r, 'a> {
    ctx: &'r Ctx<'r, 'a>,
    sink: &'r Sink<'r>,
    scr: &'r mut Scratch,
    t: usize,
    tiles: usize,
}

impl Kernel for Task<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let Task { ctx, sink, scr, t, tiles } = self;
        let p = ctx.p;
        let qr = tile_rows(S::ISA);
        let (bh, i0) = (t / tiles, (t % tiles) * qr);
        let (b, h) = (bh / p.hq, bh % p.hq);
        let kh = h / (p.hq / p.hkv);
        let rows = (p.nq - i0).min(qr);
        let (da, dv, nkp) = (p.da, p.dv, p.nkp);
        let bt = &ctx.bt[(b * p.hkv + kh) * da * nkp..][..da * nkp];
        let ebt = &ctx.fast.ebt[(b * p.hkv + kh) * da * nkp..][..da * nkp];
        // Value row `j` of this head at `offset + j·rs`; the view was checked against its slice.
        let vl = &ctx.v.layout;
        let values = Strided {
            data: ctx.v.data,
            offset: if p.nk > 0 && dv > 0 { vl.index(b, kh, 0, 0) } else { 0 },
            rs: vl.strides[2],
            cs: vl.strides[3],
        };
        scr.m = [f32::MIN; MAX_QR];
        scr.l = [0.0; MAX_QR];
        let o = &mut scr.o[..dv * qr];
        o.fill(0.0);
        let kend_tile = p.key_end(ctx.mask, i0 + rows - 1);
        let mut j0 = 0;
        while j0 < kend_tile {
            let nb_tile = (kend_tile - j0).min(BLOCK_K);
            let pb = scr.p.get(nb_tile * qr);
            // Whether some weight of the block is 0 (masked, past a row's diagonal, a padding
            // row, or underflowed): `pv_block` then guards against `0·∞`.
            let mut guard = rows < qr;
            for r in 0..qr {
                let i = i0 + r;
                let nb = if r < rows {
                    nb_tile.min(p.key_end(ctx.mask, i).saturating_sub(j0))
                } else {
                    0
                };
                scr.alpha[r] = 1.0;
                if nb > 0 {
                    let row = (b * p.hq + h) * p.nq + i;
                    let sc = &mut scr.s[..nb.div_ceil(S::LANES) * S::LANES];
                    let f = ctx.fast;
                    if f.row[row] && f.block[(b * p.hkv + kh) * f.blocks + j0 / BLOCK_K] {
                        let erow = &f.ea[row * da..][..da];
                        scores_exp(s, erow, ctx.w, ebt, nkp, j0, f.wsum, sc);
                    } else {
                        let arow = &ctx.a[row * da..][..da];
                        scores(s, arow, ctx.w, bt, nkp, j0, sc);
                    }
                    let sc = &mut sc[..nb];
                    mask_row(ctx, b, h, i, j0, sc);
                    scr.alpha[r] = online_step(s, sc, &mut scr.m[r], &mut scr.l[r]);
                    for (j, &pj) in sc.iter().enumerate() {
                        pb[j * qr + r] = pj;
                        guard |= pj == 0.0;
                    }
                }
                for j in nb..nb_tile {
                    pb[j * qr + r] = 0.0;
                }
                guard |= nb < nb_tile;
            }
            let o = &mut scr.o[..dv * qr];
            pv_block(s, guard, pb, nb_tile, values, j0, dv, &scr.alpha, o, &mut scr.save);
            j0 += nb_tile;
        }
        let o = &scr.o[..dv * qr];
        for r in 0..rows {
            let (l, m) = (scr.l[r], scr.m[r]);
            let (inv, lse) = finish_plain(m, l, sink.has_lse());
            sink.write_row(s, b, h, i0 + r, lse, |d| o[d * qr + r] * inv);
        }
    }
}

/// Scores of one query against the keys `j0..j0 + out.len()` (a multiple of `LANES`, keys past
/// `nk` read the zero padding): `out_j = Σ_a w_a·tanh(arow_a + bt[a·nkp + j0 + j])`.
#[inline(always)]
fn scores<S: Simd>(
    s: S,
    arow: &[f32],
    w: &[f32],
    bt: &[f32],
    nkp: usize,
    j0: usize,
    out: &mut [f32],
) {
    for (jv, chunk) in out.chunks_exact_mut(S::LANES).enumerate() {
        let col = j0 + jv * S::LANES;
        let mut acc = s.splat(0.0);
        for (a, (&x, &wa)) in arow.iter().zip(w).enumerate() {
            let pre = s.add(s.splat(x), load(s, &bt[a * nkp + col..]));
            acc = s.fma(s.splat(wa), tanh_rational_simd(s, pre), acc);
        }
        store(s, chunk, acc);
    }
}

/// [`scores`] by the exp path: `out_j = W − 2·Σ_a w_a / (ea_a·ebt[a·nkp + j0 + j] + 1)` with
/// `W = Σ_a w_a` (module docs), four vectors of keys at a time (four independent sums).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores_exp<S: Simd>(
    s: S,
    erow: &[f32],
    w: &[f32],
    ebt: &[f32],
    nkp: usize,
    j0: usize,
    wsum: f32,
    out: &mut [f32],
) {
    const NV: usize = 4;
    let (one, m2, ws) = (s.splat(1.0), s.splat(-2.0), s.splat(wsum));
    let mut col = j0;
    let mut quads = out.chunks_exact_mut(NV * S::LANES);
    for quad in &mut quads {
        let mut acc = [s.splat(0.0); NV];
        for (a, (&ea, &wa)) in erow.iter().zip(w).enumerate() {
            let (e, wv) = (s.splat(ea), s.splat(wa));
            let row = &ebt[a * nkp + col..][..NV * S::LANES];
            for (u, acc) in acc.iter_mut().enumerate() {
                let d = s.fma(e, load(s, &row[u * S::LANES..]), one);
                *acc = s.fma(wv, s.recip(d), *acc);
            }
        }
        for (u, acc) in acc.into_iter().enumerate() {
            store(s, &mut quad[u * S::LANES..], s.fma(m2, acc, ws));
        }
        col += NV * S::LANES;
    }
    for chunk in quads.into_remainder().chunks_exact_mut(S::LANES) {
        let mut acc = s.splat(0.0);
        for (a, (&ea, &wa)) in erow.iter().zip(w).enumerate() {
            let d = s.fma(s.splat(ea), load(s, &ebt[a * nkp + col..]), one);
            acc = s.fma(s.splat(wa), s.recip(d), acc);
        }
        store(s, chunk, s.fma(m2, acc, ws));
        col += S::LANES;
    }
}

/// Largest `|a|`, `|b|` of the exp path: `e^(2(a + b))` and `e^(2(a + b)) + 1` then lie within
/// `e^(±80)`, normal f32 whose reciprocals are normal too (within [`Simd::recip`]'s range).
const FAST_MAX: f32 = 20.0;

/// The exp path's data (module docs): `e^(2a)` beside `A`, `e^(2b)` beside `Bᵀ`, which rows
/// of `A` and which blocks of [`BLOCK_K`] keys of `Bᵀ` lie within `±FAST_MAX` (NaN does not),
/// and `W = Σ w_a` (rounded once from f64).
struct Factors {
    ea: Vec<f32>,
    ebt: Vec<f32>,
    row: Vec<bool>,
    block: Vec<bool>,
    /// Key blocks per K/V head.
    blocks: usize,
    wsum: f32,
}

impl Factors {
    fn new(isa: Isa, p: &Sizes, a: &[f32], bt: &[f32], w: &[f32]) -> Result<Factors> {
        // e^(2x) by the full-range exp of the slice entry point (doubling is exact).
        let exp_twice = |x: &[f32]| -> Result<Vec<f32>> {
            let (mut two, mut y) = (try_zeros(Some(x.len()))?, try_zeros(Some(x.len()))?);
            for (t, &x) in two.iter_mut().zip(x) {
                *t = x + x;
            }
            exp_slice_with_isa(isa, &two, &mut y)?;
            Ok(y)
        };
        let (ea, ebt) = (exp_twice(a)?, exp_twice(bt)?);
        let within = |x: &f32| x.abs() <= FAST_MAX;
        let row = if p.da == 0 {
            vec![true; p.batch * p.hq * p.nq]
        } else {
            a.chunks_exact(p.da).map(|r| r.iter().all(within)).collect()
        };
        let blocks = p.nkp.div_ceil(BLOCK_K);
        let mut block = vec![true; p.batch * p.hkv * blocks];
        let head = (p.da * p.nkp).max(1);
        for (bh, head) in bt.chunks_exact(head).enumerate() {
            for hidden in head.chunks_exact(p.nkp) {
                for (k, keys) in hidden.chunks(BLOCK_K).enumerate() {
                    block[bh * blocks + k] &= keys.iter().all(within);
                }
            }
        }
        let wsum = w.iter().map(|&x| f64::from(x)).sum::<f64>() as f32;
        Ok(Factors { ea, ebt, row, block, blocks, wsum })
    }
}

/// Applies the mask to the scores of query `i` against keys `j0..`: masked → −∞ (dropping any
/// NaN there), a bias added.
fn mask_row(ctx: &Ctx<'_, '_>, b: usize, h: usize, i: usize, j0: usize, sc: &mut [f32]) {
    let p = ctx.p;
    match ctx.mask {
        Mask::None => {}
        m => {
            for (j, x) in sc.iter_mut().enumerate() {
                match m.term(b, h, i, j0 + j, p.nq, p.nk) {
                    None => *x = f32::NEG_INFINITY,
                    Some(t) => *x += t,
                }
            }
        }
    }
}

/// One online-softmax step of one query row over the masked scores `sc` of a key block, in
/// place: `m' = max(m, max_j S_j)`, `P_j = e^(S_j − m')`, `l ← α·l + Σ P_j`, `m ← m'`; returns
/// `α = e^(m − m')` for the caller's `o ← α·o + Σ_j P_j·V_j`. A `+∞` maximum gives its `+∞`
/// keys weight 1 and the rest 0 (`α = 0`, or 1 when the maximum was already `+∞`); a NaN score
/// makes `l` NaN.
#[inline(always)]
fn online_step<S: Simd>(s: S, sc: &mut [f32], m: &mut f32, l: &mut f32) -> f32 {
    let m_old = *m;
    // NaN scores are skipped by the maximum (and make `l` NaN below).
    let mut chunks = sc.chunks_exact(S::LANES);
    let mut mv = s.splat(m_old);
    for c in &mut chunks {
        mv = s.max_skip_nan(mv, load(s, c));
    }
    let m_new = chunks.remainder().iter().fold(s.reduce_max(mv), |a, &x| if x > a { x } else { a });
    let alpha = if m_new == f32::INFINITY {
        for x in sc.iter_mut() {
            *x = if *x == f32::INFINITY {
                1.0
            } else if x.is_nan() {
                f32::NAN
            } else {
                0.0
            };
        }
        if m_old == f32::INFINITY {
            1.0
        } else {
            0.0
        }
    } else {
        let mut chunks = sc.chunks_exact_mut(S::LANES);
        for c in &mut chunks {
            store(s, c, exp_rr2_p7(s, s.sub(load(s, c), s.splat(m_new))));
        }
        for x in chunks.into_remainder() {
            *x = exp_rr2_p7_scalar(s, *x - m_new);
        }
        exp_rr2_p7_scalar(s, m_old - m_new)
    };
    *m = m_new;
    let mut chunks = sc.chunks_exact(S::LANES);
    let mut sum = s.splat(0.0);
    for c in &mut chunks {
        sum = s.add(sum, load(s, c));
    }
    *l = alpha * *l + (s.reduce_add(sum) + chunks.remainder().iter().sum::<f32>());
    alpha
}
