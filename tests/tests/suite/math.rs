//! The kernels' elementwise math against the f64 reference: GELU (tanh form) and tanh on every
//! ISA this CPU runs, held to the bounds built from their published constants
//! (`attn_tests::numerics::{gelu_tanh_bound, tanh_bound}`): special values exactly, a dense
//! sweep of the range where they vary, random inputs over the whole f32 range, and position
//! independence; an ignored exhaustive sweep measures `TANH_MAX_ULP` and
//! `TANH_RATIONAL_MAX_ULP`. Each tanh test runs both tanh functions ([`Tanh`]).

use attn_kernels::math::{
    gelu_tanh_with_isa, tanh_rational_with_isa, tanh_with_isa, TANH_MAX_ULP, TANH_RATIONAL_MAX_ULP,
};
use attn_kernels::{Activation, Isa};
use attn_reference::activate;
use attn_tests::numerics::{f32_ulp, gelu_tanh_bound, tanh_bound, tanh_rational_bound};
use attn_tests::supported_isas;
use proptest::prelude::*;

fn gelu(isa: Isa, xs: &[f32]) -> Vec<f32> {
    let mut ys = xs.to_vec();
    gelu_tanh_with_isa(isa, &mut ys).unwrap();
    ys
}

/// Asserts every output within its bound (NaN where the reference is NaN) and returns the
/// largest error / bound ratio.
fn check(isa: Isa, xs: &[f32]) -> f64 {
    let ys = gelu(isa, xs);
    let mut worst: f64 = 0.0;
    for (&x, &y) in xs.iter().zip(&ys) {
        let want = activate(Activation::GeluTanh, f64::from(x));
        if want.is_nan() {
            assert!(y.is_nan(), "{isa}: gelu({x:e}) = {y:e}, want NaN");
            continue;
        }
        let err = (f64::from(y) - want).abs();
        let bound = gelu_tanh_bound(x, want);
        assert!(
            err <= bound,
            "{isa}: gelu({x:e}) = {y:e}, want {want:e}: error {err:e} > {bound:e}"
        );
        // Where e^z overflows f32 the bound is |g| itself (the kernel returns −0): the ratio is
        // reported only for results above the largest such g.
        if want.abs() > 1e-36 {
            worst = worst.max(err / bound);
        }
    }
    worst
}

#[test]
fn special_values() {
    for isa in supported_isas("math") {
        let xs = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MAX, f32::MIN];
        let ys = gelu(isa, &xs);
        assert_eq!(ys[0].to_bits(), 0.0f32.to_bits(), "{isa}: gelu(+0)");
        assert_eq!(ys[1].to_bits(), (-0.0f32).to_bits(), "{isa}: gelu(−0)");
        assert_eq!(ys[2], f32::INFINITY, "{isa}: gelu(+∞)");
        assert!(ys[3].is_nan() && ys[4].is_nan(), "{isa}: gelu(−∞), gelu(NaN)");
        assert_eq!(ys[5], f32::MAX, "{isa}: gelu(MAX)");
        assert_eq!(ys[6], 0.0, "{isa}: gelu(MIN)");
    }
}

#[test]
fn dense_sweep_of_the_varying_range() {
    // Every 401st f32 with 1e-4 ≤ |x| ≤ 16, both signs (about 740 k inputs per ISA): below,
    // g(x) ≈ x/2; above, g is x or 0 to f32 precision (those ranges are in the random test).
    let (lo, hi) = (1e-4f32.to_bits(), 16f32.to_bits());
    let xs: Vec<f32> =
        (lo..=hi).step_by(401).flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)]).collect();
    for isa in supported_isas("math") {
        let worst = check(isa, &xs);
        eprintln!("gelu {isa}: worst error {worst:.3} of the bound over {} inputs", xs.len());
    }
}

#[test]
fn same_bits_wherever_a_value_sits() {
    // Full vectors and the padded tail take the same lane-wise path.
    let xs: Vec<f32> = (0..67).map(|i| (i as f32 - 33.0) * 0.37).collect();
    for isa in supported_isas("math") {
        let all = gelu(isa, &xs);
        for start in 0..xs.len() {
            let part = gelu(isa, &xs[start..]);
            for (i, (a, b)) in all[start..].iter().zip(&part).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{isa}: element {} from offset {start}",
                    start + i
                );
            }
        }
    }
}

