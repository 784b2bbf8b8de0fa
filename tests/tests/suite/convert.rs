//! The vectorised f32 ↔ bf16/f16 conversions (`attn_kernels::arch::convert`) against `half`,
//! bit for bit, on every ISA this CPU supports (the others are named as skipped):
//! - widening: all 2¹⁶ bf16 and f16 inputs;
//! - narrowing: every representable output, its f32 neighbours, the exact midpoints between
//!   consecutive outputs and one f32 ULP either side of each, f32 subnormals, ±0, ±∞, values
//!   beyond the f16 range, and every NaN payload; plus a strided sweep over all f32 patterns and
//!   an ignored exhaustive one (`cargo test --release -p attn-tests --test suite --
//!   --ignored convert::`).
//!
//! The yardstick is `half`'s `from_f32_const` / `to_f32_const` (its portable bit arithmetic,
//! whatever the CPU) and, as a second opinion, `from_f32` / `to_f32` (which use F16C when the
//! CPU has it).

use attn_kernels::arch::convert::{bf16_bits, convert_slice, convert_slice_with_isa};
use attn_kernels::{bf16, f16, Error, Isa};
use attn_tests::supported_isas;

fn isas() -> Vec<Isa> {
    supported_isas("convert")
}

fn all_bf16() -> Vec<bf16> {
    (0..=u16::MAX).map(bf16::from_bits).collect()
}

fn all_f16() -> Vec<f16> {
    (0..=u16::MAX).map(f16::from_bits).collect()
}

/// Converts `xs` on `isa` from offset 1 of a buffer (so the loads are misaligned) and checks
/// every output bit pattern against `want`, naming the first input that differs.
fn check_narrow(isa: Isa, xs: &[f32], what: &str) {
    let mut src = vec![0.0f32; xs.len() + 1];
    src[1..].copy_from_slice(xs);
    let mut b = vec![bf16::ZERO; xs.len() + 1];
    let mut h = vec![f16::ZERO; xs.len() + 1];
    convert_slice_with_isa(isa, &src[1..], &mut b[1..]).unwrap();
    convert_slice_with_isa(isa, &src[1..], &mut h[1..]).unwrap();
    for (i, &x) in xs.iter().enumerate() {
        let (gb, gh) = (b[i + 1].to_bits(), h[i + 1].to_bits());
        let wb = bf16::from_f32_const(x).to_bits();
        let wh = f16::from_f32_const(x).to_bits();
        assert_eq!(
            gb,
            wb,
            "{isa} {what}: bf16 of {x:e} ({:#010x}): {gb:#06x}, want {wb:#06x}",
            x.to_bits()
        );
        assert_eq!(
            gh,
            wh,
            "{isa} {what}: f16 of {x:e} ({:#010x}): {gh:#06x}, want {wh:#06x}",
            x.to_bits()
        );
        debug_assert_eq!(wb, bf16_bits(x.to_bits()));
    }
}

#[test]
fn widening_every_bf16_and_f16_is_halfs() {
    let (b, h) = (all_bf16(), all_f16());
    for isa in isas() {
        for off in [0, 1, 7] {
            let mut y = vec![0.0f32; b.len() - off];
            convert_slice_with_isa(isa, &b[off..], &mut y).unwrap();
            for (x, y) in b[off..].iter().zip(&y) {
                assert_eq!(
                    y.to_bits(),
                    x.to_f32_const().to_bits(),
                    "{isa} bf16 {:#06x}",
                    x.to_bits()
                );
                assert_eq!(y.to_bits(), x.to_f32().to_bits());
                if !x.is_nan() {
                    assert_eq!(y.to_bits(), u32::from(x.to_bits()) << 16, "a shift");
                }
            }
            convert_slice_with_isa(isa, &h[off..], &mut y).unwrap();
            for (x, y) in h[off..].iter().zip(&y) {
                assert_eq!(
                    y.to_bits(),
                    x.to_f32_const().to_bits(),
                    "{isa} f16 {:#06x}",
                    x.to_bits()
                );
                assert_eq!(y.to_bits(), x.to_f32().to_bits());
            }
        }
    }
}

