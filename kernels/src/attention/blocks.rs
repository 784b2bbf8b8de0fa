//! The vector building blocks of the attention kernels, written once over the one vector
//! trait ([`Simd`]): the two block products of the flash loop, which run on the GEMM
//! micro-kernels, the decode tiles, and the row helpers of the decode and unfused paths. The
//! attention module's `unsafe` that touches raw pointers lives here, behind safe wrappers that
//! check the bounds of each block once before entering the hot loops.
//!
//! The block products are computed **transposed**, so that queries run along the vector
//! lanes: `Sᵀ = K·Q̃ᵀ` and `Oᵀ += Vᵀ·P̃ᵀ`. In GEMM terms the query tile (`NR` queries: the
//! micro-kernel's vector width) is the packed B micro-panel of the first product and the
//! probability block is the packed B micro-panel of the second, while K and V are the
//! broadcast (A) operand, which the micro-kernels read in place through their strides. So:
//! - the only packing is the query tile, once per task, and the probability block, which the
//!   softmax step writes directly in the packed layout;
//! - K and V are never copied or transposed: any strides, GQA sharing and both tensor layouts
//!   come for free. A broadcast operand gains nothing from being contiguous (it is read one
//!   element at a time either way), and packing it costs about two instructions per element
//!   against the strided kernel's integer address arithmetic, which runs beside the FMAs on
//!   the otherwise idle integer ports (measured slower: `docs/perf-journal.md`);
//! - the online softmax needs no horizontal reductions: the running max, sum and rescale
//!   factors of `QR` queries are `QV` vectors.

use super::blocking::QV;
use crate::arch::{load, prefetch_l1, store, Isa, Simd};
use crate::gemm::ukernel::{kernel_for, macro_kernel, ABlock, Kernel as GemmKernel};
use crate::math::exp::exp_rr2_p7;

// ---------------------------------------------------------------------------------------------
// Flash block products on the GEMM micro-kernels

/// A strided matrix operand of the block products: element `(row, col)` of `data` at
/// `offset + row·rs + col·cs`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strided<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Index of element (0, 0).
    pub offset: usize,
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

impl Strided<'_> {
    /// True when rows `r0..r0 + nr` and columns `0..nc` are inside `data` (no overflow).
    fn covers(&self, r0: usize, nr: usize, nc: usize) -> bool {
        if nr == 0 || nc == 0 {
            return true;
        }
        let last = (r0 + nr - 1)
            .checked_mul(self.rs)
            .and_then(|x| x.checked_add((nc - 1).checked_mul(self.cs)?))
            .and_then(|x| x.checked_add(self.offset));
        matches!(last, Some(i) if i < self.data.len())
    }
}

/// The GEMM micro-kernel of the ISA `S` (see [`crate::gemm`]'s `ukernel` module): the flash
/// block products run on it. Its register tile is `MR` rows by `NR = QV·LANES` columns, and
/// the columns are the query tile.
#[inline(always)]
fn gemm_kernel<S: Simd>() -> &'static GemmKernel {
    let kern = kernel_for(S::ISA);
    debug_assert_eq!(kern.nr, QV * S::LANES, "query tile must be the micro-kernel's NR");
    kern
}

/// Query rows per flash tile for `isa`: the column width `NR` of its GEMM micro-kernel.
pub(crate) fn tile_rows(isa: Isa) -> usize {
    kernel_for(isa).nr
}

