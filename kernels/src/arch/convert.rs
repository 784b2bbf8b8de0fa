//! Conversions between f32 and the half-precision element types (`bf16`, `f16`), vectorised on
//! every ISA through [`Simd`]'s four conversion methods, and the slice entry points
//! [`convert_slice`] / [`convert_slice_with_isa`].
//!
//! The contract, the same bits on every ISA and the same as `half`'s scalar conversions:
//! - widening (bf16 → f32 by a 16-bit shift, f16 → f32 by F16C / AVX-512 `vcvtph2ps`) is exact;
//!   a NaN keeps its sign and payload and gets its quiet bit set;
//! - narrowing rounds to nearest, ties to even, keeps subnormals, overflows to `±∞`
//!   (bf16: from `0x7F7F_8000` up, i.e. above the largest bf16 by half an ULP; f16: from
//!   65520); a NaN keeps its sign and the top bits of its payload and becomes quiet
//!   ([`bf16_bits`], and for f16 `sign | 0x7E00 | (mantissa >> 13)`).
//!
//! bf16 is narrowed with integer arithmetic, not `vcvtneps2bf16` (AVX512_BF16), which flushes
//! subnormal inputs to zero; f16 by `vcvtps2ph` with an explicit round-to-nearest-even
//! immediate, so MXCSR's rounding mode does not enter. Kernels reading half-precision operands
//! use [`SimdElement`] to load and store vectors of any element type.

use attn_core::dtype::{bf16, f16, Element};
use attn_core::{Error, Result};

use super::simd::{vectorize, Kernel, Simd, MAX_LANES};
use super::Isa;

/// `half`'s `bf16::from_f32` as bit arithmetic, the formula every vector ISA implements
/// lane-wise: for a non-NaN `x`, `(x + 0x7FFF + ((x >> 16) & 1)) >> 16` (add just under half an
/// ULP, plus one when the kept LSB is odd, so a tie goes to even; carries ripple into the
/// exponent, which turns the largest values into `±∞`); for a NaN, `(x >> 16) | 0x40`.
#[inline]
pub const fn bf16_bits(x: u32) -> u16 {
    if x & 0x7FFF_FFFF > 0x7F80_0000 {
        ((x >> 16) | 0x40) as u16
    } else {
        // No overflow: the largest non-NaN pattern, 0xFF80_0000, stays below 2^32.
        ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) as u16
    }
}

/// `half`'s `f16::to_f32` as branch-light integer arithmetic (which the compiler can
/// vectorise in packing loops): normal values rebias the exponent (`+ 112 << 23`), subnormals
/// are `m · 2⁻²⁴` (an exact product with a normal result, so FTZ/DAZ cannot touch it), `±∞`
/// and NaN keep all exponent bits, a NaN its payload with the quiet bit set.
#[inline(always)]
pub(crate) fn f16_to_f32(h: f16) -> f32 {
    let x = u32::from(h.to_bits());
    let sign = (x & 0x8000) << 16;
    let em = x & 0x7FFF;
    let bits = if em >= 0x7C00 {
        let quiet = if em > 0x7C00 { 0x0040_0000 } else { 0 };
        0x7F80_0000 | ((em & 0x3FF) << 13) | quiet
    } else if em >= 0x0400 {
        (em << 13) + (112 << 23)
    } else {
        (em as f32 * (1.0 / 16_777_216.0)).to_bits()
    };
    f32::from_bits(sign | bits)
}

