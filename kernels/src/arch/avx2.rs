//! The AVX2 + FMA (+ F16C) [`Simd`]: `__m256`, 8 lanes, 16 registers; masks are all-ones float
//! lanes.

use std::arch::x86_64::*;

use attn_core::dtype::{bf16, f16};

use super::simd::{Kernel, Simd, ROUND_MAGIC_BITS, TWO_POW_M64};
use super::Isa;

/// AVX2 + FMA + F16C token: a value exists only on a CPU that has all three (every AVX2 CPU has
/// F16C; it converts f16).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// Runs `k` compiled for AVX2 + FMA + F16C (holding the token proves the CPU has them).
    #[inline]
    pub(crate) fn vectorize<K: Kernel>(self, k: K) -> K::Output {
        // SAFETY: the token exists only when the CPU supports AVX2, FMA and F16C.
        unsafe { self.vectorize_unchecked(k) }
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn vectorize_unchecked<K: Kernel>(self, k: K) -> K::Output {
        k.run(self)
    }
}

/// Lanes `< k` all-ones (`k ≤ 8`).
#[inline(always)]
fn tail_mask(_s: Avx2, k: usize) -> __m256i {
    debug_assert!(k <= 8);
    // SAFETY: AVX2 (the token).
    unsafe {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(k as i32), idx)
    }
}

/// The mask of 8 bools packed in the bytes of `bits`.
#[inline(always)]
fn bools8(_s: Avx2, bits: u64) -> __m256 {
    // SAFETY: AVX2 (the token).
    unsafe {
        let b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bits as i64));
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(b, _mm256_setzero_si256()))
    }
}

/// Sets the quiet bit of the NaN lanes of `x` (f32 bits), leaving the other lanes alone.
#[inline(always)]
fn quiet_nans(_s: Avx2, x: __m256i) -> __m256i {
    // SAFETY: AVX2 (the token).
    unsafe {
        let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF_FFFF));
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80_0000));
        _mm256_or_si256(x, _mm256_and_si256(nan, _mm256_set1_epi32(0x0040_0000)))
    }
}

// SAFETY (every `unsafe` block below): a `self` token exists only on a CPU with AVX2, FMA and
// F16C;
// the pointer methods forward their callers' guarantees, and masked loads and stores neither
// touch nor fault on masked-off lanes.
impl Simd for Avx2 {
    const ISA: Isa = Isa::Avx2;
    const LANES: usize = 8;
    const REGISTERS: usize = 16;
    const HAS_STREAM: bool = true;
    const FUSED: bool = true;
    type V = __m256;
    type M = __m256;