proptest! {
    #[test]
    fn random_inputs_within_the_bound(bits in proptest::collection::vec(any::<u32>(), 1..200)) {
        let xs: Vec<f32> = bits.into_iter().map(f32::from_bits).collect();
        for isa in supported_isas("math") {
            check(isa, &xs);
        }
    }
}

/// The two tanh functions of the kernels: the accurate one and the rational approximation.
#[derive(Clone, Copy, Debug)]
enum Tanh {
    Accurate,
    Rational,
}

impl Tanh {
    const BOTH: [Tanh; 2] = [Tanh::Accurate, Tanh::Rational];

    fn run(self, isa: Isa, xs: &[f32]) -> Vec<f32> {
        let mut ys = xs.to_vec();
        match self {
            Tanh::Accurate => tanh_with_isa(isa, &mut ys),
            Tanh::Rational => tanh_rational_with_isa(isa, &mut ys),
        }
        .unwrap();
        ys
    }

    fn bound(self, x: f32, t: f64) -> f64 {
        match self {
            Tanh::Accurate => tanh_bound(x, t),
            Tanh::Rational => tanh_rational_bound(x, t),
        }
    }

    fn max_ulp(self) -> f64 {
        match self {
            Tanh::Accurate => TANH_MAX_ULP,
            Tanh::Rational => TANH_RATIONAL_MAX_ULP,
        }
    }
}

/// Asserts every output of `f` within its bound and `|tanh| ≤ 1` (NaN where f64 `tanh` is NaN)
/// and returns the worst error in ULP of the exact result with the input where it occurs.
fn check_tanh(f: Tanh, isa: Isa, xs: &[f32]) -> (f64, f32) {
    let ys = f.run(isa, xs);
    let mut worst = (0.0f64, 0.0f32);
    for (&x, &y) in xs.iter().zip(&ys) {
        let want = f64::from(x).tanh();
        if want.is_nan() {
            assert!(y.is_nan(), "{isa}: tanh({x:e}) = {y:e}, want NaN");
            continue;
        }
        let err = (f64::from(y) - want).abs();
        let bound = f.bound(x, want);
        assert!(
            err <= bound && y.abs() <= 1.0,
            "{f:?} {isa}: tanh({x:e}) = {y:e}, want {want:e}: error {err:e} > {bound:e}"
        );
        let e = err / f32_ulp(want);
        if e > worst.0 {
            worst = (e, x);
        }
    }
    worst
}

#[test]
fn tanh_special_values() {
    for isa in supported_isas("math") {
        let xs = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN,
            10.0,
            -10.0,
            1e-40,
            -1e-40,
            f32::MIN_POSITIVE,
        ];
        for f in Tanh::BOTH {
            let ys = f.run(isa, &xs);
            assert_eq!(ys[0].to_bits(), 0.0f32.to_bits(), "{f:?} {isa}: tanh(+0)");
            assert_eq!(ys[1].to_bits(), (-0.0f32).to_bits(), "{f:?} {isa}: tanh(−0)");
            assert!(ys[4].is_nan(), "{f:?} {isa}: tanh(NaN)");
            // Subnormal and smallest normal inputs: tanh(x) rounds to x.
            assert_eq!(&ys[9..], &xs[9..], "{f:?} {isa}: tanh of tiny x");
            // ±∞, ±MAX, ±10: ±1 exactly from the accurate tanh, the value at the clamp (odd:
            // the same magnitude for both signs) within the bound of ±1 from the rational one.
            for (k, what) in [(2, "±∞"), (5, "±MAX"), (7, "±10")] {
                let (hi, lo) = (ys[k], ys[k + 1]);
                assert_eq!(hi, -lo, "{f:?} {isa}: tanh({what}) odd");
                match f {
                    Tanh::Accurate => assert_eq!(hi, 1.0, "{isa}: tanh({what})"),
                    Tanh::Rational => {
                        check_tanh(f, isa, &[xs[k], xs[k + 1]]);
                    }
                }
            }
        }
    }
}

