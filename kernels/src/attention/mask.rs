//! The masks given as data ([`Mask::Keep`](attn_core::Mask::Keep),
//! [`Mask::Bias`](attn_core::Mask::Bias)) applied to a block of scores, one walk for both.
//!
//! A block holds `s[j·stride + r]`, the score of query `i0 + r` and key `j0 + j`, so queries
//! run along the vector lanes (the flash layout; decode and the unfused path pass one row).
//! The mask's element of that score is `m[a0 + r·s2 + j·s3]`. Three cases:
//! - a mask that does not vary with the query (`s2 = 0`, a key-padding mask) is one value per
//!   key, applied to the key's row of scores;
//! - a mask over every pair with its keys contiguous (`s3 = 1`, a `[.., nq, nk]` tensor) goes
//!   `LANES × LANES` at a time through a register transpose, so that its values, too, run
//!   along the queries: read element by element (one strided read per score), a full bias
//!   cost a d 64 flash call 1.6–1.7× its unmasked time and a keep-mask 1.47× (1.30× and
//!   1.25× by blocks; perf journal, 2026-12-07 10:48);
//! - anything else, and the edges of the blocks, element by element.
//!
//! Each score takes the same one operation in every case, so the result is bitwise the same.

use crate::arch::{keep, load, store, transpose, Simd, MAX_LANES};

/// The elements of a keep-mask or a bias as the walk reads them: as f32 values `m` that a
/// score `x` takes by [`MaskElems::apply1`] (a bias is added; a keep-mask element is 0 or −∞
/// and a −∞ overwrites the score, NaN included, as the reference drops a hidden key).
pub(super) trait MaskElems: Copy {
    /// Element `at` as f32.
    fn value(self, at: usize) -> f32;
    /// The `LANES × LANES` block whose row `r` holds the `LANES` elements from `at + r·ss`,
    /// transposed into `t` (`t[p·LANES + r]` = element `at + r·ss + p`). Panics unless the
    /// block lies inside the elements and `t` holds `LANES²` floats.
    fn block_t<S: Simd>(self, s: S, at: usize, ss: usize, t: &mut [f32]);
    /// The score `x` with the mask value `m` applied.
    fn apply1(x: f32, m: f32) -> f32;
    /// [`apply1`](Self::apply1) on vectors.
    fn apply<S: Simd>(s: S, x: S::V, m: S::V) -> S::V;
}

impl MaskElems for &[f32] {
    #[inline(always)]
    fn value(self, at: usize) -> f32 {
        self[at]
    }
    #[inline(always)]
    fn block_t<S: Simd>(self, s: S, at: usize, ss: usize, t: &mut [f32]) {
        transpose(s, &self[at..], ss, t, S::LANES);
    }
    #[inline(always)]
    fn apply1(x: f32, m: f32) -> f32 {
        x + m
    }
    #[inline(always)]
    fn apply<S: Simd>(s: S, x: S::V, m: S::V) -> S::V {
        s.add(x, m)
    }
}

impl MaskElems for &[bool] {
    #[inline(always)]
    fn value(self, at: usize) -> f32 {
        if self[at] {
            0.0
        } else {
            f32::NEG_INFINITY
        }
    }
    #[inline(always)]
    fn block_t<S: Simd>(self, s: S, at: usize, ss: usize, t: &mut [f32]) {
        let l = S::LANES;
        let mut rows = [0.0f32; MAX_BLOCK];
        let (zero, hidden) = (s.splat(0.0), s.splat(f32::NEG_INFINITY));
        for (r, row) in rows[..l * l].chunks_exact_mut(l).enumerate() {
            store(s, row, s.select(keep(s, &self[at + r * ss..]), zero, hidden));
        }
        transpose(s, &rows[..l * l], l, t, l);
    }
    #[inline(always)]
    fn apply1(x: f32, m: f32) -> f32 {
        if m < 0.0 {
            f32::NEG_INFINITY
        } else {
            x
        }
    }
    #[inline(always)]
    fn apply<S: Simd>(s: S, x: S::V, m: S::V) -> S::V {
        s.select(s.lt(m, s.splat(0.0)), s.splat(f32::NEG_INFINITY), x)
    }
}

/// Floats of the largest `LANES × LANES` block.
const MAX_BLOCK: usize = MAX_LANES * MAX_LANES;

/// Applies the mask elements `m` to the block of scores `sc` (module docs): rows
/// `r < rows`, keys `j < nb`, score `sc[j·stride + r]`, element `a0 + r·s2 + j·s3`. Panics
/// (never UB) if an element or a score lies outside its slice, which the mask's check
/// (`Mask::check`) and the callers' sizing rule out.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn apply<S: Simd, M: MaskElems>(
    s: S,
    m: M,
    (a0, s2, s3): (usize, usize, usize),
    rows: usize,
    nb: usize,
    stride: usize,
    sc: &mut [f32],
) {
    let l = S::LANES;
    // The full blocks of the transposed walk, when there is one.
    let (fr, fj) = if s2 != 0 && s3 == 1 { (rows / l * l, nb / l * l) } else { (0, 0) };
    if fr > 0 {
        let mut t = [0.0f32; MAX_BLOCK];
        let t = &mut t[..l * l];
        for jb in (0..fj).step_by(l) {
            for rg in (0..fr).step_by(l) {
                m.block_t(s, a0 + rg * s2 + jb, s2, t);
                for (jj, mv) in t.chunks_exact(l).enumerate() {
                    let x = &mut sc[(jb + jj) * stride + rg..][..l];
                    store(s, x, M::apply(s, load(s, x), load(s, mv)));
                }
            }
        }
    }
    // Key by key: the rows the blocks left (all of them past the last full block of keys).
    for (j, row) in sc.chunks_mut(stride).take(nb).enumerate() {
        let (at, row) = (a0 + j * s3, &mut row[..rows]);
        if s2 == 0 {
            let v = m.value(at);
            row.iter_mut().for_each(|x| *x = M::apply1(*x, v));
            continue;
        }
        let r0 = if j < fj { fr } else { 0 };
        for (r, x) in row.iter_mut().enumerate().skip(r0) {
            *x = M::apply1(*x, m.value(at + r * s2));
        }
    }
}
