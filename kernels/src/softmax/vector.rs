//! The f32 vector vocabulary the softmax (and the attention kernel's fused loops) are written in:
//! one trait, [`SimdF32`], and one zero-sized implementation per [`Isa`] —
//! [`Avx512`] (16 lanes, `__m512`), [`Avx2`] (8 lanes, `__m256`) and [`Portable`] (8 lanes,
//! `wide::f32x8`, whatever the target compiles it to).
//!
//! Every generic body (`row.rs`, `exp.rs`) is `#[inline(always)]` and is instantiated inside a
//! thin `#[target_feature]` wrapper per ISA, so the intrinsics below inline into code compiled
//! for that ISA. This is the only file of the softmax that names an intrinsic.
//!
//! # Safety contract of the trait
//!
//! Every method is `unsafe`: the caller must run on a CPU that supports `Self::ISA`
//! ([`Isa::is_supported`]); pointer arguments must be valid for the reads or writes each method
//! documents. Calling them from a function that lacks the matching `#[target_feature]` is sound
//! on such a CPU, only slow (nothing inlines).

use crate::arch::Isa;

/// Orders this thread's earlier non-temporal stores ([`SimdF32::stream`]) before its later
/// stores, so that another thread that synchronises with this one afterwards (a rayon join, a
/// return to the caller) sees them. A no-op where [`SimdF32::stream`] is an ordinary store.
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is SSE, part of every x86_64 CPU; it only orders stores.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// `2^−64`, the fixed second factor of [`SimdF32::ldexp_low`].
pub(crate) const TWO_POW_M64: f32 = f32::from_bits((127 - 64) << 23);