/// `s[j·QR + r] = Σ_d qp[d·QR + r] · k(j0 + j, d)` for `j < nb`: the scores of one query tile
/// against keys `j0..j0 + nb`, i.e. the block `Sᵀ = K·Q̃ᵀ` on the GEMM macro-kernel: K is the
/// broadcast operand, read in place through its strides, and `qp` (`dk` rows of `QR`
/// pre-scaled queries, 64-byte aligned) is exactly one packed B micro-panel. Panics (never UB)
/// if a buffer is too small, which the callers' sizing rules out. With `dk = 0` the scores are
/// 0 and no key pointer is formed (the K view is empty, so its row stride may be anything,
/// e.g. so large that `j·rs` overflows).
#[inline(always)]
pub(crate) fn qk_block<S: Simd>(
    _s: S,
    qp: &[f32],
    dk: usize,
    k: Strided<'_>,
    j0: usize,
    nb: usize,
    out: &mut [f32],
) {
    let kern = gemm_kernel::<S>();
    let qr = kern.nr;
    assert!(qp.len() >= dk * qr && out.len() >= nb * qr && k.covers(j0, nb, dk));
    if dk == 0 || nb == 0 {
        out[..nb * qr].fill(0.0);
        return;
    }
    // SAFETY: `kern` is the kernel of S's ISA, which the token proves supported. Checked above:
    // K rows j0..j0+nb × dk columns through the strides (A, `nb × dk`), the one packed panel of
    // `dk·QR` floats (B), and the `nb × QR` output tile (C, row stride QR, unit column stride),
    // which nothing else touches during the call.
    unsafe {
        let a =
            ABlock::Strided { ptr: k.data.as_ptr().add(k.offset + j0 * k.rs), rs: k.rs, cs: k.cs };
        macro_kernel(kern, nb, qr, dk, 1.0, a, qp.as_ptr(), 0.0, out.as_mut_ptr(), qr, 1);
    }
}

