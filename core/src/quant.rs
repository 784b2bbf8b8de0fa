//! The int8 K/V cache layout ([`DType::Q8`](crate::DType::Q8)): symmetric int8 in blocks of
//! [`Q8_BLOCK`] = 32 values along `d`, one f32 scale per block.
//!
//! # Layout
//!
//! A quantised `[batch, heads, seq, d]` tensor ([`Q8Ref`], [`Q8Mut`]) is two strided tensors:
//! - `values`: `i8`, `[batch, heads, seq, d]`, any layout a K/V tensor may have (`bhsd`,
//!   `bshd`, strided);
//! - `scales`: `f32`, `[batch, heads, seq, ⌈d/32⌉]`: the scale of block `k` of row
//!   `(b, h, s)` is `scales[b, h, s, k]`; block `k` covers `d` indices `32k .. min(32k + 32, d)`,
//!   so when 32 does not divide `d` the last block is shorter (`d mod 32` values) and has a
//!   scale of its own.
//!
//! Why two tensors rather than ggml-style interleaved blocks (`[scale, 32 × i8]` records):
//! the values keep the K/V's own layout and strides, so a row of `d` int8 starts where an
//! f32/bf16 row would and loads as whole, aligned vectors (16 or 32 values, never split by a
//! scale); the scales of row `(b, h, s)` are `⌈d/32⌉` contiguous floats (16 bytes at `d` = 128)
//! reached by the same `(b, h, s)` index, so decode, walking the keys of one head, streams two
//! sequential arrays, which the hardware prefetchers follow as well as one. A cache written in
//! place (one new token per step) writes one row of each.
//!
//! Why f32 scales rather than f16: the dequantised value `q·scale` is then exact in f64
//! (an 8-bit integer times a 24-bit significand), so the reference works on exactly the value
//! the layout represents; an f16 scale would also underflow or overflow for blocks whose
//! largest magnitude is below about `6·10⁻⁵·127` or above `65504·127`. The cost is 36 bytes per
//! 32 values (34 with f16), 1.125 bytes per value against 2 for bf16/f16 and 4 for f32.
//!
//! # Quantisation ([`quantize_q8`], [`quantize_q8_block`])
//!
//! Per block, in f32 arithmetic (each operation correctly rounded, so every ISA can reproduce
//! the bits): `m = max |x|`, `scale = m / 127`, and
//! `q = clamp(round_half_even(x / scale), −127, 127)`. When `scale` is 0 (an all-zero block,
//! or one whose largest magnitude is at most `63·2⁻¹⁴⁹`, so that `m / 127` underflows to 0)
//! every `q` is 0 and the scale stored is `+0`. Inputs of type bf16 and f16 are widened to f32
//! first (exactly). A NaN or infinite input is an [`Error::NonFinite`] naming the source, found
//! before anything is written: on error the destination is untouched.
//!
//! Error of the round trip, for every `x` of a block with scale `s`:
//! `|x − q·s| ≤ s·(1/2 + 2⁻¹⁷) + 2⁻¹⁴³`. The `2⁻¹⁷` term is the rounding of `x / s` in f32
//! (`|x/s| ≤ 128`, half an ULP of it is at most `2⁻¹⁷`); the `2⁻¹⁴³` term (`> 127·2⁻¹⁵⁰`)
//! matters only when `s` is subnormal or 0, i.e. the block's largest magnitude is below
//! `127·2⁻¹²⁶ ≈ 1.5·10⁻³⁶`, where `s` itself is rounded coarsely (and clamping takes up the
//! slack). What error is acceptable is the caller's choice; the kernels' error bounds are
//! stated on the dequantised values.
//!
//! # Dequantisation ([`q8_dequantize`])
//!
//! The value a quantised element represents is exactly `q · scale`, computed in f64 (exact).
//! This holds for any bits a caller stores, not only those [`quantize_q8`] writes: `q = −128`
//! means `−128·scale`; a scale of `±0` gives `±0` (sign by the product's rule); a scale of
//! `±∞` gives `±∞` for `q ≠ 0` and NaN for `q = 0` (`0·∞`); a NaN scale gives NaN. The layout
//! checks do not read the scales: such values flow into a kernel exactly as the same f32
//! values would. In f32, `q · scale` rounds once ([`q8_dequantize_f32`]): relative error at most
//! `2⁻²⁴`, or an absolute `2⁻¹⁵⁰` in the subnormal range, and `±∞` when `|q·scale|` exceeds
//! `f32::MAX` (possible only for scales this quantiser does not produce, or `q = −128`).

