//! The AVX-512F [`Simd`]: `__m512`, 16 lanes, 32 registers, `__mmask16` masks (masked tails),
//! `vscalefps` for `2^n`.

use std::arch::x86_64::*;
use std::mem::transmute;

use attn_core::dtype::{bf16, f16};

use super::simd::{Kernel, Simd};
use super::Isa;

/// AVX-512F token: a value exists only on a CPU that has AVX-512F.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512(());

impl Avx512 {
    /// Runs `k` compiled for AVX-512F (holding the token proves the CPU has it).
    #[inline]
    pub(crate) fn vectorize<K: Kernel>(self, k: K) -> K::Output {
        // SAFETY: the token exists only when the CPU supports AVX-512F.
        unsafe { self.vectorize_unchecked(k) }
    }

    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn vectorize_unchecked<K: Kernel>(self, k: K) -> K::Output {
        k.run(self)
    }

    /// Runs `k` compiled for AVX-512F and AVX512_BF16, so that [`Simd::dot_bf16`] inlines as
    /// `vdpbf16ps` ([`super::simd::vectorize_dot`]).
    ///
    /// # Safety
    /// The CPU must support AVX512_BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(crate) unsafe fn vectorize_bf16<K: Kernel>(self, k: K) -> K::Output {
        k.run(self)
    }
}

/// Lanes `< k` set (`k ≤ 16`).
#[inline(always)]
fn tail(k: usize) -> __mmask16 {
    debug_assert!(k <= 16);
    ((1u32 << k) - 1) as __mmask16
}

/// The mask of the 16 bools in the bytes of `b`.
#[inline(always)]
fn bools16(_s: Avx512, b: __m128i) -> __mmask16 {
    // SAFETY: AVX-512F (the token).
    unsafe {
        let w = _mm512_cvtepu8_epi32(b);
        _mm512_test_epi32_mask(w, w)
    }
}

/// Sets the quiet bit of the NaN lanes of `x` (f32 bits), leaving the other lanes alone.
#[inline(always)]
fn quiet_nans(_s: Avx512, x: __m512i) -> __m512i {
    // SAFETY: AVX-512F (the token).
    unsafe {
        let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
        let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
        _mm512_mask_or_epi32(x, nan, x, _mm512_set1_epi32(0x0040_0000))
    }
}

// SAFETY (every `unsafe` block below): a `self` token exists only on a CPU with AVX-512F; the
// pointer methods forward their callers' guarantees, and masked loads and stores neither touch
// nor fault on masked-off lanes.
impl Simd for Avx512 {
    const ISA: Isa = Isa::Avx512;
    const LANES: usize = 16;
    const REGISTERS: usize = 32;
    const HAS_STREAM: bool = true;
    const FUSED: bool = true;
    type V = __m512;
    type M = __mmask16;