/// For every non-NaN bf16 and f16 `v` (as f32): `v`, its f32 neighbours, the exact midpoint to
/// the next value of the same type and one f32 ULP either side of it.
fn rounding_boundaries() -> Vec<f32> {
    let mut xs = Vec::new();
    let mut around = |v: f32, next: f64| {
        let mid = ((f64::from(v) + next) / 2.0) as f32;
        assert_eq!(f64::from(mid), (f64::from(v) + next) / 2.0, "midpoint exact in f32");
        for c in [v, mid] {
            xs.push(c);
            if c.to_bits() & 0x7FFF_FFFF != 0 {
                xs.push(f32::from_bits(c.to_bits() - 1));
            }
            if c.to_bits() & 0x7FFF_FFFF < 0x7F80_0000 {
                xs.push(f32::from_bits(c.to_bits() + 1));
            }
        }
    };
    // The next value away from zero; past the largest finite value, where the exponent range
    // ends (2^128 for bf16, 2^16 for f16), so that the midpoint is the overflow threshold.
    let next_of = |next: f32, beyond: f64| {
        if next.is_infinite() {
            beyond.copysign(f64::from(next))
        } else {
            f64::from(next)
        }
    };
    for bits in 0..=u16::MAX {
        let b = bf16::from_bits(bits);
        if !b.is_nan() && !b.is_infinite() {
            around(b.to_f32(), next_of(bf16::from_bits(bits + 1).to_f32(), 2f64.powi(128)));
        }
        let h = f16::from_bits(bits);
        if !h.is_nan() && !h.is_infinite() {
            around(h.to_f32(), next_of(f16::from_bits(bits + 1).to_f32(), 65536.0));
        }
    }
    xs
}

#[test]
fn narrowing_at_every_output_and_rounding_boundary() {
    let xs = rounding_boundaries();
    assert!(xs.len() > 500_000);
    let mut specials = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        65504.0,
        65519.996,
        65520.0,
        -65520.0,
        65536.0,
        1e10,
        -1e30,
        3.4e38,
        // bf16 overflow: above the largest bf16 by half an ULP (and just under).
        f32::from_bits(0x7F7F_8000),
        f32::from_bits(0x7F7F_7FFF),
        f32::from_bits(0xFF7F_8000),
        // f16 subnormal range and below: 2^-24 (smallest f16), 2^-25 (its midpoint with 0).
        2f32.powi(-24),
        2f32.powi(-25),
        f32::from_bits(2f32.powi(-25).to_bits() + 1),
        -2f32.powi(-25),
        2f32.powi(-14),
        2f32.powi(-15) * 1.5,
    ];
    // Every f32 subnormal exponent pattern at a few mantissas.
    for m in [1u32, 2, 3, 0x7FFF, 0x8000, 0x8001, 0x1_8000, 0x40_0000, 0x7F_FFFF] {
        specials.push(f32::from_bits(m));
        specials.push(-f32::from_bits(m));
    }
    for isa in isas() {
        check_narrow(isa, &xs, "boundaries");
        check_narrow(isa, &specials, "specials");
    }
}

#[test]
fn nan_payloads() {
    // Every NaN: both signs, all 2^23 − 1 payloads (quiet and signalling).
    let nans: Vec<f32> = [0u32, 0x8000_0000]
        .into_iter()
        .flat_map(|sign| (1..1u32 << 23).map(move |m| f32::from_bits(sign | 0x7F80_0000 | m)))
        .collect();
    for isa in isas() {
        check_narrow(isa, &nans, "NaN");
    }
    // The documented bits, on one signalling NaN.
    let snan = f32::from_bits(0xFF81_2345);
    let (mut b, mut h) = ([bf16::ZERO], [f16::ZERO]);
    for isa in isas() {
        convert_slice_with_isa(isa, &[snan], &mut b).unwrap();
        convert_slice_with_isa(isa, &[snan], &mut h).unwrap();
        assert_eq!((b[0].to_bits(), h[0].to_bits()), (0xFFC1, 0xFE09), "{isa}");
    }
}