/// An element type the vector kernels can load into and store from f32 vectors: `f32`, `bf16`,
/// `f16`. The raw-pointer methods forward to [`Simd`]; tails of the half types go through a
/// stack buffer of [`MAX_LANES`] elements (a tail is at most once per row).
pub(crate) trait SimdElement: Element {
    /// The exact f32 value, the bits of [`Element::to_f32`], by inlined bit arithmetic (for
    /// f16, `half`'s `to_f32` detects F16C and calls out per element): for scalar loops such as
    /// the GEMM's packing.
    fn widen(self) -> f32;
    /// The bits of the value rounded to bf16 ([`bf16_bits`]; exact, the bits themselves, for
    /// bf16): what the `vdpbf16ps` GEMM packs, which runs on bf16 operands only.
    fn bf16_bits(self) -> u16 {
        bf16_bits(self.widen().to_bits())
    }
    /// The slice itself when the type is f32 (so a kernel can read it in place), else `None`.
    fn as_f32(x: &[Self]) -> Option<&[f32]> {
        let _ = x;
        None
    }
    /// The mutable slice itself when the type is f32 (so a kernel can write it in place), else
    /// `None`.
    fn as_f32_mut(x: &mut [Self]) -> Option<&mut [f32]> {
        let _ = x;
        None
    }
    /// `LANES` elements widened to f32.
    ///
    /// # Safety
    /// `p` valid for reading `LANES` elements.
    unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::V;
    /// [`load`](Self::load) for an operand of arithmetic only: a NaN may keep its signalling
    /// bit ([`Simd::load_bf16_operand`]), which the arithmetic reading it does not see.
    ///
    /// # Safety
    /// `p` valid for reading `LANES` elements.
    #[inline(always)]
    unsafe fn load_operand<S: Simd>(s: S, p: *const Self) -> S::V {
        // SAFETY: forwarded.
        unsafe { Self::load(s, p) }
    }
    /// `k < LANES` elements widened to f32; the other lanes are 0.0 and nothing past `k` is read.
    ///
    /// # Safety
    /// `p` valid for reading `k` elements.
    unsafe fn load_tail<S: Simd>(s: S, p: *const Self, k: usize) -> S::V;
    /// `LANES` f32 narrowed to this type and stored.
    ///
    /// # Safety
    /// `p` valid for writing `LANES` elements.
    unsafe fn store<S: Simd>(s: S, p: *mut Self, v: S::V);
    /// The first `k < LANES` lanes narrowed and stored; nothing else is touched.
    ///
    /// # Safety
    /// `p` valid for writing `k` elements.
    unsafe fn store_tail<S: Simd>(s: S, p: *mut Self, k: usize, v: S::V);
}

impl SimdElement for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn as_f32(x: &[f32]) -> Option<&[f32]> {
        Some(x)
    }
    #[inline(always)]
    fn as_f32_mut(x: &mut [f32]) -> Option<&mut [f32]> {
        Some(x)
    }
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const f32) -> S::V {
        // SAFETY: forwarded.
        unsafe { s.load(p) }
    }
    #[inline(always)]
    unsafe fn load_tail<S: Simd>(s: S, p: *const f32, k: usize) -> S::V {
        // SAFETY: forwarded.
        unsafe { s.load_tail(p, k) }
    }
    #[inline(always)]
    unsafe fn store<S: Simd>(s: S, p: *mut f32, v: S::V) {
        // SAFETY: forwarded.
        unsafe { s.store(p, v) }
    }
    #[inline(always)]
    unsafe fn store_tail<S: Simd>(s: S, p: *mut f32, k: usize, v: S::V) {
        // SAFETY: forwarded.
        unsafe { s.store_tail(p, k, v) }
    }
}

/// [`SimdElement`] for a half type whose full-vector conversions are the [`Simd`] methods
/// `$load` and `$store` (`$operand` for an arithmetic operand), whose scalar widening is
/// `$widen` and bf16 bits `$bf16_bits`; the tails go through a stack buffer.
macro_rules! half_element {
    ($t:ty, $load:ident, $operand:ident, $store:ident, $widen:path, $bf16_bits:expr) => {
        impl SimdElement for $t {
            #[inline(always)]
            fn widen(self) -> f32 {
                $widen(self)
            }
            #[inline(always)]
            fn bf16_bits(self) -> u16 {
                $bf16_bits(self)
            }
            #[inline(always)]
            unsafe fn load<S: Simd>(s: S, p: *const $t) -> S::V {
                // SAFETY: forwarded.
                unsafe { s.$load(p) }
            }
            #[inline(always)]
            unsafe fn load_operand<S: Simd>(s: S, p: *const $t) -> S::V {
                // SAFETY: forwarded.
                unsafe { s.$operand(p) }
            }
            #[inline(always)]
            unsafe fn load_tail<S: Simd>(s: S, p: *const $t, k: usize) -> S::V {
                assert!(S::LANES <= MAX_LANES);
                debug_assert!(k < S::LANES);
                let mut buf = [<$t>::ZERO; MAX_LANES];
                // SAFETY: `k` readable elements at `p` (the caller), `k < LANES ≤ MAX_LANES`
                // writable in `buf`, which then holds `LANES` readable elements.
                unsafe {
                    std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), k);
                    s.$load(buf.as_ptr())
                }
            }
            #[inline(always)]
            unsafe fn store<S: Simd>(s: S, p: *mut $t, v: S::V) {
                // SAFETY: forwarded.
                unsafe { s.$store(p, v) }
            }
            #[inline(always)]
            unsafe fn store_tail<S: Simd>(s: S, p: *mut $t, k: usize, v: S::V) {
                assert!(S::LANES <= MAX_LANES);
                debug_assert!(k < S::LANES);
                let mut buf = [<$t>::ZERO; MAX_LANES];
                // SAFETY: `buf` has `LANES ≤ MAX_LANES` writable elements; `k` of them are
                // copied to `p`, which the caller guarantees writable.
                unsafe {
                    s.$store(buf.as_mut_ptr(), v);
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), p, k);
                }
            }
        }
    };
}