/// An f32 SIMD instruction set: vector type, lane mask type, and the handful of operations the
/// softmax needs. See the module docs for the safety contract shared by all methods.
pub(crate) trait SimdF32: Copy + 'static {
    /// The ISA this implementation needs.
    const ISA: Isa;
    /// Number of f32 lanes in [`Self::V`].
    const LANES: usize;
    /// True when [`stream`](Self::stream) is a non-temporal store (needs `LANES × 4`-byte
    /// alignment); false when it is an ordinary store.
    const HAS_STREAM: bool;
    /// True when [`fmadd`](Self::fmadd) rounds once.
    const FUSED: bool;
    /// A vector of `LANES` f32.
    type V: Copy;
    /// A per-lane boolean mask.
    type M: Copy;

    /// Every lane `x`.
    unsafe fn splat(x: f32) -> Self::V;
    /// Loads `LANES` f32 from `p` (unaligned). `p` valid for `LANES` reads.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Loads `k < LANES` f32 from `p`; lanes `≥ k` are 0.0. `p` valid for `k` reads only.
    unsafe fn load_tail(p: *const f32, k: usize) -> Self::V;
    /// Stores `LANES` f32 to `p` (unaligned). `p` valid for `LANES` writes.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// Stores the first `k < LANES` lanes to `p`. `p` valid for `k` writes only.
    unsafe fn store_tail(p: *mut f32, k: usize, v: Self::V);
    /// Non-temporal store of `LANES` f32 to `p` when [`HAS_STREAM`](Self::HAS_STREAM), which then
    /// requires `p` aligned to `LANES × 4` bytes; otherwise an ordinary store.
    unsafe fn stream(p: *mut f32, v: Self::V);
    /// Hints that the cache line holding `p` will be read soon. Any address is allowed: a
    /// prefetch never faults. No-op on `Portable`.
    unsafe fn prefetch(p: *const f32);
    /// As [`prefetch`](Self::prefetch), for a line read only after the current L1 working set
    /// is done with (a later row of a streamed call): into L2, not L1 (`prefetcht1`).
    unsafe fn prefetch_far(p: *const f32);

    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a − b`.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a · b + c`, with one rounding on the x86 ISAs; `Portable` rounds once where the target
    /// has an FMA and twice otherwise (`wide::f32x8::mul_add`).
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Lane-wise maximum that keeps `acc` where `v` is NaN (a NaN never enters `acc`).
    unsafe fn max_skip_nan(acc: Self::V, v: Self::V) -> Self::V;
    /// `max(v, lo)` lane-wise, NaN lanes of `v` left NaN.
    unsafe fn max_keep_nan(v: Self::V, lo: Self::V) -> Self::V;
    /// `v` clamped to `[lo, hi]`, NaN lanes left NaN.
    unsafe fn clamp_keep_nan(v: Self::V, lo: Self::V, hi: Self::V) -> Self::V;
    /// Largest lane (`acc` lanes are never NaN where this is used).
    unsafe fn reduce_max(v: Self::V) -> f32;
    /// Smallest lane (`acc` lanes are never NaN where this is used).
    unsafe fn reduce_min(v: Self::V) -> f32;
    /// Sum of the lanes.
    unsafe fn reduce_add(v: Self::V) -> f32;

    /// `p · 2^n` where `n` is an integer-valued float in `[−150, 128]` and `t` is the same
    /// integer rounded by adding `exp::ROUND_MAGIC` (its low mantissa
    /// bits hold `n`). Must round once, so results in the subnormal range are right and
    /// `p · 2^128` overflows to `+∞` exactly when it should. NaN `p` gives NaN.
    unsafe fn ldexp(p: Self::V, n: Self::V, t: Self::V) -> Self::V;
    /// [`ldexp`](Self::ldexp) for `n ∈ [−150, 63]` only (the exp of `x ≤ 43`): one scaling by
    /// `2^(n+64)` (exact, normal) and one by `2^−64` (the only rounding), so the result is the
    /// same, bit for bit, for three fewer integer operations.
    unsafe fn ldexp_low(p: Self::V, n: Self::V, t: Self::V) -> Self::V {
        // SAFETY: forwarded contract.
        unsafe { Self::ldexp(p, n, t) }
    }

    /// The bits of each lane shifted left by 23 (into the exponent field), as f32: `2^(k−127)`
    /// when the low 9 bits of `t`'s bits hold `k ∈ [1, 254]`.
    unsafe fn shl23(t: Self::V) -> Self::V;

    /// `2^(k/8)` for the integers `k` that `t` holds the way [`ldexp`](Self::ldexp)'s `t`
    /// does (`t = v + exp::ROUND_MAGIC`, `|k| < 2^22`), given `table[j] = bits(2^(j/8)) −
    /// (j << 20)` for `j < 8` (repeated to fill the vector): lane `i` is
    /// `bits(table[k_i mod 8]) + (bits(t_i) << 20)`, exact while the result is a normal f32
    /// (`k ≥ −1008`).
    unsafe fn exp2_k8(table: Self::V, t: Self::V) -> Self::V;
    /// `min(acc, v)` lane-wise, keeping `acc` where `v` is NaN.
    unsafe fn min_skip_nan(acc: Self::V, v: Self::V) -> Self::V;
    /// True when some lane of `v` is `< lo` (NaN lanes are not).
    unsafe fn any_lt(v: Self::V, lo: Self::V) -> bool;
    /// Lanes where `v < lo` (not NaN lanes).
    unsafe fn lt(v: Self::V, lo: Self::V) -> Self::M;

    /// Lanes `< k` set.
    unsafe fn first(k: usize) -> Self::M;
    /// Lanes where `keep[j]` is true; `p` valid for `LANES` reads.
    unsafe fn keep(p: *const bool) -> Self::M;
    /// Lanes `< k` where `keep[j]` is true, `k < LANES`; `p` valid for `k` reads only.
    unsafe fn keep_tail(p: *const bool, k: usize) -> Self::M;
    /// `m ? a : b` lane-wise.
    unsafe fn select(m: Self::M, a: Self::V, b: Self::V) -> Self::V;
}