#[test]
fn tanh_dense_sweep() {
    // Every 97th f32 in [1e-4, 10] and every 1009th below, both signs (about 4.8 M inputs per
    // ISA): below 1e-4 tanh(x) is within 2⁻²⁸·|x| of x, above 9.011 it rounds to ±1 (the
    // special values and the random test cover the rest of the range).
    let (lo, hi) = (1e-4f32.to_bits(), 10f32.to_bits());
    let xs: Vec<f32> = (0..lo)
        .step_by(1009)
        .chain((lo..=hi).step_by(97))
        .flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)])
        .collect();
    for isa in supported_isas("math") {
        for f in Tanh::BOTH {
            let (worst, at) = check_tanh(f, isa, &xs);
            eprintln!(
                "{f:?} tanh {isa}: worst error {worst:.3} ULP at {at:e} over {} inputs \
                 (bound {})",
                xs.len(),
                f.max_ulp()
            );
        }
    }
}

#[test]
fn tanh_same_bits_wherever_a_value_sits() {
    let xs: Vec<f32> = (0..67).map(|i| (i as f32 - 33.0) * 0.037).collect();
    for isa in supported_isas("math") {
        for f in Tanh::BOTH {
            let all = f.run(isa, &xs);
            for start in 0..xs.len() {
                let part = f.run(isa, &xs[start..]);
                for (a, b) in all[start..].iter().zip(&part) {
                    assert_eq!(a.to_bits(), b.to_bits(), "{f:?} {isa}: from offset {start}");
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn tanh_random_inputs_within_the_bound(
        bits in proptest::collection::vec(any::<u32>(), 1..200),
        near in proptest::collection::vec(-12.0f32..12.0, 0..200),
    ) {
        let mut xs: Vec<f32> = bits.into_iter().map(f32::from_bits).collect();
        xs.extend(near);
        for isa in supported_isas("math") {
            for f in Tanh::BOTH {
                check_tanh(f, isa, &xs);
            }
        }
    }
}

/// Every non-negative f32 (both functions are odd lane by lane), on every ISA, against f64
/// `tanh`: the measurement behind `TANH_MAX_ULP` and `TANH_RATIONAL_MAX_ULP`, reported
/// separately below and above 0.625 (the accurate tanh's polynomial and exp branches). Two
/// threads, about a minute per ISA and function in release:
/// `cargo test --release -p attn-tests --test suite -- --ignored exhaustive_tanh --nocapture`.
#[test]
#[ignore]
fn exhaustive_tanh() {
    let split = 0.625f32.to_bits();
    let end = f32::INFINITY.to_bits() + 1; // every non-negative input up to +∞
    for isa in supported_isas("math") {
        for f in Tanh::BOTH {
            let (below, at_below) = worst_over(f, isa, 0, split);
            let (above, at_above) = worst_over(f, isa, split, end);
            check_tanh(f, isa, &[f32::NAN]);
            eprintln!(
                "{f:?} tanh {isa}: worst error {below:.4} ULP at x = {at_below:e} below 0.625, \
                 {above:.4} ULP at x = {at_above:e} above"
            );
        }
    }
}

/// Worst [`check_tanh`] error over the f32 bit patterns `lo..hi`, on all cores.
fn worst_over(f: Tanh, isa: Isa, lo: u32, hi: u32) -> (f64, f32) {
    const CHUNK: u32 = 1 << 16;
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
    let per = (hi - lo).div_ceil(threads);
    let pick = |a: (f64, f32), b: (f64, f32)| if b.0 > a.0 { b } else { a };
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                sc.spawn(move || {
                    let (from, to) = (lo + t * per, (lo + (t + 1) * per).min(hi));
                    let mut worst = (0.0f64, 0.0f32);
                    let mut b = from;
                    while b < to {
                        let n = CHUNK.min(to - b);
                        let xs: Vec<f32> = (b..b + n).map(f32::from_bits).collect();
                        worst = pick(worst, check_tanh(f, isa, &xs));
                        b += n;
                    }
                    worst
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).fold((0.0, 0.0), pick)
    })
}
