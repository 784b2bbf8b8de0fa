//! The one f32 vector trait, [`Simd`], that every kernel is written in, and the one way to run
//! generic code on an ISA: a [`Kernel`] handed to [`vectorize`].
//!
//! An implementor is a zero-sized *token*: a value exists only after the CPU check
//! ([`Simd::try_new`]) or under an `unsafe` promise ([`Simd::new_unchecked`]), so its
//! arithmetic methods are safe. Only the methods that take raw pointers are `unsafe`; algorithm
//! bodies use the slice helpers below ([`load`], [`store`], [`load_tail`], [`store_tail`]),
//! which check bounds and compile to the same single instruction once the compiler has
//! hoisted the check out of the loop.
//!
//! Generic bodies must be `#[inline(always)]` and reached from a `#[target_feature]` function
//! ([`vectorize`] or a GEMM micro-kernel wrapper): only then do the intrinsics inline.

use std::cell::Cell;
use std::marker::PhantomData;

use attn_core::dtype::{bf16, f16};

use super::Isa;
use super::Portable;

/// `1.5 · 2^23`: adding it to `|v| < 2^22` rounds `v` to an integer (ties to even) held in the
/// low mantissa bits of the sum. The `t` argument of [`Simd::ldexp`] and [`Simd::exp2_k8`]
/// is formed this way.
pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0;
/// `ROUND_MAGIC.to_bits()`.
pub(crate) const ROUND_MAGIC_BITS: i32 = 0x4B40_0000;
/// `2^−64`, the fixed second factor of [`Simd::ldexp_low`].
pub(crate) const TWO_POW_M64: f32 = f32::from_bits((127 - 64) << 23);

/// Relative error bound of [`Simd::recip`] on every ISA. After one Newton step with a single
/// rounding, an estimate of relative error `e` becomes `e² + u`: AVX-512's `vrcp14ps`
/// (`e ≤ 2⁻¹⁴`) gives `1.0000001·u`, AVX2's `vrcpps` (`e ≤ 1.5·2⁻¹²`) `3.25·u`; the portable
/// division `0.5·u` (`u = 2⁻²⁴`). Checked over every mantissa of a binade and the edges of the
/// range by the unit test `recip_is_within_its_bound`.
pub const RECIP_MAX_REL: f64 = 3.25 / (1u64 << 24) as f64;