/// The portable ISA: `wide::f32x8`, 8 lanes, no `unsafe` needed inside (the methods are
/// `unsafe` only to share the trait).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Portable;

mod portable {
    use super::{Isa, Portable, SimdF32, TWO_POW_M64};
    use wide::{f32x8, i32x8};

    /// `exp::ROUND_MAGIC.to_bits()` (1.5·2^23).
    const ROUND_MAGIC_BITS: i32 = 0x4B40_0000;

    fn to_i32(v: f32x8) -> i32x8 {
        wide::bytemuck::cast(v.to_bits())
    }
    fn from_i32(v: i32x8) -> f32x8 {
        f32x8::from_bits(wide::bytemuck::cast(v))
    }

    impl SimdF32 for Portable {
        const ISA: Isa = Isa::Portable;
        const LANES: usize = 8;
        const HAS_STREAM: bool = false;
        // wide fuses `mul_add` only when the build targets AVX and FMA.
        const FUSED: bool = cfg!(all(target_feature = "avx", target_feature = "fma"));
        type V = f32x8;
        type M = f32x8;

        #[inline(always)]
        unsafe fn splat(x: f32) -> f32x8 {
            f32x8::splat(x)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> f32x8 {
            // SAFETY: the caller guarantees 8 readable f32; `read_unaligned` has no alignment need.
            f32x8::new(unsafe { p.cast::<[f32; 8]>().read_unaligned() })
        }
        #[inline(always)]
        unsafe fn load_tail(p: *const f32, k: usize) -> f32x8 {
            debug_assert!(k < 8);
            let mut a = [0.0f32; 8];
            // SAFETY: the caller guarantees `k` readable f32 at `p`.
            a[..k].copy_from_slice(unsafe { std::slice::from_raw_parts(p, k) });
            f32x8::new(a)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: f32x8) {
            // SAFETY: the caller guarantees 8 writable f32.
            unsafe { p.cast::<[f32; 8]>().write_unaligned(v.to_array()) }
        }
        #[inline(always)]
        unsafe fn store_tail(p: *mut f32, k: usize, v: f32x8) {
            debug_assert!(k < 8);
            // SAFETY: the caller guarantees `k` writable f32 at `p`.
            unsafe { std::slice::from_raw_parts_mut(p, k) }.copy_from_slice(&v.to_array()[..k]);
        }
        #[inline(always)]
        unsafe fn stream(p: *mut f32, v: f32x8) {
            // SAFETY: forwarded contract.
            unsafe { Self::store(p, v) }
        }
        #[inline(always)]
        unsafe fn prefetch(_p: *const f32) {}
        #[inline(always)]
        unsafe fn prefetch_far(_p: *const f32) {}
        #[inline(always)]
        unsafe fn add(a: f32x8, b: f32x8) -> f32x8 {
            a + b
        }
        #[inline(always)]
        unsafe fn sub(a: f32x8, b: f32x8) -> f32x8 {
            a - b
        }
        #[inline(always)]
        unsafe fn mul(a: f32x8, b: f32x8) -> f32x8 {
            a * b
        }
        #[inline(always)]
        unsafe fn fmadd(a: f32x8, b: f32x8, c: f32x8) -> f32x8 {
            a.mul_add(b, c)
        }
        #[inline(always)]
        unsafe fn max_skip_nan(acc: f32x8, v: f32x8) -> f32x8 {
            // wide's `max` returns `self` where `rhs` is NaN, on every target.
            acc.max(v)
        }
        #[inline(always)]
        unsafe fn max_keep_nan(v: f32x8, lo: f32x8) -> f32x8 {
            // Ordered compares are false for NaN, so NaN lanes keep `v`.
            v.simd_lt(lo).select(lo, v)
        }
        #[inline(always)]
        unsafe fn clamp_keep_nan(v: f32x8, lo: f32x8, hi: f32x8) -> f32x8 {
            // Ordered compares are false for NaN, so NaN lanes keep `v`.
            let v = v.simd_lt(lo).select(lo, v);
            hi.simd_lt(v).select(hi, v)
        }
        #[inline(always)]
        unsafe fn reduce_max(v: f32x8) -> f32 {
            v.to_array().into_iter().fold(f32::NEG_INFINITY, f32::max)
        }
        #[inline(always)]
        unsafe fn reduce_min(v: f32x8) -> f32 {
            v.to_array().into_iter().fold(f32::INFINITY, f32::min)
        }
        #[inline(always)]
        unsafe fn reduce_add(v: f32x8) -> f32 {
            v.reduce_add()
        }
        #[inline(always)]
        unsafe fn ldexp(p: f32x8, _n: f32x8, t: f32x8) -> f32x8 {
            // n = bits(t) − bits(magic); split n = n1 + n2 with both halves in [−75, 64] so that
            // 2^n1 and 2^n2 are normal floats: p·2^n1 is exact and the second product rounds once.
            let n = to_i32(t) - i32x8::splat(ROUND_MAGIC_BITS);
            let n1 = n >> 1;
            let n2 = n - n1;
            let s1 = from_i32((n1 + i32x8::splat(127)) << 23);
            let s2 = from_i32((n2 + i32x8::splat(127)) << 23);
            (p * s1) * s2
        }
        #[inline(always)]
        unsafe fn ldexp_low(p: f32x8, _n: f32x8, t: f32x8) -> f32x8 {
            // bits(2^(n+64)) = (n + 127 + 64) << 23 with n = bits(t) − bits(magic).
            let s = from_i32((to_i32(t) + i32x8::splat(191 - ROUND_MAGIC_BITS)) << 23);
            (p * s) * f32x8::splat(TWO_POW_M64)
        }
        #[inline(always)]
        unsafe fn shl23(t: f32x8) -> f32x8 {
            from_i32(to_i32(t) << 23)
        }
        #[inline(always)]
        unsafe fn exp2_k8(table: f32x8, t: f32x8) -> f32x8 {
            let (tab, k) = (table.to_array(), to_i32(t).to_array());
            let looked = f32x8::new(k.map(|k| tab[(k & 7) as usize]));
            from_i32(to_i32(looked) + (to_i32(t) << 20))
        }
        #[inline(always)]
        unsafe fn min_skip_nan(acc: f32x8, v: f32x8) -> f32x8 {
            // Ordered compares are false for NaN, so NaN lanes keep `acc`.
            v.simd_lt(acc).select(v, acc)
        }
        #[inline(always)]
        unsafe fn any_lt(v: f32x8, lo: f32x8) -> bool {
            v.simd_lt(lo).any()
        }
        #[inline(always)]
        unsafe fn lt(v: f32x8, lo: f32x8) -> f32x8 {
            v.simd_lt(lo)
        }
        #[inline(always)]
        unsafe fn first(k: usize) -> f32x8 {
            let idx = f32x8::new([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
            idx.simd_lt(f32x8::splat(k as f32))
        }
        #[inline(always)]
        unsafe fn keep(p: *const bool) -> f32x8 {
            // SAFETY: the caller guarantees 8 readable bools.
            let k = unsafe { p.cast::<[bool; 8]>().read_unaligned() };
            f32x8::new(k.map(|b| if b { f32::from_bits(u32::MAX) } else { 0.0 }))
        }
        #[inline(always)]
        unsafe fn keep_tail(p: *const bool, k: usize) -> f32x8 {
            debug_assert!(k < 8);
            let mut a = [false; 8];
            // SAFETY: the caller guarantees `k` readable bools.
            a[..k].copy_from_slice(unsafe { std::slice::from_raw_parts(p, k) });
            f32x8::new(a.map(|b| if b { f32::from_bits(u32::MAX) } else { 0.0 }))
        }
        #[inline(always)]
        unsafe fn select(m: f32x8, a: f32x8, b: f32x8) -> f32x8 {
            m.select(a, b)
        }
    }
}

/// x86-64 AVX2 + FMA: `__m256`, 8 lanes; masks are all-ones float lanes.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Avx2, Isa, SimdF32, TWO_POW_M64};
    use std::arch::x86_64::*;

    /// `exp::ROUND_MAGIC.to_bits()` (1.5·2^23).
    const ROUND_MAGIC_BITS: i32 = 0x4B40_0000;

    #[inline(always)]
    unsafe fn tail_mask(k: usize) -> __m256i {
        debug_assert!(k <= 8);
        // SAFETY: AVX2 is available per the trait contract.
        unsafe {
            let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            _mm256_cmpgt_epi32(_mm256_set1_epi32(k as i32), idx)
        }
    }

    #[inline(always)]
    unsafe fn bools8(bits: u64) -> __m256 {
        // SAFETY: AVX2 is available per the trait contract.
        unsafe {
            let b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bits as i64));
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(b, _mm256_setzero_si256()))
        }
    }

    // SAFETY (all methods): the trait contract guarantees AVX2+FMA and valid pointers; each body
    // is one or a few intrinsics with the pointer requirements stated on the trait.
    impl SimdF32 for Avx2 {
        const ISA: Isa = Isa::Avx2;
        const LANES: usize = 8;
        const HAS_STREAM: bool = true;
        const FUSED: bool = true;
        type V = __m256;
        type M = __m256;

        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_tail(p: *const f32, k: usize) -> __m256 {
            // Masked-off lanes are neither read nor faulted on.
            unsafe { _mm256_maskload_ps(p, tail_mask(k)) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn store_tail(p: *mut f32, k: usize, v: __m256) {
            unsafe { _mm256_maskstore_ps(p, tail_mask(k), v) }
        }
        #[inline(always)]
        unsafe fn stream(p: *mut f32, v: __m256) {
            debug_assert!((p as usize).is_multiple_of(32));
            unsafe { _mm256_stream_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
        }
        #[inline(always)]
        unsafe fn prefetch_far(p: *const f32) {
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) }
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn sub(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_sub_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn max_skip_nan(acc: __m256, v: __m256) -> __m256 {
            // vmaxps returns its second operand when either is NaN.
            unsafe { _mm256_max_ps(v, acc) }
        }
        #[inline(always)]
        unsafe fn max_keep_nan(v: __m256, lo: __m256) -> __m256 {
            // Second operand on NaN.
            unsafe { _mm256_max_ps(lo, v) }
        }
        #[inline(always)]
        unsafe fn clamp_keep_nan(v: __m256, lo: __m256, hi: __m256) -> __m256 {
            // Second operand on NaN: a NaN `v` passes through both.
            unsafe { _mm256_min_ps(hi, _mm256_max_ps(lo, v)) }
        }
        #[inline(always)]
        unsafe fn reduce_max(v: __m256) -> f32 {
            unsafe {
                let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                let m = _mm_max_ss(m, _mm_movehdup_ps(m));
                _mm_cvtss_f32(m)
            }
        }
        #[inline(always)]
        unsafe fn reduce_min(v: __m256) -> f32 {
            unsafe {
                let m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
                let m = _mm_min_ss(m, _mm_movehdup_ps(m));
                _mm_cvtss_f32(m)
            }
        }
        #[inline(always)]
        unsafe fn reduce_add(v: __m256) -> f32 {
            unsafe {
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_movehdup_ps(s));
                _mm_cvtss_f32(s)
            }
        }
        #[inline(always)]
        unsafe fn ldexp(p: __m256, _n: __m256, t: __m256) -> __m256 {
            // Same split as the portable version: 2^n = 2^n1 · 2^n2, both normal.
            unsafe {
                let n =
                    _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(ROUND_MAGIC_BITS));
                let n1 = _mm256_srai_epi32(n, 1);
                let n2 = _mm256_sub_epi32(n, n1);
                let bias = _mm256_set1_epi32(127);
                let s1 = _mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23);
                let s2 = _mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23);
                _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(s1)), _mm256_castsi256_ps(s2))
            }
        }
        #[inline(always)]
        unsafe fn ldexp_low(p: __m256, _n: __m256, t: __m256) -> __m256 {
            // bits(2^(n+64)) = (n + 127 + 64) << 23 with n = bits(t) − bits(magic).
            unsafe {
                let b = _mm256_add_epi32(
                    _mm256_castps_si256(t),
                    _mm256_set1_epi32(191 - ROUND_MAGIC_BITS),
                );
                let s = _mm256_castsi256_ps(_mm256_slli_epi32(b, 23));
                _mm256_mul_ps(_mm256_mul_ps(p, s), _mm256_set1_ps(TWO_POW_M64))
            }
        }
        #[inline(always)]
        unsafe fn shl23(t: __m256) -> __m256 {
            unsafe { _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23)) }
        }
        #[inline(always)]
        unsafe fn exp2_k8(table: __m256, t: __m256) -> __m256 {
            // vpermps reads the low 3 bits of each index lane.
            unsafe {
                let t = _mm256_castps_si256(t);
                let looked = _mm256_castps_si256(_mm256_permutevar8x32_ps(table, t));
                _mm256_castsi256_ps(_mm256_add_epi32(looked, _mm256_slli_epi32(t, 20)))
            }
        }
        #[inline(always)]
        unsafe fn min_skip_nan(acc: __m256, v: __m256) -> __m256 {
            // vminps returns its second operand when either is NaN.
            unsafe { _mm256_min_ps(v, acc) }
        }
        #[inline(always)]
        unsafe fn any_lt(v: __m256, lo: __m256) -> bool {
            unsafe { _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(v, lo)) != 0 }
        }
        #[inline(always)]
        unsafe fn lt(v: __m256, lo: __m256) -> __m256 {
            unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(v, lo) }
        }
        #[inline(always)]
        unsafe fn first(k: usize) -> __m256 {
            unsafe { _mm256_castsi256_ps(tail_mask(k)) }
        }
        #[inline(always)]
        unsafe fn keep(p: *const bool) -> __m256 {
            unsafe { bools8(p.cast::<u64>().read_unaligned()) }
        }
        #[inline(always)]
        unsafe fn keep_tail(p: *const bool, k: usize) -> __m256 {
            debug_assert!(k < 8);
            let mut a = [0u8; 8];
            unsafe {
                std::ptr::copy_nonoverlapping(p.cast::<u8>(), a.as_mut_ptr(), k);
                bools8(u64::from_le_bytes(a))
            }
        }
        #[inline(always)]
        unsafe fn select(m: __m256, a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_blendv_ps(b, a, m) }
        }
    }
}