use crate::dtype::Element;
use crate::error::{expect_dim, Error, Result};
use crate::shape::{Tensor4Layout, TensorMut, TensorRef};

/// Values per quantisation block along `d`.
pub const Q8_BLOCK: usize = 32;

/// The largest `|q|` the quantiser writes (symmetric: `−128` is never produced).
pub const Q8_MAX: i8 = 127;

/// Blocks in a row of `d` values: `⌈d/32⌉` (the last one shorter when 32 does not divide `d`).
pub const fn q8_blocks(d: usize) -> usize {
    d.div_ceil(Q8_BLOCK)
}

/// The logical dims of the scales of a quantised tensor of dims `[b, h, s, d]`:
/// `[b, h, s, ⌈d/32⌉]`.
pub const fn q8_scale_dims(dims: [usize; 4]) -> [usize; 4] {
    [dims[0], dims[1], dims[2], q8_blocks(dims[3])]
}

/// The bound of the round trip through [`quantize_q8`] for a block whose scale is `scale`:
/// `|x − q·scale| ≤ scale·(1/2 + 2⁻¹⁷) + 2⁻¹⁴³` for every `x` of the block (module docs).
pub fn q8_round_trip_bound(scale: f32) -> f64 {
    f64::from(scale) * (0.5 + 2f64.powi(-17)) + 2f64.powi(-143)
}

/// The value element `q` of a block with scale `scale` represents: `q · scale`, exact in f64.
/// See the module docs for zero, infinite and NaN scales.
#[inline]
pub fn q8_dequantize(q: i8, scale: f32) -> f64 {
    f64::from(q) * f64::from(scale)
}

/// `q · scale` rounded once to f32 (what a kernel computing in f32 gets): within `2⁻²⁴`
/// relative (`2⁻¹⁵⁰` absolute among subnormals) of [`q8_dequantize`], `±∞` beyond `f32::MAX`.
#[inline]
pub fn q8_dequantize_f32(q: i8, scale: f32) -> f32 {
    f32::from(q) * scale
}

/// A read-only int8-quantised `[batch, heads, seq, d]` tensor: values and per-block scales (see
/// the module docs for the layout).
#[derive(Clone, Copy, Debug)]
pub struct Q8Ref<'a> {
    /// The int8 values, `[batch, heads, seq, d]`.
    pub values: TensorRef<'a, i8>,
    /// The scales, `[batch, heads, seq, ⌈d/32⌉]`.
    pub scales: TensorRef<'a, f32>,
}

/// A writable int8-quantised `[batch, heads, seq, d]` tensor (the destination of
/// [`quantize_q8`]).
#[derive(Debug)]
pub struct Q8Mut<'a> {
    /// The int8 values, `[batch, heads, seq, d]`.
    pub values: TensorMut<'a, i8>,
    /// The scales, `[batch, heads, seq, ⌈d/32⌉]`.
    pub scales: TensorMut<'a, f32>,
}

/// Expects `scales` to have the dims [`q8_scale_dims`] gives for `values`, naming `arg`.
fn check_scale_dims(
    arg: &'static str,
    values: &Tensor4Layout,
    scales: &Tensor4Layout,
) -> Result<()> {
    scales.expect_dims(arg, q8_scale_dims(values.dims))
}

impl<'a> Q8Ref<'a> {
    /// Pairs values and scales (checked later, by the call that uses them).
    pub const fn new(values: TensorRef<'a, i8>, scales: TensorRef<'a, f32>) -> Self {
        Self { values, scales }
    }

    /// Contiguous `[batch, heads, seq, d]` values and `[batch, heads, seq, ⌈d/32⌉]` scales.
    pub const fn bhsd(
        values: &'a [i8],
        scales: &'a [f32],
        batch: usize,
        heads: usize,
        seq: usize,
        d: usize,
    ) -> Self {
        Self {
            values: TensorRef::new(values, Tensor4Layout::bhsd(batch, heads, seq, d)),
            scales: TensorRef::new(scales, Tensor4Layout::bhsd(batch, heads, seq, q8_blocks(d))),
        }
    }