/// Checks every `stride`-th f32 bit pattern of `[start, end]`, chunk by chunk.
fn sweep(isa: Isa, start: u32, end: u32, stride: u32) {
    let chunk = stride.saturating_mul(1 << 20);
    let mut a = start;
    loop {
        let b = a.saturating_add(chunk - 1).min(end);
        let xs: Vec<f32> = (a..=b).step_by(stride as usize).map(f32::from_bits).collect();
        check_narrow(isa, &xs, "sweep");
        match b.checked_add(1) {
            Some(n) if n <= end => a = n,
            _ => break,
        }
    }
}

#[test]
fn narrowing_strided_sweep_of_all_f32() {
    for isa in isas() {
        // An odd stride visits every residue of the low bits over the range.
        sweep(isa, 0, u32::MAX, 251);
    }
}

/// Every one of the 2^32 f32 inputs to bf16 and f16 on every ISA. A few minutes at opt-level
/// 3: `cargo test --release -p attn-tests --test suite -- --ignored convert::`.
#[test]
#[ignore]
fn narrowing_exhaustive_all_f32() {
    for isa in isas() {
        sweep(isa, 0, u32::MAX, 1);
        eprintln!("{isa}: all 2^32 f32 → bf16/f16 match half");
    }
}

#[test]
fn half_to_half_rounds_once_through_f32() {
    let b = all_bf16();
    let h = all_f16();
    for isa in isas() {
        let mut out = vec![f16::ZERO; b.len()];
        convert_slice_with_isa(isa, &b, &mut out).unwrap();
        for (x, y) in b.iter().zip(&out) {
            assert_eq!(y.to_bits(), f16::from_f32_const(x.to_f32_const()).to_bits());
        }
        let mut out = vec![bf16::ZERO; h.len()];
        convert_slice_with_isa(isa, &h, &mut out).unwrap();
        for (x, y) in h.iter().zip(&out) {
            assert_eq!(y.to_bits(), bf16::from_f32_const(x.to_f32_const()).to_bits());
        }
        let mut same = vec![bf16::ZERO; b.len()];
        convert_slice_with_isa(isa, &b, &mut same).unwrap();
        assert!(same.iter().zip(&b).all(|(y, x)| y.to_bits() == x.to_bits() || x.is_nan()));
    }
}

#[test]
fn every_length_and_the_default_isa() {
    for n in 0..70 {
        let xs: Vec<f32> = (0..n).map(|i| (i as f32 - 30.0) * 1.0009765).collect();
        let want: Vec<u16> = xs.iter().map(|&x| f16::from_f32_const(x).to_bits()).collect();
        let mut y = vec![f16::from_bits(0x5555); n];
        convert_slice(&xs, &mut y).unwrap();
        assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
        for isa in isas() {
            let mut y = vec![f16::from_bits(0x5555); n + 5];
            convert_slice_with_isa(isa, &xs, &mut y[2..n + 2]).unwrap();
            assert!(y[..2].iter().chain(&y[n + 2..]).all(|v| v.to_bits() == 0x5555), "{isa} n {n}");
            assert_eq!(y[2..n + 2].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "{isa}");
        }
    }
}

#[test]
fn length_mismatch_is_a_typed_error() {
    let mut y = [bf16::ZERO; 3];
    assert_eq!(
        convert_slice(&[1.0f32; 4], &mut y),
        Err(Error::ShapeMismatch { arg: "dst", dim: "len", expected: 4, actual: 3 })
    );
    assert_eq!(y, [bf16::ZERO; 3]);
}