half_element!(bf16, load_bf16, load_bf16_operand, store_bf16, bf16::to_f32_const, bf16::to_bits);
half_element!(f16, load_f16, load_f16, store_f16, f16_to_f32, |h: f16| {
    bf16_bits(f16_to_f32(h).to_bits())
});

/// `LANES` elements from the start of `x` widened to f32 (panics if `x` has fewer).
#[inline(always)]
pub(crate) fn load_elems<S: Simd, T: SimdElement>(s: S, x: &[T]) -> S::V {
    let x = &x[..S::LANES];
    // SAFETY: `x` has exactly LANES elements.
    unsafe { T::load(s, x.as_ptr()) }
}

/// [`load_elems`] for an operand of arithmetic only ([`SimdElement::load_operand`]).
#[inline(always)]
pub(crate) fn load_operands<S: Simd, T: SimdElement>(s: S, x: &[T]) -> S::V {
    let x = &x[..S::LANES];
    // SAFETY: `x` has exactly LANES elements.
    unsafe { T::load_operand(s, x.as_ptr()) }
}

/// The `x.len() < LANES` elements of `x` widened to f32; the other lanes are 0.0.
#[inline(always)]
pub(crate) fn load_elems_tail<S: Simd, T: SimdElement>(s: S, x: &[T]) -> S::V {
    assert!(x.len() < S::LANES);
    // SAFETY: `x` has `x.len()` readable elements.
    unsafe { T::load_tail(s, x.as_ptr(), x.len()) }
}

/// `v` narrowed to `T` into the first `LANES` elements of `x` (panics if `x` has fewer).
#[inline(always)]
pub(crate) fn store_elems<S: Simd, T: SimdElement>(s: S, x: &mut [T], v: S::V) {
    let x = &mut x[..S::LANES];
    // SAFETY: `x` has exactly LANES elements.
    unsafe { T::store(s, x.as_mut_ptr(), v) }
}

/// The first `x.len() < LANES` lanes of `v` narrowed to `T` into `x`.
#[inline(always)]
pub(crate) fn store_elems_tail<S: Simd, T: SimdElement>(s: S, x: &mut [T], v: S::V) {
    assert!(x.len() < S::LANES);
    // SAFETY: `x` has `x.len()` writable elements.
    unsafe { T::store_tail(s, x.as_mut_ptr(), x.len(), v) }
}

/// A value type [`convert_slice`] reads or writes: `f32`, `bf16` or `f16` (implemented exactly
/// for the element types the vector layer converts; sealed by the private trait it extends).
#[allow(private_bounds)]
pub trait Convertible: SimdElement {}
impl Convertible for f32 {}
impl Convertible for bf16 {}
impl Convertible for f16 {}

/// `dst[i] = src[i]` converted, through f32, with the ISA [`selected`](super::selected) returns:
/// exact when widening, rounded to nearest even when narrowing (the module docs give every
/// special case; the bits are `half`'s). bf16 ↔ f16 goes through the exact f32 value, so it
/// rounds once. Errors: `ShapeMismatch { arg: "dst", dim: "len" }` when the lengths differ.
pub fn convert_slice<A: Convertible, B: Convertible>(src: &[A], dst: &mut [B]) -> Result<()> {
    convert_slice_with_isa(super::selected(), src, dst)
}