    /// The logical dims `[batch, heads, seq, d]` of the values.
    pub const fn dims(&self) -> [usize; 4] {
        self.values.layout.dims
    }

    /// Checks both views against their slices and the scales' dims against the values'
    /// (`[b, h, s, ⌈d/32⌉]`); `arg` names the values and `scales_arg` the scales in the error.
    /// The scales' contents are not read (see the module docs for what any scale means).
    pub fn check(&self, arg: &'static str, scales_arg: &'static str) -> Result<()> {
        self.values.check(arg)?;
        check_scale_dims(scales_arg, &self.values.layout, &self.scales.layout)?;
        self.scales.check(scales_arg)
    }

    /// Element `(b, h, s, d)` dequantised exactly ([`q8_dequantize`]); call only after
    /// [`check`](Self::check), with indices inside the dims.
    #[inline]
    pub fn at_f64(&self, b: usize, h: usize, s: usize, d: usize) -> f64 {
        q8_dequantize(self.values.at(b, h, s, d), self.scales.at(b, h, s, d / Q8_BLOCK))
    }
}

impl<'a> Q8Mut<'a> {
    /// Pairs values and scales (checked later, by the call that uses them).
    pub fn new(values: TensorMut<'a, i8>, scales: TensorMut<'a, f32>) -> Self {
        Self { values, scales }
    }

    /// Contiguous `[batch, heads, seq, d]` values and `[batch, heads, seq, ⌈d/32⌉]` scales.
    pub fn bhsd(
        values: &'a mut [i8],
        scales: &'a mut [f32],
        batch: usize,
        heads: usize,
        seq: usize,
        d: usize,
    ) -> Self {
        Self {
            values: TensorMut::new(values, Tensor4Layout::bhsd(batch, heads, seq, d)),
            scales: TensorMut::new(scales, Tensor4Layout::bhsd(batch, heads, seq, q8_blocks(d))),
        }
    }

    /// As [`Q8Ref::check`], plus: neither view maps two positions to one element.
    pub fn check(&self, arg: &'static str, scales_arg: &'static str) -> Result<()> {
        self.values.check(arg)?;
        check_scale_dims(scales_arg, &self.values.layout, &self.scales.layout)?;
        self.scales.check(scales_arg)
    }

    /// A read-only view of the same values and scales.
    pub fn as_ref(&self) -> Q8Ref<'_> {
        Q8Ref { values: self.values.as_ref(), scales: self.scales.as_ref() }
    }
}

/// The scale of a block whose largest magnitude is `m` (finite): `m / 127` rounded to f32.
#[inline]
fn block_scale(m: f32) -> f32 {
    m / f32::from(Q8_MAX)
}

/// `clamp(round_half_even(x / scale), −127, 127)` for `scale > 0`, `x` finite.
#[inline]
fn quantize_one(x: f32, scale: f32) -> i8 {
    let t = (x / scale).round_ties_even();
    let m = f32::from(Q8_MAX);
    // In range after the clamp, so the cast is exact.
    t.clamp(-m, m) as i8
}

/// The first non-finite value of `x`, as an error naming `arg`.
fn expect_all_finite<T: Element>(arg: &'static str, x: impl IntoIterator<Item = T>) -> Result<()> {
    match x.into_iter().map(T::to_f32).find(|v| !v.is_finite()) {
        Some(value) => Err(Error::NonFinite { arg, value }),
        None => Ok(()),
    }
}

/// Quantises one block `x` (at most [`Q8_BLOCK`] values, of f32, bf16 or f16) into `q` (the
/// same length) and returns its scale, by the rule of the module docs. Errors:
/// [`Error::ShapeMismatch`] when `q.len() ≠ x.len()` (dim `"block"` of `q`) or
/// `x.len() > 32` (dim `"block"` of `x`, expected 32); [`Error::NonFinite`] naming `x` when it
/// holds a NaN or an infinity, `q` then untouched.
pub fn quantize_q8_block<T: Element>(x: &[T], q: &mut [i8]) -> Result<f32> {
    if x.len() > Q8_BLOCK {
        return Err(Error::ShapeMismatch {
            arg: "x",
            dim: "block",
            expected: Q8_BLOCK,
            actual: x.len(),
        });
    }
    expect_dim("q", "block", x.len(), q.len())?;
    expect_all_finite("x", x.iter().copied())?;
    let m = x.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()));
    let scale = block_scale(m);
    if scale == 0.0 {
        q.fill(0);
        return Ok(0.0);
    }
    for (q, x) in q.iter_mut().zip(x) {
        *q = quantize_one(x.to_f32(), scale);
    }
    Ok(scale)
}