    #[inline(always)]
    fn try_new() -> Option<Self> {
        Isa::Avx512.is_supported().then_some(Avx512(()))
    }
    #[inline(always)]
    unsafe fn new_unchecked() -> Self {
        debug_assert!(Isa::Avx512.is_supported());
        Avx512(())
    }

    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_tail(self, p: *const f32, k: usize) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_maskz_loadu_ps(tail(k), p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m512) {
        // SAFETY: see the impl.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn store_tail(self, p: *mut f32, k: usize, v: __m512) {
        // SAFETY: see the impl.
        unsafe { _mm512_mask_storeu_ps(p, tail(k), v) }
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut f32, v: __m512) {
        debug_assert!((p as usize).is_multiple_of(64));
        // SAFETY: see the impl; the caller guarantees the alignment.
        unsafe { _mm512_stream_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const bf16) -> __m512 {
        // SAFETY: see the impl.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            let x = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
            _mm512_castsi512_ps(quiet_nans(self, x))
        }
    }
    #[inline(always)]
    unsafe fn load_bf16_operand(self, p: *const bf16) -> __m512 {
        // SAFETY: see the impl.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const f16) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut bf16, v: __m512) {
        // `bf16_bits` lane-wise, then `vpmovdw` (truncating; the lanes are in [0, 0xFFFF]).
        // SAFETY: see the impl.
        unsafe {
            let x = _mm512_castps_si512(v);
            let hi = _mm512_srli_epi32::<16>(x);
            let lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
            let up = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb);
            let r = _mm512_srli_epi32::<16>(up);
            let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
            let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
            let r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
            _mm256_storeu_si256(p.cast(), _mm512_cvtepi32_epi16(r))
        }
    }
    #[inline(always)]
    unsafe fn store_f16(self, p: *mut f16, v: __m512) {
        // SAFETY: see the impl.
        unsafe {
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            _mm256_storeu_si256(p.cast(), h)
        }
    }
    #[inline(always)]
    unsafe fn load_i8(self, p: *const i8) -> __m512 {
        // SAFETY: see the impl (16 bytes read).
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn transpose(self, src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
        // SAFETY: see the impl; 16 rows of 16 floats read, 16 written.
        unsafe {
            // Plain loops, not `array::from_fn`: through a closure the shuffles would lose the
            // ISA's features.
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, x) in r.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(src.add(i * ss));
            }
            // Within each 128-bit lane: 32-bit, then 64-bit interleaves leave `u[4j + e]`
            // holding column `4L + e` of rows `4j..4j + 4` in lane `L`.
            let mut t = [_mm512_setzero_ps(); 16];
            for (x, y) in t.iter_mut().enumerate() {
                let (a, b) = (r[x & !1], r[x | 1]);
                *y = if x % 2 == 0 { _mm512_unpacklo_ps(a, b) } else { _mm512_unpackhi_ps(a, b) };
            }
            let mut u = [_mm512_setzero_ps(); 16];
            for (x, y) in u.iter_mut().enumerate() {
                let (j, e) = (x / 4, x % 4);
                let (a, b) = (t[4 * j + e / 2], t[4 * j + 2 + e / 2]);
                let (a, b) = (_mm512_castps_pd(a), _mm512_castps_pd(b));
                let w =
                    if e % 2 == 0 { _mm512_unpacklo_pd(a, b) } else { _mm512_unpackhi_pd(a, b) };
                *y = _mm512_castpd_ps(w);
            }
            // Then a 4 × 4 transpose of 128-bit lanes across `u[e], u[4 + e], u[8 + e],
            // u[12 + e]` gives output rows `4L + e`.
            for e in 0..4 {
                let v0 = _mm512_shuffle_f32x4::<0x44>(u[e], u[4 + e]);
                let v1 = _mm512_shuffle_f32x4::<0xEE>(u[e], u[4 + e]);
                let v2 = _mm512_shuffle_f32x4::<0x44>(u[8 + e], u[12 + e]);
                let v3 = _mm512_shuffle_f32x4::<0xEE>(u[8 + e], u[12 + e]);
                _mm512_storeu_ps(dst.add(e * ds), _mm512_shuffle_f32x4::<0x88>(v0, v2));
                _mm512_storeu_ps(dst.add((4 + e) * ds), _mm512_shuffle_f32x4::<0xDD>(v0, v2));
                _mm512_storeu_ps(dst.add((8 + e) * ds), _mm512_shuffle_f32x4::<0x88>(v1, v3));
                _mm512_storeu_ps(dst.add((12 + e) * ds), _mm512_shuffle_f32x4::<0xDD>(v1, v3));
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
    fn add(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn recip(self, d: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe {
            let r = _mm512_rcp14_ps(d);
            _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0)), r)
        }
    }
    #[inline(always)]
    fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn dot_bf16(self, acc: __m512, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller guarantees AVX512_BF16 (the trait's contract); the casts are bit
        // casts between 64-byte vectors with no invalid bit patterns.
        unsafe {
            let (a, b) = (transmute::<__m512, __m512bh>(a), transmute::<__m512, __m512bh>(b));
            _mm512_dpbf16_ps(acc, a, b)
        }
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn min(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_min_ps(a, b) }
    }
    #[inline(always)]
    fn max_skip_nan(self, acc: __m512, v: __m512) -> __m512 {
        // vmaxps returns its second operand when either is NaN.
        // SAFETY: see the impl.
        unsafe { _mm512_max_ps(v, acc) }
    }
    #[inline(always)]
    fn min_skip_nan(self, acc: __m512, v: __m512) -> __m512 {
        // vminps returns its second operand when either is NaN.
        // SAFETY: see the impl.
        unsafe { _mm512_min_ps(v, acc) }
    }
    #[inline(always)]
    fn max_keep_nan(self, v: __m512, lo: __m512) -> __m512 {
        // SAFETY: see the impl. Second operand on NaN.
        unsafe { _mm512_max_ps(lo, v) }
    }
    #[inline(always)]
    fn clamp_keep_nan(self, v: __m512, lo: __m512, hi: __m512) -> __m512 {
        // SAFETY: see the impl. Second operand on NaN: a NaN `v` passes through both.
        unsafe { _mm512_min_ps(hi, _mm512_max_ps(lo, v)) }
    }

    #[inline(always)]
    fn reduce_add(self, v: __m512) -> f32 {
        // SAFETY: see the impl.
        unsafe { _mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    fn reduce_add4(self, v: [__m512; 4]) -> [f32; 4] {
        let mut out = [0.0f32; 4];
        // SAFETY: see the impl; `out` holds the 4 floats stored.
        unsafe {
            // Within each 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], then [a, b, c, d] (the
            // lane's partial sums); adding the four lanes finishes the sums. 15 instructions
            // in three short chains, where four horizontal sums took 26 in four long ones.
            let (a, b, c, d) = (v[0], v[1], v[2], v[3]);
            let ab =
                _mm512_castps_pd(_mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b)));
            let cd =
                _mm512_castps_pd(_mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d)));
            let lo = _mm512_castpd_ps(_mm512_unpacklo_pd(ab, cd));
            let t = _mm512_add_ps(lo, _mm512_castpd_ps(_mm512_unpackhi_pd(ab, cd)));
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(t)));
            let h = _mm256_add_ps(_mm512_castps512_ps256(t), hi);
            let r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            _mm_storeu_ps(out.as_mut_ptr(), r);
        }
        out
    }
    #[inline(always)]
    fn reduce_max(self, v: __m512) -> f32 {
        // SAFETY: see the impl.
        unsafe { _mm512_reduce_max_ps(v) }
    }
    #[inline(always)]
    fn reduce_min(self, v: __m512) -> f32 {
        // SAFETY: see the impl.
        unsafe { _mm512_reduce_min_ps(v) }
    }

    #[inline(always)]
    fn ldexp(self, p: __m512, n: __m512, _t: __m512) -> __m512 {
        // vscalefps: p·2^floor(n) with a single rounding, overflow to ∞ and gradual underflow
        // included.
        // SAFETY: see the impl.
        unsafe { _mm512_scalef_ps(p, n) }
    }
    #[inline(always)]
    fn shl23(self, t: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_castps_si512(t))) }
    }
    #[inline(always)]
    fn exp2_k8(self, table: __m512, t: __m512) -> __m512 {
        // vpermps reads the low 4 bits of each index lane; the table repeats its 8 entries.
        // SAFETY: see the impl.
        unsafe {
            let t = _mm512_castps_si512(t);
            let looked = _mm512_castps_si512(_mm512_permutexvar_ps(t, table));
            _mm512_castsi512_ps(_mm512_add_epi32(looked, _mm512_slli_epi32::<20>(t)))
        }
    }

    #[inline(always)]
    fn any_lt(self, v: __m512, lo: __m512) -> bool {
        // SAFETY: see the impl.
        unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, lo) != 0 }
    }
    #[inline(always)]
    fn lt(self, v: __m512, lo: __m512) -> __mmask16 {
        // SAFETY: see the impl.
        unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, lo) }
    }
    #[inline(always)]
    fn nonzero(self, a: __m512) -> __mmask16 {
        // SAFETY: see the impl.
        unsafe { _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(a, _mm512_setzero_ps()) }
    }
    #[inline(always)]
    fn first(self, k: usize) -> __mmask16 {
        tail(k)
    }
    #[inline(always)]
    fn select(self, m: __mmask16, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_mask_blend_ps(m, b, a) }
    }
    #[inline(always)]
    fn fma_where(self, m: __mmask16, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_mask3_fmadd_ps(a, b, c, m) }
    }
    #[inline(always)]
    fn zero_unless(self, m: __mmask16, x: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_maskz_mov_ps(m, x) }
    }
    #[inline(always)]
    unsafe fn keep(self, p: *const bool) -> __mmask16 {
        // SAFETY: see the impl; the caller guarantees 16 readable bools (16 bytes).
        bools16(self, unsafe { _mm_loadu_si128(p.cast()) })
    }
    #[inline(always)]
    unsafe fn keep_tail(self, p: *const bool, k: usize) -> __mmask16 {
        debug_assert!(k < 16);
        let mut a = [0u8; 16];
        // SAFETY: the caller guarantees `k` readable bools; `a` holds 16 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(p.cast::<u8>(), a.as_mut_ptr(), k);
            bools16(self, _mm_loadu_si128(a.as_ptr().cast()))
        }
    }
}
