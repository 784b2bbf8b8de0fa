//! The portable [`Simd`]: `wide::f32x8`, 8 lanes, whatever the build target compiles it to
//! (a pair of SSE registers on the x86-64 baseline). No `unsafe` beyond the raw-pointer
//! methods the trait shares with the other ISAs.

use attn_core::dtype::{bf16, f16};
use wide::{f32x8, i32x8};

use super::convert::bf16_bits;
use super::simd::{Simd, ROUND_MAGIC_BITS, TWO_POW_M64};
use super::Isa;

/// Portable vectors on `wide::f32x8`; runs on every target.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Portable;

#[inline(always)]
fn to_i32(v: f32x8) -> i32x8 {
    wide::bytemuck::cast(v.to_bits())
}

#[inline(always)]
fn from_i32(v: i32x8) -> f32x8 {
    f32x8::from_bits(wide::bytemuck::cast(v))
}

/// All-ones lanes where `b`, else zero: a mask in `f32x8` form.
#[inline(always)]
fn mask_of(b: [bool; 8]) -> f32x8 {
    f32x8::new(b.map(|b| if b { f32::from_bits(u32::MAX) } else { 0.0 }))
}

impl Simd for Portable {
    const ISA: Isa = Isa::Portable;
    const LANES: usize = 8;
    const REGISTERS: usize = 16;
    const HAS_STREAM: bool = false;
    // wide fuses `mul_add` only when the build targets AVX and FMA.
    const FUSED: bool = cfg!(all(target_feature = "avx", target_feature = "fma"));
    type V = f32x8;
    type M = f32x8;

    #[inline(always)]
    fn try_new() -> Option<Self> {
        Some(Portable)
    }
    #[inline(always)]
    unsafe fn new_unchecked() -> Self {
        Portable
    }

    #[inline(always)]
    fn splat(self, x: f32) -> f32x8 {
        f32x8::splat(x)
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> f32x8 {
        // SAFETY: the caller guarantees 8 readable f32; `read_unaligned` has no alignment need.
        f32x8::new(unsafe { p.cast::<[f32; 8]>().read_unaligned() })
    }
    #[inline(always)]
    unsafe fn load_tail(self, p: *const f32, k: usize) -> f32x8 {
        debug_assert!(k < 8);
        let mut a = [0.0f32; 8];
        // SAFETY: the caller guarantees `k` readable f32 at `p`.
        a[..k].copy_from_slice(unsafe { std::slice::from_raw_parts(p, k) });
        f32x8::new(a)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: f32x8) {
        // SAFETY: the caller guarantees 8 writable f32.
        unsafe { p.cast::<[f32; 8]>().write_unaligned(v.to_array()) }
    }
    #[inline(always)]
    unsafe fn store_tail(self, p: *mut f32, k: usize, v: f32x8) {
        debug_assert!(k < 8);
        // SAFETY: the caller guarantees `k` writable f32 at `p`.
        unsafe { std::slice::from_raw_parts_mut(p, k) }.copy_from_slice(&v.to_array()[..k]);
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut f32, v: f32x8) {
        // SAFETY: forwarded contract (an ordinary store here).
        unsafe { self.store(p, v) }
    }
    // The half-precision conversions are `half`'s own lane by lane (bf16 narrowing as its bit
    // formula `bf16_bits`, which the compiler vectorises): the bits every ISA is tested against.
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const bf16) -> f32x8 {
        // SAFETY: the caller guarantees 8 readable bf16.
        f32x8::new(unsafe { p.cast::<[bf16; 8]>().read_unaligned() }.map(bf16::to_f32))
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const f16) -> f32x8 {
        // SAFETY: the caller guarantees 8 readable f16.
        f32x8::new(unsafe { p.cast::<[f16; 8]>().read_unaligned() }.map(f16::to_f32))
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut bf16, v: f32x8) {
        let b = v.to_array().map(|x| bf16::from_bits(bf16_bits(x.to_bits())));
        // SAFETY: the caller guarantees 8 writable bf16.
        unsafe { p.cast::<[bf16; 8]>().write_unaligned(b) }
    }
    #[inline(always)]
    unsafe fn store_f16(self, p: *mut f16, v: f32x8) {
        // SAFETY: the caller guarantees 8 writable f16.
        unsafe { p.cast::<[f16; 8]>().write_unaligned(v.to_array().map(f16::from_f32)) }
    }
    #[inline(always)]
    unsafe fn load_i8(self, p: *const i8) -> f32x8 {
        // SAFETY: the caller guarantees 8 readable i8.
        f32x8::new(unsafe { p.cast::<[i8; 8]>().read_unaligned() }.map(f32::from))
    }
    #[inline(always)]
    fn prefetch(self, _p: *const f32) {}
    #[inline(always)]
    fn prefetch_far(self, _p: *const f32) {}