    #[inline(always)]
    fn try_new() -> Option<Self> {
        Isa::Avx2.is_supported().then_some(Avx2(()))
    }
    #[inline(always)]
    unsafe fn new_unchecked() -> Self {
        debug_assert!(Isa::Avx2.is_supported());
        Avx2(())
    }

    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_tail(self, p: *const f32, k: usize) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_maskload_ps(p, tail_mask(self, k)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m256) {
        // SAFETY: see the impl.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn store_tail(self, p: *mut f32, k: usize, v: __m256) {
        // SAFETY: see the impl.
        unsafe { _mm256_maskstore_ps(p, tail_mask(self, k), v) }
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut f32, v: __m256) {
        debug_assert!((p as usize).is_multiple_of(32));
        // SAFETY: see the impl; the caller guarantees the alignment.
        unsafe { _mm256_stream_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const bf16) -> __m256 {
        // SAFETY: see the impl.
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            let x = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
            _mm256_castsi256_ps(quiet_nans(self, x))
        }
    }
    #[inline(always)]
    unsafe fn load_bf16_operand(self, p: *const bf16) -> __m256 {
        // SAFETY: see the impl.
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const f16) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut bf16, v: __m256) {
        // `bf16_bits` lane-wise; the lanes end in [0, 0xFFFF], so the saturating pack is exact.
        // SAFETY: see the impl.
        unsafe {
            let x = _mm256_castps_si256(v);
            let hi = _mm256_srli_epi32::<16>(x);
            let lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
            let up = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
            let r = _mm256_srli_epi32::<16>(up);
            let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF_FFFF));
            let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80_0000));
            let q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
            let r = _mm256_blendv_epi8(r, q, nan);
            let h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256::<1>(r));
            _mm_storeu_si128(p.cast(), h)
        }
    }
    #[inline(always)]
    unsafe fn store_f16(self, p: *mut f16, v: __m256) {
        // SAFETY: see the impl.
        unsafe { _mm_storeu_si128(p.cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)) }
    }
    #[inline(always)]
    unsafe fn load_i8(self, p: *const i8) -> __m256 {
        // SAFETY: see the impl (8 bytes read).
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn transpose(self, src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
        // SAFETY: see the impl; 8 rows of 8 floats read, 8 written.
        unsafe {
            // Plain loops, not `array::from_fn`: through a closure the shuffles would lose the
            // ISA's features.
            let mut r = [_mm256_setzero_ps(); 8];
            for (i, x) in r.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(src.add(i * ss));
            }
            // Within each 128-bit lane: 32-bit, then 64-bit interleaves leave `u[4j + e]`
            // holding column `4L + e` of rows `4j..4j + 4` in lane `L`.
            let mut t = [_mm256_setzero_ps(); 8];
            for (x, y) in t.iter_mut().enumerate() {
                let (a, b) = (r[x & !1], r[x | 1]);
                *y = if x % 2 == 0 { _mm256_unpacklo_ps(a, b) } else { _mm256_unpackhi_ps(a, b) };
            }
            let mut u = [_mm256_setzero_ps(); 8];
            for (x, y) in u.iter_mut().enumerate() {
                let (j, e) = (x / 4, x % 4);
                let (a, b) = (t[4 * j + e / 2], t[4 * j + 2 + e / 2]);
                let (a, b) = (_mm256_castps_pd(a), _mm256_castps_pd(b));
                let w =
                    if e % 2 == 0 { _mm256_unpacklo_pd(a, b) } else { _mm256_unpackhi_pd(a, b) };
                *y = _mm256_castpd_ps(w);
            }
            for e in 0..4 {
                let (lo, hi) = (u[e], u[4 + e]);
                _mm256_storeu_ps(dst.add(e * ds), _mm256_permute2f128_ps::<0x20>(lo, hi));
                _mm256_storeu_ps(dst.add((4 + e) * ds), _mm256_permute2f128_ps::<0x31>(lo, hi));
            }
        }
    }
    #[inline(always)]
    fn prefetch(self, p: *const f32) {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[inline(always)]
    fn prefetch_far(self, p: *const f32) {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) }
    }

    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn recip(self, d: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe {
            let r = _mm256_rcp_ps(d);
            _mm256_fmadd_ps(r, _mm256_fnmadd_ps(d, r, _mm256_set1_ps(1.0)), r)
        }
    }
    #[inline(always)]
    fn fma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn max(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    fn min(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_min_ps(a, b) }
    }
    #[inline(always)]
    fn max_skip_nan(self, acc: __m256, v: __m256) -> __m256 {
        // vmaxps returns its second operand when either is NaN.
        // SAFETY: see the impl.
        unsafe { _mm256_max_ps(v, acc) }
    }
    #[inline(always)]
    fn min_skip_nan(self, acc: __m256, v: __m256) -> __m256 {
        // vminps returns its second operand when either is NaN.
        // SAFETY: see the impl.
        unsafe { _mm256_min_ps(v, acc) }
    }
    #[inline(always)]
    fn max_keep_nan(self, v: __m256, lo: __m256) -> __m256 {
        // SAFETY: see the impl. Second operand on NaN.
        unsafe { _mm256_max_ps(lo, v) }
    }
    #[inline(always)]
    fn clamp_keep_nan(self, v: __m256, lo: __m256, hi: __m256) -> __m256 {
        // SAFETY: see the impl. Second operand on NaN: a NaN `v` passes through both.
        unsafe { _mm256_min_ps(hi, _mm256_max_ps(lo, v)) }
    }

    #[inline(always)]
    fn reduce_add(self, v: __m256) -> f32 {
        // SAFETY: see the impl.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    fn reduce_add4(self, v: [__m256; 4]) -> [f32; 4] {
        let mut out = [0.0f32; 4];
        // SAFETY: see the impl; `out` holds the 4 floats stored.
        unsafe {
            // Within each 128-bit half: [a01, a23, b01, b23], then [a0123, b0123, c0123,
            // d0123]; adding the two halves finishes the four sums.
            let ab = _mm256_hadd_ps(v[0], v[1]);
            let cd = _mm256_hadd_ps(v[2], v[3]);
            let t = _mm256_hadd_ps(ab, cd);
            let r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
            _mm_storeu_ps(out.as_mut_ptr(), r);
        }
        out
    }
    #[inline(always)]
    fn reduce_max(self, v: __m256) -> f32 {
        // SAFETY: see the impl.
        unsafe {
            let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_movehdup_ps(m));
            _mm_cvtss_f32(m)
        }
    }
    #[inline(always)]
    fn reduce_min(self, v: __m256) -> f32 {
        // SAFETY: see the impl.
        unsafe {
            let m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_min_ss(m, _mm_movehdup_ps(m));
            _mm_cvtss_f32(m)
        }
    }

    #[inline(always)]
    fn ldexp(self, p: __m256, _n: __m256, t: __m256) -> __m256 {
        // 2^n = 2^n1 · 2^n2 with n1 = ⌊n/2⌋, both normal: the first product is exact.
        // SAFETY: see the impl.
        unsafe {
            let n = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(ROUND_MAGIC_BITS));
            let n1 = _mm256_srai_epi32::<1>(n);
            let n2 = _mm256_sub_epi32(n, n1);
            let bias = _mm256_set1_epi32(127);
            let s1 = _mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias));
            let s2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias));
            _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(s1)), _mm256_castsi256_ps(s2))
        }
    }
    #[inline(always)]
    fn ldexp_low(self, p: __m256, _n: __m256, t: __m256) -> __m256 {
        // bits(2^(n+64)) = (n + 127 + 64) << 23 with n = bits(t) − bits(magic).
        // SAFETY: see the impl.
        unsafe {
            let b =
                _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(191 - ROUND_MAGIC_BITS));
            let s = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(b));
            _mm256_mul_ps(_mm256_mul_ps(p, s), _mm256_set1_ps(TWO_POW_M64))
        }
    }
    #[inline(always)]
    fn shl23(self, t: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_castps_si256(t))) }
    }
    #[inline(always)]
    fn exp2_k8(self, table: __m256, t: __m256) -> __m256 {
        // vpermps reads the low 3 bits of each index lane.
        // SAFETY: see the impl.
        unsafe {
            let t = _mm256_castps_si256(t);
            let looked = _mm256_castps_si256(_mm256_permutevar8x32_ps(table, t));
            _mm256_castsi256_ps(_mm256_add_epi32(looked, _mm256_slli_epi32::<20>(t)))
        }
    }

    #[inline(always)]
    fn any_lt(self, v: __m256, lo: __m256) -> bool {
        // SAFETY: see the impl.
        unsafe { _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(v, lo)) != 0 }
    }
    #[inline(always)]
    fn lt(self, v: __m256, lo: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(v, lo) }
    }
    #[inline(always)]
    fn nonzero(self, a: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_cmp_ps::<_CMP_NEQ_UQ>(a, _mm256_setzero_ps()) }
    }
    #[inline(always)]
    fn first(self, k: usize) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_castsi256_ps(tail_mask(self, k)) }
    }
    #[inline(always)]
    fn select(self, m: __m256, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_blendv_ps(b, a, m) }
    }
    #[inline(always)]
    fn fma_where(self, m: __m256, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_blendv_ps(c, _mm256_fmadd_ps(a, b, c), m) }
    }
    #[inline(always)]
    fn zero_unless(self, m: __m256, x: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_and_ps(x, m) }
    }
    #[inline(always)]
    unsafe fn keep(self, p: *const bool) -> __m256 {
        // SAFETY: see the impl; the caller guarantees 8 readable bools (8 bytes).
        bools8(self, unsafe { p.cast::<u64>().read_unaligned() })
    }
    #[inline(always)]
    unsafe fn keep_tail(self, p: *const bool, k: usize) -> __m256 {
        debug_assert!(k < 8);
        let mut a = [0u8; 8];
        // SAFETY: the caller guarantees `k` readable bools; `a` holds 8 bytes.
        unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), a.as_mut_ptr(), k) };
        bools8(self, u64::from_le_bytes(a))
    }
}