/// An f32 vector ISA, as a token: lanes, vector and mask types, and the operations the GEMM
/// micro-kernels, the softmax and the attention kernels are written in. Implemented by
/// [`Avx512`](super::Avx512), [`Avx2`](super::Avx2) and [`Portable`].
pub(crate) trait Simd: Copy + Send + Sync + 'static {
    /// The ISA this implements.
    const ISA: Isa;
    /// f32 lanes per vector.
    const LANES: usize;
    /// Architectural vector registers: what register tiles may be sized for.
    const REGISTERS: usize;
    /// True when [`stream`](Self::stream) is a non-temporal store (needs `LANES × 4`-byte
    /// alignment); false when it is an ordinary store.
    const HAS_STREAM: bool;
    /// True when [`fma`](Self::fma) rounds once.
    const FUSED: bool;
    /// A vector of `LANES` f32.
    type V: Copy;
    /// A per-lane boolean mask.
    type M: Copy;

    /// The token, when this CPU supports the ISA.
    fn try_new() -> Option<Self>;
    /// The token without the CPU check.
    ///
    /// # Safety
    /// The CPU must support [`Self::ISA`] (e.g. the caller is a micro-kernel whose own contract
    /// requires it).
    unsafe fn new_unchecked() -> Self;

    /// Every lane `x`.
    fn splat(self, x: f32) -> Self::V;
    /// Loads `LANES` f32 (unaligned).
    ///
    /// # Safety
    /// `p` valid for reading `LANES` f32.
    unsafe fn load(self, p: *const f32) -> Self::V;
    /// Loads `k < LANES` f32; lanes `≥ k` are 0.0 and are not read.
    ///
    /// # Safety
    /// `p` valid for reading `k` f32.
    unsafe fn load_tail(self, p: *const f32, k: usize) -> Self::V;
    /// Stores `LANES` f32 (unaligned).
    ///
    /// # Safety
    /// `p` valid for writing `LANES` f32.
    unsafe fn store(self, p: *mut f32, v: Self::V);
    /// Stores the first `k < LANES` lanes; nothing else is touched.
    ///
    /// # Safety
    /// `p` valid for writing `k` f32.
    unsafe fn store_tail(self, p: *mut f32, k: usize, v: Self::V);
    /// Non-temporal store of `LANES` f32 when [`HAS_STREAM`](Self::HAS_STREAM), otherwise an
    /// ordinary store. Needs [`store_fence`] before another thread reads the data.
    ///
    /// # Safety
    /// `p` valid for writing `LANES` f32 and, when `HAS_STREAM`, aligned to `LANES × 4` bytes.
    unsafe fn stream(self, p: *mut f32, v: Self::V);
    /// `LANES` bf16 widened to f32: exact (the bits shifted left by 16); a NaN keeps its sign
    /// and payload and gets its quiet bit set, as `half`'s `bf16::to_f32` does.
    ///
    /// # Safety
    /// `p` valid for reading `LANES` bf16.
    unsafe fn load_bf16(self, p: *const bf16) -> Self::V;
    /// [`load_bf16`](Self::load_bf16) for an operand of arithmetic only: a signalling NaN may
    /// stay signalling. The arithmetic that reads it returns the same bits either way (x86
    /// returns the first NaN operand, quieted, whether it was signalling or quiet), and the x86
    /// widening is then the shift alone. Never for values that are stored or compared as bits.
    ///
    /// # Safety
    /// `p` valid for reading `LANES` bf16.
    #[inline(always)]
    unsafe fn load_bf16_operand(self, p: *const bf16) -> Self::V {
        // SAFETY: forwarded.
        unsafe { self.load_bf16(p) }
    }
    /// `LANES` f16 widened to f32: exact (`vcvtph2ps`); a NaN keeps its sign and payload and
    /// gets its quiet bit set, as `half`'s `f16::to_f32` does.
    ///
    /// # Safety
    /// `p` valid for reading `LANES` f16.
    unsafe fn load_f16(self, p: *const f16) -> Self::V;
    /// Stores `LANES` f32 rounded to bf16: nearest, ties to even, subnormals kept (integer
    /// arithmetic, see [`bf16_bits`](super::convert::bf16_bits), not `vcvtneps2bf16`, which
    /// flushes them), overflow to `±∞`; a NaN becomes `(bits >> 16) | 0x40` (sign and top
    /// payload kept, quiet). The bits of `half`'s `bf16::from_f32` on every ISA.
    ///
    /// # Safety
    /// `p` valid for writing `LANES` bf16.
    unsafe fn store_bf16(self, p: *mut bf16, v: Self::V);
    /// Stores `LANES` f32 rounded to f16: nearest, ties to even (`vcvtps2ph` with an explicit
    /// round-to-nearest immediate, whatever MXCSR says), f16 subnormals kept, `|x| ≥ 65520` to
    /// `±∞`; a NaN becomes `sign | 0x7E00 | (mantissa >> 13)` (quiet, top payload kept). The
    /// bits of `half`'s `f16::from_f32` on every ISA.
    ///
    /// # Safety
    /// `p` valid for writing `LANES` f16.
    unsafe fn store_f16(self, p: *mut f16, v: Self::V);
    /// `LANES` int8 widened to f32 (exact: every int8 is an f32): the values of a quantised
    /// K/V row ([`attn_core::quant`]), which the decode tiles then multiply by their block's
    /// scale in registers.
    ///
    /// # Safety
    /// `p` valid for reading `LANES` i8.
    unsafe fn load_i8(self, p: *const i8) -> Self::V;
    /// Transposes a `LANES × LANES` block: row `p` of the destination (the `LANES` floats at
    /// `dst + p·ds`) receives column `p` of the source, whose row `i` is the `LANES` floats at
    /// `src + i·ss`: the packing of a transposed GEMM operand, a vector block at a time.
    /// Element by element here; the x86 ISAs shuffle in registers.
    ///
    /// # Safety
    /// `src + i·ss .. + LANES` readable and `dst + p·ds .. + LANES` writable for every
    /// `i, p < LANES`, the two blocks apart.
    #[inline(always)]
    unsafe fn transpose(self, src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
        for p in 0..Self::LANES {
            for i in 0..Self::LANES {
                // SAFETY: the caller's guarantee.
                unsafe { *dst.add(p * ds + i) = *src.add(i * ss + p) };
            }
        }
    }
    /// Hints that the cache line holding `p` will be read soon (into L1). Any address is
    /// allowed: a prefetch never faults. No-op on [`Portable`].
    fn prefetch(self, p: *const f32);
    /// As [`prefetch`](Self::prefetch), for a line read only after the current L1 working set
    /// is done with: into L2 (`prefetcht1`).
    fn prefetch_far(self, p: *const f32);

    /// `a + b`.
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a − b`.
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`, correctly rounded.
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `1/d` within [`RECIP_MAX_REL`] relative, for `2⁻¹²⁵ ≤ |d| ≤ 2¹²⁵` (elsewhere
    /// unspecified, possibly NaN; a NaN lane stays NaN): the hardware estimate and one
    /// Newton step `r·(1 + (1 − d·r))` where the ISA has one (a quarter of a division's cost on
    /// AVX-512), a division otherwise.
    fn recip(self, d: Self::V) -> Self::V;
    /// `a · b + c`: one rounding on the x86 ISAs; [`Portable`] rounds once where the build
    /// target has an FMA and twice otherwise ([`FUSED`](Self::FUSED)).
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `vdpbf16ps`: per lane `acc + a₁·b₁ + a₀·b₀`, each lane of `a` and `b` holding the bits
    /// of a pair of bf16 (`x₀` in the low half). The products are exact; the odd one is added
    /// first, each sum rounded to f32. The avx512 implementation runs the instruction, which
    /// also reads subnormal inputs as 0 and flushes subnormal results (see [`crate::gemm`]);
    /// the default, [`bf16_pair_dot`] lane by lane, does not flush.
    ///
    /// # Safety
    /// On [`Avx512`](super::Avx512) the CPU must support AVX512_BF16, and the caller should
    /// run inside [`vectorize_dot`] (elsewhere the instruction is not inlined). The default
    /// has no requirement.
    #[inline(always)]
    unsafe fn dot_bf16(self, acc: Self::V, a: Self::V, b: Self::V) -> Self::V {
        let l = Self::LANES;
        let (mut x, mut y, mut z) = ([0.0f32; MAX_LANES], [0.0f32; MAX_LANES], [0.0f32; MAX_LANES]);
        store(self, &mut x[..l], acc);
        store(self, &mut y[..l], a);
        store(self, &mut z[..l], b);
        for ((x, &y), &z) in x[..l].iter_mut().zip(&y[..l]).zip(&z[..l]) {
            *x = bf16_pair_dot(*x, y, z);
        }
        load(self, &x[..l])
    }
    /// Lane-wise maximum; when either lane is NaN the result is `b`'s lane (the x86 `maxps`
    /// rule), so `max(c, x)` propagates a NaN `x`.
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise minimum (which lane wins when one is NaN is unspecified).
    fn min(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise maximum that keeps `acc` where `v` is NaN (a NaN never enters `acc`).
    fn max_skip_nan(self, acc: Self::V, v: Self::V) -> Self::V;
    /// `min(acc, v)` lane-wise, keeping `acc` where `v` is NaN.
    fn min_skip_nan(self, acc: Self::V, v: Self::V) -> Self::V;
    /// `max(v, lo)` lane-wise, NaN lanes of `v` left NaN.
    fn max_keep_nan(self, v: Self::V, lo: Self::V) -> Self::V;
    /// `v` clamped to `[lo, hi]`, NaN lanes left NaN.
    fn clamp_keep_nan(self, v: Self::V, lo: Self::V, hi: Self::V) -> Self::V;

    /// Sum of the lanes.
    fn reduce_add(self, v: Self::V) -> f32;
    /// The lane sums of four vectors, `[Σa, Σb, Σc, Σd]`: one transposed reduction instead of
    /// four horizontal sums.
    fn reduce_add4(self, v: [Self::V; 4]) -> [f32; 4];
    /// Largest lane (used where no lane is NaN).
    fn reduce_max(self, v: Self::V) -> f32;
    /// Smallest lane (used where no lane is NaN).
    fn reduce_min(self, v: Self::V) -> f32;

    /// `p · 2^n` where `n` is an integer-valued float in `[−150, 128]` and `t` is the same
    /// integer rounded by adding [`ROUND_MAGIC`] (its low mantissa bits hold `n`). Rounds once,
    /// so results in the subnormal range are right and `p · 2^128` overflows to `+∞` exactly
    /// when it should. NaN `p` gives NaN.
    fn ldexp(self, p: Self::V, n: Self::V, t: Self::V) -> Self::V;
    /// [`ldexp`](Self::ldexp) for `n ∈ [−150, 63]` only: one scaling by `2^(n+64)` (exact,
    /// normal) and one by `2^−64` (the only rounding), so the same bits for fewer integer
    /// operations. Defaults to `ldexp`.
    #[inline(always)]
    fn ldexp_low(self, p: Self::V, n: Self::V, t: Self::V) -> Self::V {
        self.ldexp(p, n, t)
    }
    /// The bits of each lane shifted left by 23 (into the exponent field), as f32: `2^(k−127)`
    /// when the low 9 bits of `t`'s bits hold `k ∈ [1, 254]`.
    fn shl23(self, t: Self::V) -> Self::V;
    /// `2^(k/8)` for the integers `k` that `t` holds the way [`ldexp`](Self::ldexp)'s `t`
    /// does (`|k| < 2^22`), given `table[j] = bits(2^(j/8)) − (j << 20)` for `j < 8`
    /// (repeated to fill the vector): lane `i` is `bits(table[k_i mod 8]) + (bits(t_i) << 20)`,
    /// exact while the result is a normal f32 (`k ≥ −1008`).
    fn exp2_k8(self, table: Self::V, t: Self::V) -> Self::V;

    /// True when some lane of `v` is `< lo` (NaN lanes are not).
    fn any_lt(self, v: Self::V, lo: Self::V) -> bool;
    /// Lanes where `v < lo` (not NaN lanes).
    fn lt(self, v: Self::V, lo: Self::V) -> Self::M;
    /// Lanes of `a` that are not `+0`/`−0` (NaN lanes count as non-zero).
    fn nonzero(self, a: Self::V) -> Self::M;
    /// Lanes `< k` set (`k ≤ LANES`).
    fn first(self, k: usize) -> Self::M;
    /// `m ? a : b` lane-wise.
    fn select(self, m: Self::M, a: Self::V, b: Self::V) -> Self::V;
    /// `a · b + c` in the lanes set in `m`, `c` elsewhere: a product with a zero weight
    /// contributes nothing even when the other factor is `±∞` or NaN.
    fn fma_where(self, m: Self::M, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `x` in the lanes set in `m`, `0` elsewhere.
    fn zero_unless(self, m: Self::M, x: Self::V) -> Self::V;
    /// Lanes where `keep[j]` is true.
    ///
    /// # Safety
    /// `p` valid for reading `LANES` bools.
    unsafe fn keep(self, p: *const bool) -> Self::M;
    /// Lanes `< k` where `keep[j]` is true, `k < LANES`.
    ///
    /// # Safety
    /// `p` valid for reading `k` bools.
    unsafe fn keep_tail(self, p: *const bool, k: usize) -> Self::M;
}

/// A computation written once over any [`Simd`]; [`vectorize`] compiles and runs it for one ISA.
pub(crate) trait Kernel {
    /// What the computation returns.
    type Output;
    /// The body; implementations mark it `#[inline(always)]` so it is compiled inside the
    /// `#[target_feature]` wrapper of the ISA.
    fn run<S: Simd>(self, s: S) -> Self::Output;
}

/// The largest [`Simd::LANES`] of any implementation: the size of the stack buffers that tails
/// of half-precision loads and stores go through ([`super::convert`]).
pub(crate) const MAX_LANES: usize = 16;

/// Runs `k` with the vector code of `isa`, which must be supported (callers obtained it through
/// [`Isa::require`] or [`super::selected`]); an unsupported ISA falls back to portable code
/// rather than executing illegal instructions.
#[inline]
pub(crate) fn vectorize<K: Kernel>(isa: Isa, k: K) -> K::Output {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => match super::Avx512::try_new() {
            Some(s) => s.vectorize(k),
            None => k.run(Portable),
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => match super::Avx2::try_new() {
            Some(s) => s.vectorize(k),
            None => k.run(Portable),
        },
        _ => k.run(Portable),
    }
}

/// Runs `k` with the avx512 vector code compiled with AVX512_BF16 as well, so that
/// [`Simd::dot_bf16`] inlines as `vdpbf16ps`; on a CPU without AVX-512F or AVX512_BF16, with
/// the portable code (whose `dot_bf16` is the scalar [`bf16_pair_dot`]).
#[inline]
pub(crate) fn vectorize_dot<K: Kernel>(k: K) -> K::Output {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = super::Avx512::try_new().filter(|_| is_x86_feature_detected!("avx512bf16")) {
        // SAFETY: the CPU has AVX512_BF16 (checked above).
        return unsafe { s.vectorize_bf16(k) };
    }
    k.run(Portable)
}

/// One lane of `vdpbf16ps` without its flushing: `acc + a₁·b₁ + a₀·b₀` where `a` and `b` hold
/// the bits of two bf16 each (`x₀` in the low half), the odd product added first, each sum
/// rounded once (the products of two bf16 are exact in f32 unless they leave its range).
#[inline(always)]
pub(crate) fn bf16_pair_dot(acc: f32, a: f32, b: f32) -> f32 {
    let hi = |w: f32| f32::from_bits(w.to_bits() & 0xFFFF_0000);
    let lo = |w: f32| f32::from_bits(w.to_bits() << 16);
    lo(a).mul_add(lo(b), hi(a).mul_add(hi(b), acc))
}

/// Loads `LANES` floats from the start of `x` (which must hold that many; panics otherwise).
#[inline(always)]
pub(crate) fn load<S: Simd>(s: S, x: &[f32]) -> S::V {
    let x = &x[..S::LANES];
    // SAFETY: `x` has exactly LANES floats.
    unsafe { s.load(x.as_ptr()) }
}

/// Stores `LANES` floats at the start of `x` (which must hold that many; panics otherwise).
#[inline(always)]
pub(crate) fn store<S: Simd>(s: S, x: &mut [f32], v: S::V) {
    let x = &mut x[..S::LANES];
    // SAFETY: `x` has exactly LANES floats.
    unsafe { s.store(x.as_mut_ptr(), v) }
}

/// [`Simd::transpose`] on slices: row `p` of the destination block (`dst[p·ds..][..LANES]`)
/// receives column `p` of the source block, whose row `i` is `src[i·ss..][..LANES]` (panics
/// unless both blocks lie inside their slices).
#[inline(always)]
pub(crate) fn transpose<S: Simd>(s: S, src: &[f32], ss: usize, dst: &mut [f32], ds: usize) {
    let l = S::LANES;
    let span = |stride: usize| stride.checked_mul(l - 1).and_then(|x| x.checked_add(l));
    assert!(span(ss).is_some_and(|n| n <= src.len()) && span(ds).is_some_and(|n| n <= dst.len()));
    // SAFETY: both blocks are inside their slices (checked), which do not overlap (one is
    // borrowed mutably).
    unsafe { s.transpose(src.as_ptr(), ss, dst.as_mut_ptr(), ds) }
}

/// `dst[c·ds + r] = src[r·ss + c]` for `r < rows`, `c < cols`: a matrix transposed by
/// `LANES × LANES` blocks ([`transpose`]), the edges element by element (panics unless every
/// element lies inside its slice).
#[inline(always)]
pub(crate) fn transpose_matrix<S: Simd>(
    s: S,
    src: &[f32],
    (rows, cols, ss): (usize, usize, usize),
    dst: &mut [f32],
    ds: usize,
) {
    let l = S::LANES;
    let (full_r, full_c) = (rows / l * l, cols / l * l);
    for r0 in (0..full_r).step_by(l) {
        for c0 in (0..full_c).step_by(l) {
            transpose(s, &src[r0 * ss + c0..], ss, &mut dst[c0 * ds + r0..], ds);
        }
    }
    for r in 0..rows {
        let cs = if r < full_r { full_c } else { 0 };
        for c in cs..cols {
            dst[c * ds + r] = src[r * ss + c];
        }
    }
}

/// Loads the `x.len() < LANES` floats of `x`; the other lanes are 0.0.
#[inline(always)]
pub(crate) fn load_tail<S: Simd>(s: S, x: &[f32]) -> S::V {
    assert!(x.len() < S::LANES);
    // SAFETY: `x` has `x.len()` readable floats.
    unsafe { s.load_tail(x.as_ptr(), x.len()) }
}

/// Stores the first `x.len() < LANES` lanes of `v` into `x`.
#[inline(always)]
pub(crate) fn store_tail<S: Simd>(s: S, x: &mut [f32], v: S::V) {
    assert!(x.len() < S::LANES);
    // SAFETY: `x` has `x.len()` writable floats.
    unsafe { s.store_tail(x.as_mut_ptr(), x.len(), v) }
}

/// Loads `LANES` floats from the start of the cells `x` (at least that many; panics otherwise).
#[inline(always)]
pub(crate) fn load_cells<S: Simd>(s: S, x: &[Cell<f32>]) -> S::V {
    Floats::from(x).load(s, 0)
}

/// Loads the `x.len() < LANES` cells of `x`; the other lanes are 0.0.
#[inline(always)]
pub(crate) fn load_tail_cells<S: Simd>(s: S, x: &[Cell<f32>]) -> S::V {
    Floats::from(x).load_tail(s, 0, x.len())
}

/// Stores `LANES` floats into the first cells of `x` (at least that many; panics otherwise).
#[inline(always)]
pub(crate) fn store_cells<S: Simd>(s: S, x: &[Cell<f32>], v: S::V) {
    let x = &x[..S::LANES];
    // SAFETY: `x` has exactly LANES cells; a shared reference to cells permits writes through
    // it, and cells are not `Sync`, so no other thread reads them meanwhile.
    unsafe { s.store(x.as_ptr().cast::<f32>().cast_mut(), v) }
}

/// Stores the first `x.len() < LANES` lanes of `v` into the cells `x`.
#[inline(always)]
pub(crate) fn store_tail_cells<S: Simd>(s: S, x: &[Cell<f32>], v: S::V) {
    assert!(x.len() < S::LANES);
    // SAFETY: as in `store_cells`, for `x.len()` cells.
    unsafe { s.store_tail(x.as_ptr().cast::<f32>().cast_mut(), x.len(), v) }
}

/// Stores `LANES` floats into the first cells of `x` by a non-temporal store ([`Simd::stream`])
/// when they start on a `LANES × 4`-byte boundary, by an ordinary store otherwise (callers align
/// their stream, so that is the rare head of a row). Needs [`store_fence`] as `stream` does.
#[inline(always)]
pub(crate) fn stream_cells<S: Simd>(s: S, x: &[Cell<f32>], v: S::V) {
    let x = &x[..S::LANES];
    let p = x.as_ptr().cast::<f32>().cast_mut();
    if (p as usize).is_multiple_of(S::LANES * 4) {
        // SAFETY: as in `store_cells`; aligned as `stream` requires.
        unsafe { s.stream(p, v) }
    } else {
        // SAFETY: as in `store_cells`.
        unsafe { s.store(p, v) }
    }
}

/// The lanes where the first `LANES` bools of `keep` are true (panics if there are fewer).
#[inline(always)]
pub(crate) fn keep<S: Simd>(s: S, keep: &[bool]) -> S::M {
    let keep = &keep[..S::LANES];
    // SAFETY: `keep` has exactly LANES bools.
    unsafe { s.keep(keep.as_ptr()) }
}

/// The lanes `< keep.len() < LANES` where `keep` is true.
#[inline(always)]
pub(crate) fn keep_tail<S: Simd>(s: S, keep: &[bool]) -> S::M {
    assert!(keep.len() < S::LANES);
    // SAFETY: `keep` has `keep.len()` readable bools.
    unsafe { s.keep_tail(keep.as_ptr(), keep.len()) }
}

/// The address of `x`'s first element, for alignment and page-phase arithmetic only.
#[inline(always)]
pub(crate) fn addr<T>(x: &[T]) -> usize {
    x.as_ptr() as usize
}

/// How many of `x`'s elements come before its first `LANES × 4`-byte boundary (`< LANES`, and
/// at most `x.len()`).
#[inline(always)]
pub(crate) fn lanes_to_boundary<S: Simd, T>(x: &[T]) -> usize {
    debug_assert_eq!(std::mem::size_of::<T>(), 4);
    let l = S::LANES;
    ((l - (addr(x) / 4) % l) % l).min(x.len())
}

/// A run of f32 read by a kernel while it may also be written through cells: an input row
/// that is the output row too (in place), or a buffer that one pass reads behind another
/// pass's writes. Made from a `&[f32]` (then nothing writes it) or a `&[Cell<f32>]` (then only
/// this thread does: neither is `Send` or `Sync`), so a read never races a write; every read
/// is bounds-checked (and the checks hoisted where the loop bounds imply them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Floats<'a> {
    ptr: *const f32,
    len: usize,
    _cells: PhantomData<&'a [Cell<f32>]>,
}

impl<'a> From<&'a [f32]> for Floats<'a> {
    #[inline(always)]
    fn from(x: &'a [f32]) -> Self {
        Floats { ptr: x.as_ptr(), len: x.len(), _cells: PhantomData }
    }
}