/// [`convert_slice`] on an explicit ISA. Errors: `InvalidParameter { arg: "isa" }` when the CPU
/// lacks it; `ShapeMismatch` on `"dst"` when the lengths differ. The result is the same on
/// every ISA.
pub fn convert_slice_with_isa<A: Convertible, B: Convertible>(
    isa: Isa,
    src: &[A],
    dst: &mut [B],
) -> Result<()> {
    isa.require()?;
    if src.len() != dst.len() {
        return Err(Error::ShapeMismatch {
            arg: "dst",
            dim: "len",
            expected: src.len(),
            actual: dst.len(),
        });
    }
    convert_into(isa, src, dst);
    Ok(())
}

/// [`convert_slice_with_isa`] for crate callers that hold a supported ISA (from
/// [`Isa::require`] or [`super::selected`]) and equal lengths, so that nothing can fail:
/// converts the first `min(src.len(), dst.len())` elements.
pub(crate) fn convert_into<A: Convertible, B: Convertible>(isa: Isa, src: &[A], dst: &mut [B]) {
    debug_assert_eq!(src.len(), dst.len());
    vectorize(isa, ConvertMap { src, dst });
}

/// Vectors per step of [`ConvertMap`]: four independent load-convert-store chains.
const UNROLL: usize = 4;

/// The body of [`convert_into`]: groups of [`UNROLL`] vectors, then single vectors,
/// then one tail.
struct ConvertMap<'a, A, B> {
    src: &'a [A],
    dst: &'a mut [B],
}

impl<A: SimdElement, B: SimdElement> Kernel for ConvertMap<'_, A, B> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let n = self.src.len().min(self.dst.len());
        let (src, dst, l) = (&self.src[..n], &mut self.dst[..n], S::LANES);
        let mut j = 0;
        while j + UNROLL * l <= n {
            let mut v = [s.splat(0.0); UNROLL];
            for (u, vu) in v.iter_mut().enumerate() {
                *vu = load_elems(s, &src[j + u * l..]);
            }
            for (u, vu) in v.iter().enumerate() {
                store_elems(s, &mut dst[j + u * l..], *vu);
            }
            j += UNROLL * l;
        }
        while j + l <= n {
            store_elems(s, &mut dst[j..], load_elems(s, &src[j..]));
            j += l;
        }
        if j < n {
            store_elems_tail(s, &mut dst[j..], load_elems_tail(s, &src[j..]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_bits_is_halfs_rounding() {
        // Every exponent and sign with mantissas around the rounding boundaries, and NaNs.
        for hi in 0..=u16::MAX {
            for lo in [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
                let x = (u32::from(hi) << 16) | lo;
                assert_eq!(bf16_bits(x), bf16::from_f32(f32::from_bits(x)).to_bits(), "{x:#x}");
            }
        }
    }

    #[test]
    fn scalar_widening_is_halfs() {
        for bits in 0..=u16::MAX {
            let (b, h) = (bf16::from_bits(bits), f16::from_bits(bits));
            assert_eq!(b.widen().to_bits(), b.to_f32().to_bits(), "bf16 {bits:#06x}");
            assert_eq!(h.widen().to_bits(), h.to_f32_const().to_bits(), "f16 {bits:#06x}");
            assert_eq!(h.widen().to_bits(), h.to_f32().to_bits(), "f16 {bits:#06x}");
        }
    }

    #[test]
    fn tails_do_not_touch_past_the_end() {
        for isa in Isa::supported() {
            for n in 0..40 {
                let src: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
                let mut dst = vec![bf16::from_f32(-7.0); n + 3];
                convert_slice_with_isa(isa, &src, &mut dst[..n]).unwrap();
                for (i, d) in dst.iter().enumerate() {
                    let want = if i < n { bf16::from_f32(src[i]) } else { bf16::from_f32(-7.0) };
                    assert_eq!(d.to_bits(), want.to_bits(), "{isa} n {n} i {i}");
                }
            }
        }
    }
}
