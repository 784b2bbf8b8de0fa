//! Element types: the [`DType`] tag and the [`Element`] trait of the value types a view can hold
//! (`f32`, and the `half` crate's [`bf16`] and [`f16`](struct@f16), as engines store weights, activations
//! and K/V caches). Kernels accumulate and take the softmax in f32 whatever the element type:
//! an element is widened with [`Element::to_f32`] (exact for all three) and a result narrowed
//! with [`Element::from_f32`] (round to nearest, ties to even, the same bits on every ISA).
//!
//! The int8 K/V cache layout ([`crate::quant`]) is a [`DType`] too, [`DType::Q8`], but not an
//! [`Element`]: its values are only meaningful together with their block's scale.

use std::fmt;

pub use half::{bf16, f16};

/// The storage type of a tensor's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16: the top 16 bits of an f32 (8 exponent bits, 7 mantissa bits).
    BF16,
    /// IEEE binary16 (5 exponent bits, 10 mantissa bits; largest finite value 65504).
    F16,
    /// Symmetric int8 in blocks of [`Q8_BLOCK`](crate::quant::Q8_BLOCK) values along `d`, one f32
    /// scale per block ([`crate::quant`]).
    Q8,
}

impl DType {
    /// All dtypes.
    pub const ALL: [DType; 4] = [DType::F32, DType::BF16, DType::F16, DType::Q8];

    /// Short lower-case name (`f32`, `bf16`, `f16`, `q8`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::Q8 => "q8",
        }
    }

    /// Bytes of one stored value, not counting [`DType::Q8`]'s per-block scales
    /// (see [`row_bytes`](Self::row_bytes)).
    pub const fn value_size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::Q8 => 1,
        }
    }

    /// True for the block-quantised layouts, whose values need a scale to mean anything.
    pub const fn is_quantized(self) -> bool {
        matches!(self, DType::Q8)
    }

    /// Bytes that `d` values along one row occupy, scales included: `4d`, `2d`, or for
    /// [`DType::Q8`] `d + 4·⌈d/32⌉` (36 bytes per full block). Saturates instead of overflowing.
    /// This is what a kernel streaming a K/V row reads, the figure decode bandwidth is measured
    /// in.
    pub const fn row_bytes(self, d: usize) -> usize {
        match self {
            DType::Q8 => d.saturating_add(crate::quant::q8_blocks(d).saturating_mul(4)),
            _ => d.saturating_mul(self.value_size()),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// A floating-point value type that views can hold and kernels can read and write: `f32`,
/// [`bf16`], [`f16`](struct@f16). Sealed: the kernels have a vector conversion for each of these and no
/// other.
pub trait Element:
    sealed::Sealed + Copy + Default + PartialEq + fmt::Debug + Send + Sync + 'static
{
    /// The tag of this type.
    const DTYPE: DType;
    /// Bytes per value (`size_of::<Self>()`).
    const SIZE: usize;
    /// The exact f32 value. A NaN stays NaN with its payload's top bits kept and its quiet bit
    /// set (as `half` defines it, and as `vcvtph2ps` does).
    fn to_f32(self) -> f32;
    /// The nearest value, ties to even; beyond the largest finite value, `±∞` (f16 overflows
    /// above 65504 + 16 = 65520, bf16 near `f32::MAX`); NaN stays NaN, sign and top payload
    /// bits kept, quiet bit set. These are `half`'s `from_f32` bits, which every vector path
    /// of the kernels reproduces.
    fn from_f32(x: f32) -> Self;
    /// The exact value as f64 (what the reference computes on).
    #[inline]
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    const SIZE: usize = 4;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    const SIZE: usize = 2;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    const SIZE: usize = 2;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_types() {
        assert_eq!(<f32 as Element>::SIZE, std::mem::size_of::<f32>());
        assert_eq!(<bf16 as Element>::SIZE, std::mem::size_of::<bf16>());
        assert_eq!(<f16 as Element>::SIZE, std::mem::size_of::<f16>());
        for (t, s) in [(DType::F32, 4), (DType::BF16, 2), (DType::F16, 2), (DType::Q8, 1)] {
            assert_eq!(t.value_size(), s);
        }
        assert_eq!(DType::Q8.row_bytes(128), 128 + 16);
        assert_eq!(DType::Q8.row_bytes(33), 33 + 8);
        assert_eq!(DType::BF16.row_bytes(128), 256);
        assert_eq!(DType::F32.row_bytes(usize::MAX), usize::MAX);
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        // 1 + 2^-8 is the bf16 midpoint between 1 and 1 + 2^-7: ties to even (1).
        let mid = f32::from_bits(0x3F80_8000);
        assert_eq!(<bf16 as Element>::from_f32(mid).to_bits(), 0x3F80);
        assert_eq!(<bf16 as Element>::from_f32(f32::from_bits(0x3F80_8001)).to_bits(), 0x3F81);
        assert_eq!(<bf16 as Element>::from_f32(f32::from_bits(0x3F81_8000)).to_bits(), 0x3F82);
        // f16: 65504 is the largest finite value; its midpoint with 65536 (65520) rounds up.
        assert_eq!(<f16 as Element>::from_f32(65519.996).to_bits(), 0x7BFF);
        assert_eq!(<f16 as Element>::from_f32(65520.0).to_bits(), 0x7C00);
        assert_eq!(<f16 as Element>::from_f32(-1e9).to_bits(), 0xFC00);
        // f16 subnormal: 2^-25 is the midpoint between 0 and 2^-24: ties to even (0).
        assert_eq!(<f16 as Element>::from_f32(2f32.powi(-25)).to_bits(), 0);
        assert_eq!(
            <f16 as Element>::from_f32(f32::from_bits(2f32.powi(-25).to_bits() + 1)),
            f16::from_bits(1)
        );
        // bf16 from f32::MAX rounds to +inf.
        assert_eq!(<bf16 as Element>::from_f32(f32::MAX).to_bits(), 0x7F80);
    }

    #[test]
    fn nan_stays_nan_and_quiet() {
        // A signalling f32 NaN (payload in the top mantissa bits, quiet bit clear).
        let snan = f32::from_bits(0xFF81_2345);
        assert_eq!(<bf16 as Element>::from_f32(snan).to_bits(), 0xFFC1);
        assert_eq!(<f16 as Element>::from_f32(snan).to_bits(), 0xFE09);
        assert_eq!(<bf16 as Element>::to_f32(bf16::from_bits(0x7F81)).to_bits(), 0x7FC1_0000);
        assert_eq!(<f16 as Element>::to_f32(f16::from_bits(0x7C01)).to_bits(), 0x7FC0_2000);
    }

    #[test]
    fn widening_is_exact() {
        for bits in 0..=u16::MAX {
            let b = bf16::from_bits(bits);
            let h = f16::from_bits(bits);
            if !b.is_nan() {
                assert_eq!(<bf16 as Element>::from_f32(b.to_f32()).to_bits(), bits);
                assert_eq!(b.to_f32().to_bits(), u32::from(bits) << 16);
            }
            if !h.is_nan() {
                assert_eq!(<f16 as Element>::from_f32(h.to_f32()).to_bits(), bits);
                assert_eq!(f64::from(h.to_f32()), Element::to_f64(h));
            }
        }
    }
}