    #[inline(always)]
    fn add(self, a: f32x8, b: f32x8) -> f32x8 {
        a + b
    }
    #[inline(always)]
    fn sub(self, a: f32x8, b: f32x8) -> f32x8 {
        a - b
    }
    #[inline(always)]
    fn mul(self, a: f32x8, b: f32x8) -> f32x8 {
        a * b
    }
    #[inline(always)]
    fn div(self, a: f32x8, b: f32x8) -> f32x8 {
        a / b
    }
    #[inline(always)]
    fn recip(self, d: f32x8) -> f32x8 {
        f32x8::splat(1.0) / d
    }
    #[inline(always)]
    fn fma(self, a: f32x8, b: f32x8, c: f32x8) -> f32x8 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    fn max(self, a: f32x8, b: f32x8) -> f32x8 {
        // wide's max ignores NaN; keep the x86 rule (NaN in either lane → b).
        let nan = a.is_nan() | b.is_nan();
        nan.select(b, a.max(b))
    }
    #[inline(always)]
    fn min(self, a: f32x8, b: f32x8) -> f32x8 {
        a.min(b)
    }
    #[inline(always)]
    fn max_skip_nan(self, acc: f32x8, v: f32x8) -> f32x8 {
        // wide's `max` returns `self` where `rhs` is NaN, on every target.
        acc.max(v)
    }
    #[inline(always)]
    fn min_skip_nan(self, acc: f32x8, v: f32x8) -> f32x8 {
        // Ordered compares are false for NaN, so NaN lanes keep `acc`.
        v.simd_lt(acc).select(v, acc)
    }
    #[inline(always)]
    fn max_keep_nan(self, v: f32x8, lo: f32x8) -> f32x8 {
        // Ordered compares are false for NaN, so NaN lanes keep `v`.
        v.simd_lt(lo).select(lo, v)
    }
    #[inline(always)]
    fn clamp_keep_nan(self, v: f32x8, lo: f32x8, hi: f32x8) -> f32x8 {
        // Ordered compares are false for NaN, so NaN lanes keep `v`.
        let v = v.simd_lt(lo).select(lo, v);
        hi.simd_lt(v).select(hi, v)
    }

    #[inline(always)]
    fn reduce_add(self, v: f32x8) -> f32 {
        v.reduce_add()
    }
    #[inline(always)]
    fn reduce_add4(self, v: [f32x8; 4]) -> [f32; 4] {
        v.map(|x| x.reduce_add())
    }
    #[inline(always)]
    fn reduce_max(self, v: f32x8) -> f32 {
        v.to_array().into_iter().fold(f32::NEG_INFINITY, f32::max)
    }
    #[inline(always)]
    fn reduce_min(self, v: f32x8) -> f32 {
        v.to_array().into_iter().fold(f32::INFINITY, f32::min)
    }

    #[inline(always)]
    fn ldexp(self, p: f32x8, _n: f32x8, t: f32x8) -> f32x8 {
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
    fn ldexp_low(self, p: f32x8, _n: f32x8, t: f32x8) -> f32x8 {
        // bits(2^(n+64)) = (n + 127 + 64) << 23 with n = bits(t) − bits(magic).
        let s = from_i32((to_i32(t) + i32x8::splat(191 - ROUND_MAGIC_BITS)) << 23);
        (p * s) * f32x8::splat(TWO_POW_M64)
    }
    #[inline(always)]
    fn shl23(self, t: f32x8) -> f32x8 {
        from_i32(to_i32(t) << 23)
    }
    #[inline(always)]
    fn exp2_k8(self, table: f32x8, t: f32x8) -> f32x8 {
        let (tab, k) = (table.to_array(), to_i32(t).to_array());
        let looked = f32x8::new(k.map(|k| tab[(k & 7) as usize]));
        from_i32(to_i32(looked) + (to_i32(t) << 20))
    }

    #[inline(always)]
    fn any_lt(self, v: f32x8, lo: f32x8) -> bool {
        v.simd_lt(lo).any()
    }
    #[inline(always)]
    fn lt(self, v: f32x8, lo: f32x8) -> f32x8 {
        v.simd_lt(lo)
    }
    #[inline(always)]
    fn nonzero(self, a: f32x8) -> f32x8 {
        a.simd_ne(f32x8::ZERO)
    }
    #[inline(always)]
    fn first(self, k: usize) -> f32x8 {
        let idx = f32x8::new([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        idx.simd_lt(f32x8::splat(k as f32))
    }
    #[inline(always)]
    fn select(self, m: f32x8, a: f32x8, b: f32x8) -> f32x8 {
        m.select(a, b)
    }
    #[inline(always)]
    fn fma_where(self, m: f32x8, a: f32x8, b: f32x8, c: f32x8) -> f32x8 {
        m.select(a.mul_add(b, c), c)
    }
    #[inline(always)]
    fn zero_unless(self, m: f32x8, x: f32x8) -> f32x8 {
        x & m
    }
    #[inline(always)]
    unsafe fn keep(self, p: *const bool) -> f32x8 {
        // SAFETY: the caller guarantees 8 readable bools.
        mask_of(unsafe { p.cast::<[bool; 8]>().read_unaligned() })
    }
    #[inline(always)]
    unsafe fn keep_tail(self, p: *const bool, k: usize) -> f32x8 {
        debug_assert!(k < 8);
        let mut a = [false; 8];
        // SAFETY: the caller guarantees `k` readable bools.
        a[..k].copy_from_slice(unsafe { std::slice::from_raw_parts(p, k) });
        mask_of(a)
    }
}