/// `o[c·QR + r] = alpha[r]·o[c·QR + r] + Σ_j p[j·QR + r] · v(j0 + j, c)` for all `dv` columns:
/// one query tile's output accumulator (`Oᵀ`, `[column][QR]`) rescaled by the online-softmax
/// correction and updated with one block of `nb` value rows, i.e. `Oᵀ += Vᵀ·P̃ᵀ` on the GEMM
/// macro-kernel: V is the broadcast operand, read in place (`Vᵀ` is V with its strides
/// swapped), and the probability block `p` (`nb` rows of `QR`, 64-byte aligned, as
/// [`qk_block`] laid out the scores) is exactly one packed B micro-panel.
///
/// Zero weights contribute exactly nothing, as in the reference, which skips them:
/// - a lane whose `alpha` is 0 has its accumulator cleared rather than multiplied, so an
///   earlier `∞` cannot become NaN;
/// - `guard` must be set when some `p` may be 0 (masked or underflowed weights). The block then
///   runs on the micro-kernel as usual, and only if that leaves a non-finite accumulator (a
///   `±∞`/NaN value at a zero-weight key gives `0·∞ = NaN`) is it redone from `save` with a
///   loop that skips zero weights. `save` (`dv·QR` floats) holds the rescaled accumulator
///   meanwhile.
///
/// Panics (never UB) if a buffer is too small, which the callers' sizing rules out.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pv_block<S: Simd>(
    s: S,
    guard: bool,
    p: &[f32],
    nb: usize,
    v: Strided<'_>,
    j0: usize,
    dv: usize,
    alpha: &[f32],
    o: &mut [f32],
    save: &mut [f32],
) {
    let kern = gemm_kernel::<S>();
    let (l, qr) = (S::LANES, kern.nr);
    assert!(p.len() >= nb * qr && alpha.len() >= qr && v.covers(j0, nb, dv));
    let (o, save) = (&mut o[..dv * qr], &mut save[..dv * qr]);
    let al: [S::V; QV] = core::array::from_fn(|vv| load(s, &alpha[vv * l..]));
    let live = al.map(|a| s.nonzero(a));
    for col in o.chunks_exact_mut(qr) {
        for vv in 0..QV {
            let x = &mut col[vv * l..];
            store(s, x, s.zero_unless(live[vv], s.mul(al[vv], load(s, x))));
        }
    }
    if dv == 0 || nb == 0 {
        return;
    }
    if guard {
        save.copy_from_slice(o);
    }
    // SAFETY: `kern` is the kernel of S's ISA, which the token proves supported. Checked above:
    // V rows j0..j0+nb × dv columns through the strides (A = Vᵀ, `dv × nb`), the one packed
    // panel of `nb·QR` floats (B), and the `dv × QR` accumulator (C), which nothing else
    // touches during the call.
    unsafe {
        let a =
            ABlock::Strided { ptr: v.data.as_ptr().add(v.offset + j0 * v.rs), rs: v.cs, cs: v.rs };
        macro_kernel(kern, dv, qr, nb, 1.0, a, p.as_ptr(), 1.0, o.as_mut_ptr(), qr, 1);
    }
    if guard && o.iter().any(|x| !x.is_finite()) {
        o.copy_from_slice(save);
        for j in 0..nb {
            let vrow = v.offset + (j0 + j) * v.rs;
            for (r, &w) in p[j * qr..(j + 1) * qr].iter().enumerate() {
                if w != 0.0 {
                    for c in 0..dv {
                        o[c * qr + r] = w.mul_add(v.data[vrow + c * v.cs], o[c * qr + r]);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Slice helpers for the decode and unfused paths (vectors along the head dimension)

/// `y ← alpha·x + y` over `min(x.len(), y.len())` elements.
#[inline(always)]
pub(crate) fn axpy<S: Simd>(s: S, alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let l = S::LANES;
    let va = s.splat(alpha);
    let mut i = 0;
    while i + l <= n {
        let r = s.fma(va, load(s, &x[i..]), load(s, &y[i..]));
        store(s, &mut y[i..], r);
        i += l;
    }
    for j in i..n {
        y[j] = alpha.mul_add(x[j], y[j]);
    }
}

/// `x_j ← e^(x_j − m)` in place; returns `Σ_j e^(x_j − m)` (f32). `m` is the row's running
/// maximum (never below `f32::MIN`), so `−∞` scores give exactly 0.
#[inline(always)]
pub(crate) fn exp_row<S: Simd>(s: S, x: &mut [f32], m: f32) -> f32 {
    let l = S::LANES;
    let vm = s.splat(m);
    let mut sum = s.splat(0.0);
    let mut i = 0;
    while i + l <= x.len() {
        let p = exp_rr2_p7(s, s.sub(load(s, &x[i..]), vm));
        store(s, &mut x[i..], p);
        sum = s.add(sum, p);
        i += l;
    }
    let mut total = s.reduce_add(sum);
    if i < x.len() {
        let mut tail = [f32::NEG_INFINITY; 16];
        let n = x.len() - i;
        tail[..n].copy_from_slice(&x[i..]);
        let mut buf = [0.0f32; 16];
        for (c, chunk) in tail.chunks_exact(l).enumerate() {
            let p = exp_rr2_p7(s, s.sub(load(s, chunk), vm));
            store(s, &mut buf[c * l..], p);
        }
        x[i..].copy_from_slice(&buf[..n]);
        total += buf[..n].iter().sum::<f32>();
    }
    total
}

/// The weights `e^(x_j − m)` of `n` scores `x[lane + j·stride]` whose maximum `m` is `+∞` (a
/// score that overflowed f32, or a `+∞` bias), in place: the `+∞` scores share the weight, so
/// each gets 1 (not `e^(∞ − ∞) = NaN`), every finite or `−∞` score 0, and a NaN stays NaN.
/// Returns their sum, the number of `+∞` scores (NaN if a score is NaN). Off the hot path: only
/// rows that reach `+∞` come here.
#[cold]
pub(crate) fn pos_inf_weights(x: &mut [f32], n: usize, stride: usize, lane: usize) -> f32 {
    let mut sum = 0.0f32;
    for j in 0..n {
        let e = &mut x[lane + j * stride];
        *e = if *e == f32::INFINITY {
            1.0
        } else if e.is_nan() {
            f32::NAN
        } else {
            0.0
        };
        sum += *e;
    }
    sum
}

// ---------------------------------------------------------------------------------------------
// Decode micro-kernels (vectors along the head dimension, several rows and keys per tile)
//
// The decode path has few rows (the queries of one GQA group) and streams every key and value
// row once. Its tiles keep `R` rows by `C` keys (or `CT` value vectors) of accumulators in
// registers, so each key/value vector loaded feeds `R` FMAs and each query vector `C`; the
// scores of four (row, key) pairs are finished by one transposed reduction
// ([`Simd::reduce_add4`]) instead of a horizontal sum each.

/// Decode score tile: `out[r·os + c] = Σ_d q[r·dk + d] · k[c·k_rs + d]` for `r < R`, `c < C`,
/// `d < dk`: vectors along `d`, one accumulator per (row, key), a scalar tail for
/// `dk mod LANES`.
///
/// # Safety
/// `q` readable for `R·dk` floats; `k` readable at `c·k_rs + d` for `c < C`, `d < dk`; `out`
/// writable at `r·os + c` for `r < R`, `c < C`.
#[inline(always)]
unsafe fn dec_qk_tile<S: Simd, const R: usize, const C: usize>(
    s: S,
    dk: usize,
    q: *const f32,
    k: *const f32,
    k_rs: usize,
    out: *mut f32,
    os: usize,
) {
    debug_assert!(R >= 1 && C >= 1);
    let l = S::LANES;
    let nv = dk / l;
    let mut acc = [[s.splat(0.0); C]; R];
    for i in 0..nv {
        let d = i * l;
        // SAFETY: d + LANES ≤ dk: inside the C key rows and R query rows.
        unsafe {
            let mut kv = [s.splat(0.0); C];
            for (c, x) in kv.iter_mut().enumerate() {
                *x = s.load(k.add(c * k_rs + d));
            }
            for (r, ar) in acc.iter_mut().enumerate() {
                let qv = s.load(q.add(r * dk + d));
                for (a, x) in ar.iter_mut().zip(&kv) {
                    *a = s.fma(qv, *x, *a);
                }
            }
        }
    }
    // Transposed reduction of the R·C accumulators, four at a time (zero-padded).
    let mut sums = [[0.0f32; C]; R];
    let n = R * C;
    let mut f = 0;
    while f < n {
        let mut quad = [s.splat(0.0); 4];
        for (g, x) in quad.iter_mut().enumerate() {
            if f + g < n {
                *x = acc[(f + g) / C][(f + g) % C];
            }
        }
        let r4 = s.reduce_add4(quad);
        for (g, x) in r4.iter().enumerate() {
            if f + g < n {
                sums[(f + g) / C][(f + g) % C] = *x;
            }
        }
        f += 4;
    }
    for (r, sr) in sums.iter_mut().enumerate() {
        for (c, x) in sr.iter_mut().enumerate() {
            // SAFETY: d < dk inside the rows; (r, c) inside the output tile.
            unsafe {
                for d in nv * l..dk {
                    *x = (*q.add(r * dk + d)).mul_add(*k.add(c * k_rs + d), *x);
                }
                *out.add(r * os + c) = *x;
            }
        }
    }
}

/// Decode P·V tile: `o[r·o_rs + c·LANES + e] += Σ_j p[r·ps + j] · v[j·v_rs + c·LANES + e]` for
/// `r < R`, `c < CT`, `e < LANES`, `j < nb`. With `GUARD` a zero weight contributes exactly
/// nothing even when the value is `±∞`/NaN (a masked key over an unwritten cache slot);
/// without it (no zero weight in the block) the loop is the plain FMA chain.
///
/// # Safety
/// `p` readable at `r·ps + j`; `v` readable at `j·v_rs + c·LANES + e`; `o` readable and
/// writable at `r·o_rs + c·LANES + e` (all for the ranges above).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dec_pv_tile<S: Simd, const R: usize, const CT: usize, const GUARD: bool>(
    s: S,
    nb: usize,
    p: *const f32,
    ps: usize,
    v: *const f32,
    v_rs: usize,
    o: *mut f32,
    o_rs: usize,
) {
    let l = S::LANES;
    let mut acc = [[s.splat(0.0); CT]; R];
    // SAFETY: inside the R × CT·LANES output tile.
    unsafe {
        for (r, ar) in acc.iter_mut().enumerate() {
            for (c, a) in ar.iter_mut().enumerate() {
                *a = s.load(o.add(r * o_rs + c * l));
            }
        }
    }
    for j in 0..nb {
        // SAFETY: j < nb: the value vectors and the R weights are in bounds.
        unsafe {
            let mut vv = [s.splat(0.0); CT];
            for (c, x) in vv.iter_mut().enumerate() {
                *x = s.load(v.add(j * v_rs + c * l));
            }
            for (r, ar) in acc.iter_mut().enumerate() {
                let w = s.splat(*p.add(r * ps + j));
                if GUARD {
                    let m = s.nonzero(w);
                    for (a, x) in ar.iter_mut().zip(&vv) {
                        *a = s.fma_where(m, w, *x, *a);
                    }
                } else {
                    for (a, x) in ar.iter_mut().zip(&vv) {
                        *a = s.fma(w, *x, *a);
                    }
                }
            }
        }
    }
    // SAFETY: inside the output tile.
    unsafe {
        for (r, ar) in acc.iter().enumerate() {
            for (c, a) in ar.iter().enumerate() {
                s.store(o.add(r * o_rs + c * l), *a);
            }
        }
    }
}

/// All keys of one row tile of [`decode_qk_block`]: tiles of `C` keys, then single keys.
/// Ahead of each tile it prefetches the key rows [`DECODE_PREFETCH_KEYS`] further on and, when
/// `pv` is not null, the value rows `pv + j·pv_rs` (`dv` floats each) of the same keys, which
/// the P·V pass of the block reads next.
///
/// [`DECODE_PREFETCH_KEYS`]: super::blocking::DECODE_PREFETCH_KEYS
///
/// # Safety
/// As [`dec_qk_tile`] for every key `j < nb` (`k` at `j·k_rs + d`, `out` at `r·os + j`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dec_qk_rows<S: Simd, const R: usize, const C: usize>(
    s: S,
    dk: usize,
    q: *const f32,
    k: *const f32,
    k_rs: usize,
    nb: usize,
    out: *mut f32,
    os: usize,
    pv: *const f32,
    pv_rs: usize,
    dv: usize,
) {
    use super::blocking::DECODE_PREFETCH_KEYS as PF;
    let mut j = 0;
    // SAFETY: every tile stays inside keys 0..nb, which the caller vouched for; the prefetched
    // addresses are only hints (formed with wrapping arithmetic, never dereferenced).
    unsafe {
        while j + C <= nb {
            for c in 0..C {
                prefetch_row(k.wrapping_add((j + PF + c).wrapping_mul(k_rs)), dk);
                if !pv.is_null() {
                    prefetch_row(pv.wrapping_add((j + c).wrapping_mul(pv_rs)), dv);
                }
            }
            dec_qk_tile::<S, R, C>(s, dk, q, k.add(j * k_rs), k_rs, out.add(j), os);
            j += C;
        }
        while j < nb {
            dec_qk_tile::<S, R, 1>(s, dk, q, k.add(j * k_rs), k_rs, out.add(j), os);
            j += 1;
        }
    }
}

/// `GUARD` argument of [`dec_pv_rows`]: zero weights are skipped lane by lane.
const GUARDED: bool = true;
/// `GUARD` argument of [`dec_pv_rows`]: plain FMA loop (no zero weight in the block).
const PLAIN: bool = false;

/// All value columns of one row tile of [`decode_pv_block`]: tiles of `CT` vectors, single
/// vectors, then the `dv mod LANES` scalar columns.
///
/// # Safety
/// As [`dec_pv_tile`] for every column `< dv` (`v` at `j·v_rs + col`, `o` at `r·o_rs + col`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dec_pv_rows<S: Simd, const R: usize, const CT: usize, const GUARD: bool>(
    s: S,
    dv: usize,
    nb: usize,
    p: *const f32,
    ps: usize,
    v: *const f32,
    v_rs: usize,
    o: *mut f32,
    o_rs: usize,
) {
    let l = S::LANES;
    let mut c = 0;
    // SAFETY: every tile stays inside columns 0..dv, which the caller vouched for.
    unsafe {
        while c + CT * l <= dv {
            dec_pv_tile::<S, R, CT, GUARD>(s, nb, p, ps, v.add(c), v_rs, o.add(c), o_rs);
            c += CT * l;
        }
        while c + l <= dv {
            dec_pv_tile::<S, R, 1, GUARD>(s, nb, p, ps, v.add(c), v_rs, o.add(c), o_rs);
            c += l;
        }
        for col in c..dv {
            for r in 0..R {
                let mut x = *o.add(r * o_rs + col);
                for j in 0..nb {
                    let w = *p.add(r * ps + j);
                    // A zero weight is skipped, whatever the value (see dec_pv_tile).
                    if w != 0.0 {
                        x = w.mul_add(*v.add(j * v_rs + col), x);
                    }
                }
                *o.add(r * o_rs + col) = x;
            }
        }
    }
}

/// Decode scores of one key block: `out[r·os + j] = Σ_d q[r·dk + d] · k(j0 + j, d)` for
/// `r < rows`, `j < nb`, where `q` holds `rows` pre-scaled query rows of `dk` floats and `k`
/// has contiguous columns (`cs = 1`; gather otherwise). `prefetch_v = Some((v, vj0, dv))`
/// also prefetches value rows `vj0..vj0 + nb` of `v` (contiguous, `dv` columns) while the
/// scores are computed, so the P·V pass that follows finds them in cache. Rows go in tiles of up to four, keys in
/// tiles of [`DECODE_QK_KEYS`]`[R − 1]`. Panics (never UB) if a buffer is too small or
/// `k.cs ≠ 1`, which the caller rules out. With `dk = 0` the scores are 0 and no key pointer is
/// formed.
///
/// [`DECODE_QK_KEYS`]: super::blocking::DECODE_QK_KEYS
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_qk_block<S: Simd>(
    s: S,
    q: &[f32],
    rows: usize,
    dk: usize,
    k: Strided<'_>,
    j0: usize,
    nb: usize,
    out: &mut [f32],
    os: usize,
    prefetch_v: Option<(Strided<'_>, usize, usize)>,
) {
    use super::blocking::DECODE_QK_KEYS as W;
    if rows == 0 || nb == 0 {
        return;
    }
    assert!(os >= nb && out.len() >= (rows - 1) * os + nb && q.len() >= rows * dk);
    if dk == 0 {
        for r in 0..rows {
            out[r * os..r * os + nb].fill(0.0);
        }
        return;
    }
    assert!((k.cs == 1 || dk == 1) && k.covers(j0, nb, dk));
    let mut r0 = 0;
    while r0 < rows {
        let rt = (rows - r0).min(4);
        // SAFETY: checked above: rows r0..r0+rt of q and out, keys j0..j0+nb of k (dk
        // contiguous columns each).
        unsafe {
            let (qp, kp) = (q.as_ptr().add(r0 * dk), k.data.as_ptr().add(k.offset + j0 * k.rs));
            let op = out.as_mut_ptr().add(r0 * os);
            // The value rows are prefetched once, with the first row tile.
            let (vp, v_rs, dv) = match prefetch_v {
                Some((v, vj0, dv)) if r0 == 0 => (
                    v.data.as_ptr().wrapping_add(v.offset.wrapping_add(vj0.wrapping_mul(v.rs))),
                    v.rs,
                    dv,
                ),
                _ => (std::ptr::null(), 0, 0),
            };
            match rt {
                1 => dec_qk_rows::<S, 1, { W[0] }>(s, dk, qp, kp, k.rs, nb, op, os, vp, v_rs, dv),
                2 => dec_qk_rows::<S, 2, { W[1] }>(s, dk, qp, kp, k.rs, nb, op, os, vp, v_rs, dv),
                3 => dec_qk_rows::<S, 3, { W[2] }>(s, dk, qp, kp, k.rs, nb, op, os, vp, v_rs, dv),
                _ => dec_qk_rows::<S, 4, { W[3] }>(s, dk, qp, kp, k.rs, nb, op, os, vp, v_rs, dv),
            }
        }
        r0 += rt;
    }
}

/// Decode P·V of one value block: `o[r·dv + c] += Σ_j p[r·ps + j] · v(j0 + j, c)` for
/// `r < rows`, `c < dv`, `j < nb`; `v` has contiguous columns (`cs = 1`; gather otherwise).
/// `guard` must be set when some weight of the block may be 0: those then contribute exactly
/// 0 whatever the value (see [`dec_pv_tile`]). Rows go in tiles of up to four, columns in tiles
/// of [`DECODE_PV_VECS`]`[R − 1]` vectors. Panics (never UB) if a buffer is too small or
/// `v.cs ≠ 1`.
///
/// [`DECODE_PV_VECS`]: super::blocking::DECODE_PV_VECS
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_pv_block<S: Simd>(
    s: S,
    guard: bool,
    p: &[f32],
    ps: usize,
    rows: usize,
    nb: usize,
    v: Strided<'_>,
    j0: usize,
    dv: usize,
    o: &mut [f32],
) {
    use super::blocking::DECODE_PV_VECS as W;
    if rows == 0 || nb == 0 || dv == 0 {
        return;
    }
    assert!(ps >= nb && p.len() >= (rows - 1) * ps + nb && o.len() >= rows * dv);
    assert!((v.cs == 1 || dv == 1) && v.covers(j0, nb, dv));
    let mut r0 = 0;
    while r0 < rows {
        let rt = (rows - r0).min(4);
        // SAFETY: checked above: rows r0..r0+rt of p and o, value rows j0..j0+nb (dv
        // contiguous columns each).
        unsafe {
            let (pp, vp) = (p.as_ptr().add(r0 * ps), v.data.as_ptr().add(v.offset + j0 * v.rs));
            let op = o.as_mut_ptr().add(r0 * dv);
            macro_rules! rows {
                ($r:literal, $g:expr) => {
                    if $g {
                        dec_pv_rows::<S, $r, { W[$r - 1] }, GUARDED>(
                            s, dv, nb, pp, ps, vp, v.rs, op, dv,
                        )
                    } else {
                        dec_pv_rows::<S, $r, { W[$r - 1] }, PLAIN>(
                            s, dv, nb, pp, ps, vp, v.rs, op, dv,
                        )
                    }
                };
            }
            match rt {
                1 => rows!(1, guard),
                2 => rows!(2, guard),
                3 => rows!(3, guard),
                _ => rows!(4, guard),
            }
        }
        r0 += rt;
    }
}

/// Prefetches the cache lines of one row of `n` floats starting at `row`.
#[inline(always)]
fn prefetch_row(row: *const f32, n: usize) {
    let mut d = 0;
    while d < n {
        prefetch_l1(row.wrapping_add(d));
        d += LINE_FLOATS;
    }
}

/// Floats per 64-byte cache line (the prefetch stride).
const LINE_FLOATS: usize = 16;

/// `max(init, max_j x_j)` with NaN entries ignored (as `if x > m { m = x }` does), vectorised:
/// the decode path's per-block row maximum. `init` must not be NaN.
#[inline(always)]
pub(crate) fn row_max<S: Simd>(s: S, x: &[f32], init: f32) -> f32 {
    let l = S::LANES;
    let mut acc = s.splat(init);
    let mut i = 0;
    while i + l <= x.len() {
        // max(x, acc) keeps acc where x is NaN (see Simd::max), so the lanes never become NaN.
        acc = s.max(load(s, &x[i..]), acc);
        i += l;
    }
    let mut lanes = [init; 16];
    store(s, &mut lanes, acc);
    lanes[..l].iter().chain(&x[i..]).fold(init, |m, &v| if v > m { v } else { m })
}