/// Quantises `src` (`[batch, heads, seq, d]` of f32, bf16 or f16) into `dst`, block by block
/// along `d` by the rule of the module docs. Errors: the views' bounds and aliasing errors
/// (naming `src`, `dst` or `dst_scales`); [`Error::ShapeMismatch`] when `dst`'s dims differ
/// from `src`'s or the scales' from `[b, h, s, ⌈d/32⌉]`; [`Error::NonFinite`] naming `src` for
/// the first NaN or infinity in `(b, h, s, d)` order, found before anything is written.
pub fn quantize_q8<T: Element>(src: TensorRef<'_, T>, dst: Q8Mut<'_>) -> Result<()> {
    src.check("src")?;
    dst.values.layout.expect_dims("dst", src.layout.dims)?;
    dst.check("dst", "dst_scales")?;
    let [nb, nh, ns, nd] = src.layout.dims;
    if src.layout.dims.contains(&0) {
        // Nothing to quantise; and a zero `d` would leave `b·h·s` (unbounded by any buffer:
        // the views are empty) rows to visit for nothing.
        return Ok(());
    }
    // Every row in (b, h, s) order, by nested loops: valgrind's memcheck flagged a nested
    // `flat_map` over the rows in the optimised build with a branch on an uninitialised value
    // (the iterator's state; safe code, so a false report, but one that would hide a real one).
    let each_row = |f: &mut dyn FnMut(usize, usize, usize) -> Result<()>| -> Result<()> {
        for b in 0..nb {
            for h in 0..nh {
                for s in 0..ns {
                    f(b, h, s)?;
                }
            }
        }
        Ok(())
    };
    each_row(&mut |b, h, s| expect_all_finite("src", (0..nd).map(|d| src.at(b, h, s, d))))?;
    let mut x = [T::default(); Q8_BLOCK];
    let mut q = [0i8; Q8_BLOCK];
    each_row(&mut |b, h, s| {
        for k in 0..q8_blocks(nd) {
            let d0 = k * Q8_BLOCK;
            let n = (nd - d0).min(Q8_BLOCK);
            for (j, x) in x[..n].iter_mut().enumerate() {
                *x = src.at(b, h, s, d0 + j);
            }
            let scale = quantize_q8_block(&x[..n], &mut q[..n])?;
            let (v, sc) = (dst.values.layout, dst.scales.layout);
            dst.scales.data[sc.index(b, h, s, k)] = scale;
            for (j, &q) in q[..n].iter().enumerate() {
                dst.values.data[v.index(b, h, s, d0 + j)] = q;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{bf16, f16};

    /// The stated round-trip bound, checked in exact f64 arithmetic.
    fn assert_within_bound(x: &[f32], q: &[i8], s: f32) {
        let bound = q8_round_trip_bound(s);
        for (&x, &q) in x.iter().zip(q) {
            let err = (f64::from(x) - q8_dequantize(q, s)).abs();
            assert!(err <= bound, "x {x:e} q {q} s {s:e}: error {err:e} > {bound:e}");
        }
    }

    /// A deterministic pseudo-random f32 stream (xorshift), spread over many binades.
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut st = seed | 1;
        (0..n)
            .map(|_| {
                st ^= st << 13;
                st ^= st >> 7;
                st ^= st << 17;
                let mant = (st >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                let exp = ((st >> 8) % 40) as i32 - 20;
                mant * 2f32.powi(exp)
            })
            .collect()
    }

    #[test]
    fn round_trip_within_bound() {
        for seed in 1..400u64 {
            let n = 1 + (seed as usize % Q8_BLOCK);
            let x = values(seed, n);
            let mut q = vec![0i8; n];
            let s = quantize_q8_block(&x, &mut q).unwrap();
            let m = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(s, m / 127.0);
            assert!(q.iter().any(|&q| q.abs() == 127) || m == 0.0);
            assert!(q.iter().all(|&q| q != -128));
            assert_within_bound(&x, &q, s);
        }
    }

    #[test]
    fn exact_multiples_are_exact() {
        // x = k·2^-3 for k in −15..=15 and max 127·2^-3: scale 2^-3, q = k exactly.
        let x: Vec<f32> = (-15..16).map(|k| k as f32 * 0.125).chain([127.0 * 0.125]).collect();
        let mut q = [0i8; 32];
        let s = quantize_q8_block(&x, &mut q).unwrap();
        assert_eq!(s, 0.125);
        for (&x, &q) in x.iter().zip(&q) {
            assert_eq!(q8_dequantize(q, s), f64::from(x));
        }
    }

    #[test]
    fn ties_round_to_even() {
        // Scale 1 (max 127): 2.5 → 2, 3.5 → 4, −2.5 → −2.
        let x = [127.0f32, 2.5, 3.5, -2.5, -0.5, 0.5];
        let mut q = [0i8; 6];
        assert_eq!(quantize_q8_block(&x, &mut q).unwrap(), 1.0);
        assert_eq!(q, [127, 2, 4, -2, 0, 0]);
    }

    #[test]
    fn zero_and_tiny_blocks_have_scale_zero() {
        let mut q = [5i8; 3];
        assert_eq!(quantize_q8_block(&[0.0f32, -0.0, 0.0], &mut q).unwrap(), 0.0);
        assert_eq!(q, [0; 3]);
        // 63·2^-149 / 127 < 2^-150 rounds to 0.
        let tiny = [f32::from_bits(63), 0.0];
        let mut q = [5i8; 2];
        assert_eq!(quantize_q8_block(&tiny, &mut q).unwrap(), 0.0);
        assert_eq!(q, [0, 0]);
        assert_within_bound(&tiny, &q, 0.0);
        // The smallest subnormals and a block of them: subnormal scale, bound with 2^-143.
        for bits in [1u32, 2, 3, 64, 127, 128, 200, 1000, 100_000] {
            let x = [f32::from_bits(bits), f32::from_bits(bits / 2), -f32::from_bits(bits / 3)];
            let mut q = [0i8; 3];
            let s = quantize_q8_block(&x, &mut q).unwrap();
            assert_within_bound(&x, &q, s);
        }
    }

    #[test]
    fn half_inputs_quantise_their_exact_values() {
        let xf: Vec<f32> = values(7, 32).iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        let xb: Vec<bf16> = xf.iter().map(|&v| bf16::from_f32(v)).collect();
        let (mut qf, mut qb) = ([0i8; 32], [0i8; 32]);
        assert_eq!(quantize_q8_block(&xf, &mut qf), quantize_q8_block(&xb, &mut qb));
        assert_eq!(qf, qb);
        let xh = [f16::from_f32(65504.0), f16::from_f32(-1.0)];
        let mut q = [0i8; 2];
        assert_eq!(quantize_q8_block(&xh, &mut q).unwrap(), 65504.0 / 127.0);
        assert_eq!(q, [127, 0]);
    }

    #[test]
    fn bad_blocks_are_typed_errors() {
        let mut q = [7i8; 33];
        assert_eq!(
            quantize_q8_block(&[0.0f32; 33], &mut q),
            Err(Error::ShapeMismatch { arg: "x", dim: "block", expected: 32, actual: 33 })
        );
        assert_eq!(
            quantize_q8_block(&[0.0f32; 4], &mut q[..3]),
            Err(Error::ShapeMismatch { arg: "q", dim: "block", expected: 4, actual: 3 })
        );
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let r = quantize_q8_block(&[1.0, bad], &mut q[..2]);
            assert!(matches!(r, Err(Error::NonFinite { arg: "x", .. })), "{r:?}");
        }
        assert_eq!(q, [7; 33], "untouched on error");
        let r = quantize_q8_block(&[f16::INFINITY], &mut q[..1]);
        assert!(matches!(r, Err(Error::NonFinite { arg: "x", value }) if value == f32::INFINITY));
    }

    #[test]
    fn tensors_with_tail_blocks() {
        // d = 70: blocks of 32, 32, 6; bshd source, bhsd destination.
        let (b, s, h, d) = (2, 3, 2, 70);
        let x = values(11, b * s * h * d);
        let src = TensorRef::new(&x[..], Tensor4Layout::bshd(b, s, h, d));
        let mut qv = vec![0i8; x.len()];
        let mut qs = vec![f32::NAN; b * h * s * 3];
        quantize_q8(src, Q8Mut::bhsd(&mut qv, &mut qs, b, h, s, d)).unwrap();
        let qr = Q8Ref::bhsd(&qv, &qs, b, h, s, d);
        qr.check("q", "q_scales").unwrap();
        for (bi, hi, si) in
            (0..b).flat_map(|bi| (0..h).flat_map(move |hi| (0..s).map(move |si| (bi, hi, si))))
        {
            for k in 0..3 {
                let r = k * 32..(k * 32 + 32).min(d);
                let xs: Vec<f32> = r.clone().map(|j| src.at(bi, hi, si, j)).collect();
                let mut q = vec![0i8; xs.len()];
                let sc = quantize_q8_block(&xs, &mut q).unwrap();
                assert_eq!(qr.scales.at(bi, hi, si, k), sc);
                for (j, &q) in r.zip(&q) {
                    assert_eq!(qr.values.at(bi, hi, si, j), q);
                    assert_eq!(qr.at_f64(bi, hi, si, j), q8_dequantize(q, sc));
                }
            }
        }
    }

    #[test]
    fn tensor_checks_are_typed_errors() {
        let x = [1.0f32; 2 * 40];
        let src = TensorRef::new(&x[..], Tensor4Layout::bhsd(1, 1, 2, 40));
        let (mut qv, mut qs) = ([0i8; 80], [0.0f32; 4]);
        // Scales with 1 block per row instead of 2.
        let bad = Q8Mut::new(
            TensorMut::new(&mut qv[..], Tensor4Layout::bhsd(1, 1, 2, 40)),
            TensorMut::new(&mut qs[..], Tensor4Layout::bhsd(1, 1, 2, 1)),
        );
        assert_eq!(
            quantize_q8(src, bad),
            Err(Error::ShapeMismatch { arg: "dst_scales", dim: "dim", expected: 2, actual: 1 })
        );
        // Too short a scale slice.
        let r = quantize_q8(src, Q8Mut::bhsd(&mut qv, &mut qs[..3], 1, 1, 2, 40));
        assert_eq!(r, Err(Error::OutOfBounds { arg: "dst_scales", required: 4, len: 3 }));
        // Mismatched destination dims.
        let r = quantize_q8(src, Q8Mut::bhsd(&mut qv, &mut qs, 1, 1, 1, 40));
        assert_eq!(r, Err(Error::ShapeMismatch { arg: "dst", dim: "seq", expected: 2, actual: 1 }));
        // A NaN in the second row: nothing written.
        let mut y = x;
        y[45] = f32::NAN;
        let (mut qv, mut qs) = ([9i8; 80], [9.0f32; 4]);
        let src = TensorRef::new(&y[..], Tensor4Layout::bhsd(1, 1, 2, 40));
        let r = quantize_q8(src, Q8Mut::bhsd(&mut qv, &mut qs, 1, 1, 2, 40));
        assert!(matches!(r, Err(Error::NonFinite { arg: "src", .. })));
        assert_eq!((qv, qs), ([9i8; 80], [9.0f32; 4]));
    }

    #[test]
    fn dequantisation_of_special_scales() {
        assert_eq!(q8_dequantize(5, 0.0), 0.0);
        assert!(q8_dequantize(-5, 0.0).is_sign_negative());
        assert_eq!(q8_dequantize(3, f32::INFINITY), f64::INFINITY);
        assert_eq!(q8_dequantize(-3, f32::INFINITY), f64::NEG_INFINITY);
        assert!(q8_dequantize(0, f32::INFINITY).is_nan());
        assert!(q8_dequantize(1, f32::NAN).is_nan());
        assert_eq!(q8_dequantize(-128, 0.5), -64.0);
        assert_eq!(q8_dequantize_f32(127, f32::MAX), f32::INFINITY);
        // Exact in f64: 127 · (1 + 2^-23) needs 31 bits; f32 rounds it.
        let s = 1.0 + f32::EPSILON;
        assert_eq!(q8_dequantize(127, s), 127.0 * (1.0 + 2f64.powi(-23)));
        assert_ne!(f64::from(q8_dequantize_f32(127, s)), q8_dequantize(127, s));
    }
}