impl<'a> From<&'a [Cell<f32>]> for Floats<'a> {
    #[inline(always)]
    fn from(x: &'a [Cell<f32>]) -> Self {
        // `Cell<f32>` has the layout of `f32`.
        Floats { ptr: x.as_ptr().cast(), len: x.len(), _cells: PhantomData }
    }
}

impl<'a> Floats<'a> {
    /// No elements.
    #[inline(always)]
    pub(crate) fn empty() -> Self {
        let none: &[f32] = &[];
        Floats::from(none)
    }

    /// The number of elements.
    #[inline(always)]
    pub(crate) fn len(self) -> usize {
        self.len
    }

    /// Elements `start..start + len` (panics unless inside).
    #[inline(always)]
    pub(crate) fn slice(self, start: usize, len: usize) -> Floats<'a> {
        assert!(start <= self.len && len <= self.len - start);
        // SAFETY: `start ≤ self.len`: inside the run (or one past its end).
        Floats { ptr: unsafe { self.ptr.add(start) }, len, _cells: PhantomData }
    }

    /// Elements `start..start + len`, or `None` when they are not all inside. As a loop
    /// condition (`while let Some(w) = x.window(j, W)`) it is the loop's only bounds check:
    /// loads at constant offsets below a constant `W` inside the window need none.
    #[inline(always)]
    pub(crate) fn window(self, start: usize, len: usize) -> Option<Floats<'a>> {
        (start <= self.len && len <= self.len - start).then(|| self.slice(start, len))
    }

    /// Elements `j .. j + LANES` (panics unless inside).
    #[inline(always)]
    pub(crate) fn load<S: Simd>(self, s: S, j: usize) -> S::V {
        assert!(j <= self.len && S::LANES <= self.len - j);
        // SAFETY: checked: LANES readable floats at `j`.
        unsafe { s.load(self.ptr.add(j)) }
    }

    /// Elements `j .. j + k`, `k < LANES`, the other lanes 0.0 (panics unless inside).
    #[inline(always)]
    pub(crate) fn load_tail<S: Simd>(self, s: S, j: usize, k: usize) -> S::V {
        assert!(k < S::LANES && j <= self.len && k <= self.len - j);
        // SAFETY: checked: `k` readable floats at `j`.
        unsafe { s.load_tail(self.ptr.add(j), k) }
    }

    /// Hints that the line holding element `j` will be read soon (into L1). Any `j` is
    /// allowed, past the end too: a prefetch reads nothing and never faults.
    #[inline(always)]
    pub(crate) fn prefetch<S: Simd>(self, s: S, j: usize) {
        s.prefetch(self.ptr.wrapping_add(j));
    }

    /// As [`prefetch`](Self::prefetch), into L2 ([`Simd::prefetch_far`]).
    #[inline(always)]
    pub(crate) fn prefetch_far<S: Simd>(self, s: S, j: usize) {
        s.prefetch_far(self.ptr.wrapping_add(j));
    }

    /// How many elements come before the first `LANES × 4`-byte boundary (`< LANES`, and at
    /// most `len`).
    #[inline(always)]
    pub(crate) fn lanes_to_boundary<S: Simd>(self) -> usize {
        let l = S::LANES;
        ((l - (self.ptr as usize / 4) % l) % l).min(self.len)
    }
}

/// Orders this thread's earlier non-temporal stores ([`Simd::stream`]) before its later
/// stores, so that another thread that synchronises with this one afterwards (a rayon join, a
/// return to the caller) sees them. A no-op where `stream` is an ordinary store.
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is SSE, part of every x86-64 CPU; it only orders stores.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Hints the cache to fetch the line holding `p` into L1 (`prefetcht0`), or with `far` into
/// L2 (`prefetcht1`). No fault, no effect on results; a no-op off x86-64, where the hint is part of the
/// baseline. Any address is allowed, so callers form it with `wrapping_add`.
#[inline(always)]
pub(crate) fn prefetch_line(p: *const f32, far: bool) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and never changes memory; any address is allowed.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        if far {
            _mm_prefetch::<_MM_HINT_T1>(p.cast())
        } else {
            _mm_prefetch::<_MM_HINT_T0>(p.cast())
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, far);
}