/// x86-64 AVX-512F: `__m512`, 16 lanes, `__mmask16` masks, `vscalefps` for `2^n`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Avx512, Isa, SimdF32};
    use std::arch::x86_64::*;

    #[inline(always)]
    fn tail(k: usize) -> __mmask16 {
        debug_assert!(k <= 16);
        ((1u32 << k) - 1) as __mmask16
    }

    #[inline(always)]
    unsafe fn bools16(b: __m128i) -> __mmask16 {
        // SAFETY: AVX-512F is available per the trait contract.
        unsafe {
            let w = _mm512_cvtepu8_epi32(b);
            _mm512_test_epi32_mask(w, w)
        }
    }

    // SAFETY (all methods): the trait contract guarantees AVX-512F and valid pointers; masked
    // loads and stores neither touch nor fault on masked-off lanes.
    impl SimdF32 for Avx512 {
        const ISA: Isa = Isa::Avx512;
        const LANES: usize = 16;
        const HAS_STREAM: bool = true;
        const FUSED: bool = true;
        type V = __m512;
        type M = __mmask16;

        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_tail(p: *const f32, k: usize) -> __m512 {
            unsafe { _mm512_maskz_loadu_ps(tail(k), p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn store_tail(p: *mut f32, k: usize, v: __m512) {
            unsafe { _mm512_mask_storeu_ps(p, tail(k), v) }
        }
        #[inline(always)]
        unsafe fn stream(p: *mut f32, v: __m512) {
            debug_assert!((p as usize).is_multiple_of(64));
            unsafe { _mm512_stream_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
        }
        #[inline(always)]
        unsafe fn prefetch_far(p: *const f32) {
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) }
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn sub(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_sub_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn mul(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn max_skip_nan(acc: __m512, v: __m512) -> __m512 {
            // vmaxps returns its second operand when either is NaN.
            unsafe { _mm512_max_ps(v, acc) }
        }
        #[inline(always)]
        unsafe fn max_keep_nan(v: __m512, lo: __m512) -> __m512 {
            // Second operand on NaN.
            unsafe { _mm512_max_ps(lo, v) }
        }
        #[inline(always)]
        unsafe fn clamp_keep_nan(v: __m512, lo: __m512, hi: __m512) -> __m512 {
            unsafe { _mm512_min_ps(hi, _mm512_max_ps(lo, v)) }
        }
        #[inline(always)]
        unsafe fn reduce_max(v: __m512) -> f32 {
            unsafe { _mm512_reduce_max_ps(v) }
        }
        #[inline(always)]
        unsafe fn reduce_min(v: __m512) -> f32 {
            unsafe { _mm512_reduce_min_ps(v) }
        }
        #[inline(always)]
        unsafe fn reduce_add(v: __m512) -> f32 {
            unsafe { _mm512_reduce_add_ps(v) }
        }
        #[inline(always)]
        unsafe fn ldexp(p: __m512, n: __m512, _t: __m512) -> __m512 {
            // vscalefps: p·2^floor(n) with a single rounding, overflow to ∞ and gradual
            // underflow included.
            unsafe { _mm512_scalef_ps(p, n) }
        }
        #[inline(always)]
        unsafe fn shl23(t: __m512) -> __m512 {
            unsafe { _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(t), 23)) }
        }
        #[inline(always)]
        unsafe fn exp2_k8(table: __m512, t: __m512) -> __m512 {
            // vpermps reads the low 4 bits of each index lane; the table repeats its 8 entries.
            unsafe {
                let t = _mm512_castps_si512(t);
                let looked = _mm512_castps_si512(_mm512_permutexvar_ps(t, table));
                _mm512_castsi512_ps(_mm512_add_epi32(looked, _mm512_slli_epi32(t, 20)))
            }
        }
        #[inline(always)]
        unsafe fn min_skip_nan(acc: __m512, v: __m512) -> __m512 {
            // vminps returns its second operand when either is NaN.
            unsafe { _mm512_min_ps(v, acc) }
        }
        #[inline(always)]
        unsafe fn any_lt(v: __m512, lo: __m512) -> bool {
            unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, lo) != 0 }
        }
        #[inline(always)]
        unsafe fn lt(v: __m512, lo: __m512) -> __mmask16 {
            unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, lo) }
        }
        #[inline(always)]
        unsafe fn first(k: usize) -> __mmask16 {
            tail(k)
        }
        #[inline(always)]
        unsafe fn keep(p: *const bool) -> __mmask16 {
            unsafe { bools16(_mm_loadu_si128(p.cast())) }
        }
        #[inline(always)]
        unsafe fn keep_tail(p: *const bool, k: usize) -> __mmask16 {
            debug_assert!(k < 16);
            let mut a = [0u8; 16];
            unsafe {
                std::ptr::copy_nonoverlapping(p.cast::<u8>(), a.as_mut_ptr(), k);
                bools16(_mm_loadu_si128(a.as_ptr().cast()))
            }
        }
        #[inline(always)]
        unsafe fn select(m: __mmask16, a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_mask_blend_ps(m, b, a) }
        }
    }
}
