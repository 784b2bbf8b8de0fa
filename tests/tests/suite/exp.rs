//! The vectorised exp against f64 `exp`: a dense sweep of every f32 bit pattern whose exp is a
//! normal f32 (stride [`SWEEP_STRIDE`], plus every input in windows around 0, 1 and the range
//! ends), the subnormal range, and the exact edges, on every ISA this CPU supports. The bound
//! checked is the one the doc comment states (`EXP_MAX_ULP`). The softmax's own exp (`x ≤ 0`,
//! `softmax_exp_slice_with_isa`) gets the same treatment over `[−87.34, 0]` and the subnormal
//! range against its stated `SOFTMAX_EXP_MAX_ULP`; both have an ignored exhaustive sweep.

use attn_kernels::math::exp::{
    exp_slice_with_isa, softmax_exp_slice_with_isa, EXP_MAX_ULP, SOFTMAX_EXP_MAX_ULP,
};
use attn_kernels::{Error, Isa};
use attn_tests::numerics::f32_ulp;

/// Every `SWEEP_STRIDE`-th bit pattern (odd, so all residues of the low mantissa bits occur).
/// Inputs with `|x| < 2^−25` all give 1 and take half of the bit patterns: the sweep starts
/// at `2^−25` and visits ~25 M inputs per ISA, a few seconds in the opt-level-3 test profile.
const SWEEP_STRIDE: u32 = 11;
const SWEEP_FROM: f32 = 2.980_232_2e-8; // 2^−25
/// Smallest / largest input whose exp is a normal f32 (`ln 2^−126`, `ln f32::MAX`).
const NORMAL_LO: f32 = -87.33654;
const NORMAL_HI: f32 = 88.72283;

fn ulp_error(x: f32, got: f32) -> f64 {
    let want = f64::from(x).exp();
    (f64::from(got) - want).abs() / f32_ulp(want)
}

/// Which exp a sweep checks.
#[derive(Clone, Copy, Debug)]
enum Which {
    /// The general exp (`exp_slice_with_isa`, `EXP_MAX_ULP`).
    Exp,
    /// The softmax's exp for `x ≤ 0` (`softmax_exp_slice_with_isa`, `SOFTMAX_EXP_MAX_ULP`).
    Softmax,
}

/// Runs the general exp over `xs` and returns the worst ULP error and the input where it occurs.
fn worst(isa: Isa, xs: &[f32]) -> (f64, f32) {
    worst_of(Which::Exp, isa, xs)
}

/// [`worst`] for either exp.
fn worst_of(which: Which, isa: Isa, xs: &[f32]) -> (f64, f32) {
    let mut ys = vec![0.0f32; xs.len()];
    match which {
        Which::Exp => exp_slice_with_isa(isa, xs, &mut ys).unwrap(),
        Which::Softmax => softmax_exp_slice_with_isa(isa, xs, &mut ys).unwrap(),
    }
    xs.iter().zip(&ys).map(|(&x, &y)| (ulp_error(x, y), x)).fold((0.0, 0.0), |a, b| {
        if b.0 > a.0 {
            b
        } else {
            a
        }
    })
}

/// The `2·half + 1` consecutive f32 centred on `x`.
fn around(x: f32, half: u32) -> Vec<f32> {
    let c = x.to_bits();
    (c - half..=c + half).map(f32::from_bits).collect()
}

/// Worst error over every `stride`-th f32 between `lo` and `hi` (same sign), generated chunk by
/// chunk; panics with the input when the bound is exceeded.
fn sweep(isa: Isa, lo: f32, hi: f32, stride: u32, bound: f64, what: &str) -> f64 {
    sweep_of(Which::Exp, isa, lo, hi, stride, bound, what)
}

/// [`sweep`] for either exp.
fn sweep_of(which: Which, isa: Isa, lo: f32, hi: f32, stride: u32, bound: f64, what: &str) -> f64 {
    let (a, b) = (lo.to_bits().min(hi.to_bits()), lo.to_bits().max(hi.to_bits()));
    let chunk = stride * (1 << 20);
    let mut max = 0.0f64;
    let mut start = a;
    while start <= b {
        let end = start.saturating_add(chunk - 1).min(b);
        let xs: Vec<f32> = (start..=end).step_by(stride as usize).map(f32::from_bits).collect();
        let (e, x) = worst_of(which, isa, &xs);
        assert!(e <= bound, "{isa} {what}: {e:.3} ULP at x = {x:e} (bound {bound})");
        max = max.max(e);
        start = match end.checked_add(1) {
            Some(s) => s,
            None => break,
        };
    }
    max
}

#[test]
fn sweep_normal_range_within_stated_ulp() {
    for isa in Isa::supported() {
        let mut max = 0.0f64;
        // Positive and negative halves, every SWEEP_STRIDE-th pattern.
        for (lo, hi) in [(SWEEP_FROM, NORMAL_HI), (-SWEEP_FROM, NORMAL_LO)] {
            max = max.max(sweep(isa, lo, hi, SWEEP_STRIDE, EXP_MAX_ULP, "sweep"));
        }
        // Below 2^−25 every result is 1: a coarser stride down to the smallest subnormal.
        for (lo, hi) in [(1e-45, SWEEP_FROM), (-1e-45, -SWEEP_FROM)] {
            max = max.max(sweep(isa, lo, hi, 1001, EXP_MAX_ULP, "tiny"));
        }
        // Every input (2^18 each side) near 0, where rounding of n changes (±ln2/2, ±3ln2/2),
        // and at both ends of the normal range.
        let ln2 = std::f32::consts::LN_2;
        for c in [1e-3, 0.5 * ln2, 1.5 * ln2, 1.0, 10.0, 88.72, 87.33] {
            for x in [c, -c] {
                let xs: Vec<f32> = around(x, 1 << 18)
                    .into_iter()
                    .filter(|v| (NORMAL_LO..=NORMAL_HI).contains(v))
                    .collect();
                let (e, at) = worst(isa, &xs);
                assert!(e <= EXP_MAX_ULP, "{isa}: {e:.3} ULP at x = {at:e}");
                max = max.max(e);
            }
        }
        eprintln!("{isa}: max error {max:.3} ULP over the normal range");
    }
}

#[test]
fn subnormal_results_within_one_subnormal_ulp() {
    for isa in Isa::supported() {
        // exp(x) ∈ [2^−150, 2^−126): absolute error ≤ EXP_MAX_ULP · 2^−149 (ulp() is 2^−149).
        let max = sweep(isa, NORMAL_LO, -103.97, 1, EXP_MAX_ULP, "subnormal");
        eprintln!("{isa}: max error {max:.3} subnormal ULP");
    }
}

#[test]
fn edges_are_exact() {
    let xs = [
        0.0,
        -0.0,
        f32::NEG_INFINITY,
        f32::INFINITY,
        f32::NAN,
        -f32::NAN,
        88.7229,
        88.8,
        89.0,
        1e10,
        f32::MAX,
        -103.98,
        -104.0,
        -110.0,
        -1e10,
        f32::MIN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        1e-45,
        -1e-45,
        1.0,
    ];
    for isa in Isa::supported() {
        // Every length around the vector widths, so each edge goes through both the full-vector
        // and the masked-tail path.
        for n in 1..=xs.len() {
            let mut y = vec![7.0f32; n];
            exp_slice_with_isa(isa, &xs[..n], &mut y).unwrap();
            for (x, y) in xs[..n].iter().zip(&y) {
                let want = match *x {
                    x if x.is_nan() => f32::NAN,
                    x if x == 0.0 || x.abs() == 1e-45 || x.abs() == f32::MIN_POSITIVE => 1.0,
                    f32::INFINITY => f32::INFINITY,
                    x if x > 88.7229 - 0.0001 => f32::INFINITY,
                    x if x <= -103.98 => 0.0,
                    1.0 => std::f32::consts::E,
                    _ => unreachable!(),
                };
                if want.is_nan() {
                    assert!(y.is_nan(), "{isa}: exp({x}) = {y}");
                } else {
                    assert_eq!(y.to_bits(), want.to_bits(), "{isa}: exp({x}) = {y}, want {want}");
                }
            }
        }
    }
}

#[test]
fn tails_leave_the_rest_untouched_and_bad_lengths_error() {
    for isa in Isa::supported() {
        for n in 0..40 {
            let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 3.0).collect();
            let mut y = vec![f32::NAN; n + 8];
            exp_slice_with_isa(isa, &x, &mut y[..n]).unwrap();
            assert!(y[n..].iter().all(|v| v.is_nan()), "{isa} n={n}: guard band written");
            for (a, b) in x.iter().zip(&y) {
                assert!(ulp_error(*a, *b) <= EXP_MAX_ULP);
            }
        }
        let err = exp_slice_with_isa(isa, &[1.0, 2.0], &mut [0.0]).unwrap_err();
        assert_eq!(err, Error::ShapeMismatch { arg: "y", dim: "len", expected: 2, actual: 1 });
    }
    for isa in Isa::ALL.into_iter().filter(|i| !i.is_supported()) {
        let err = exp_slice_with_isa(isa, &[1.0], &mut [0.0]).unwrap_err();
        assert!(matches!(err, Error::InvalidParameter { arg: "isa", .. }));
    }
}

/// Every f32 of the normal range (~2.2·10⁹ inputs, minutes): `cargo test --release -p
/// attn-tests --test suite -- --ignored exp::`.
#[test]
#[ignore]
fn exhaustive_normal_range() {
    for isa in Isa::supported() {
        for (lo, hi) in [(0.0, NORMAL_HI), (-0.0, NORMAL_LO)] {
            sweep(isa, lo, hi, 1, EXP_MAX_ULP, "exhaustive");
        }
    }
}

/// The softmax's exp over `x ≤ 0`: every `SWEEP_STRIDE`-th input down to the end of the normal
/// range, every input near the points where `n` changes and at the range end, then every input
/// of the subnormal range, against its stated bound `SOFTMAX_EXP_MAX_ULP`.
#[test]
fn softmax_exp_sweep_within_stated_ulp() {
    for isa in Isa::supported() {
        let b = SOFTMAX_EXP_MAX_ULP;
        let mut max = sweep_of(Which::Softmax, isa, -SWEEP_FROM, NORMAL_LO, SWEEP_STRIDE, b, "sm");
        max = max.max(sweep_of(Which::Softmax, isa, -1e-45, -SWEEP_FROM, 1001, b, "sm tiny"));
        let ln2 = std::f32::consts::LN_2;
        for c in [1e-3, 0.5 * ln2, 1.5 * ln2, 1.0, 10.0, 87.33] {
            let xs: Vec<f32> =
                around(-c, 1 << 18).into_iter().filter(|v| (NORMAL_LO..=0.0).contains(v)).collect();
            let (e, at) = worst_of(Which::Softmax, isa, &xs);
            assert!(e <= b, "{isa}: softmax exp {e:.3} ULP at x = {at:e}");
            max = max.max(e);
        }
        let sub = sweep_of(Which::Softmax, isa, NORMAL_LO, -103.97, 1, b, "sm subnormal");
        eprintln!("{isa}: softmax exp max error {max:.3} ULP, subnormal {sub:.3} (bound {b})");
    }
}

#[test]
fn softmax_exp_edges_are_exact() {
    let xs = [0.0, -0.0, f32::NEG_INFINITY, f32::NAN, -103.98, -104.0, -1e10, f32::MIN, -1e-45];
    for isa in Isa::supported() {
        for n in 1..=xs.len() {
            let mut y = vec![7.0f32; n];
            softmax_exp_slice_with_isa(isa, &xs[..n], &mut y).unwrap();
            for (x, y) in xs[..n].iter().zip(&y) {
                let want = match *x {
                    x if x.is_nan() => f32::NAN,
                    x if x == 0.0 || x == -1e-45 => 1.0,
                    _ => 0.0,
                };
                if want.is_nan() {
                    assert!(y.is_nan(), "{isa}: exp({x}) = {y}");
                } else {
                    assert_eq!(y.to_bits(), want.to_bits(), "{isa}: exp({x}) = {y}, want {want}");
                }
            }
        }
        let err = softmax_exp_slice_with_isa(isa, &[-1.0, -2.0], &mut [0.0]).unwrap_err();
        assert_eq!(err, Error::ShapeMismatch { arg: "y", dim: "len", expected: 2, actual: 1 });
    }
}

/// Every f32 in `[−87.34, 0]` (~1.1·10⁹ inputs) for the softmax's exp: `cargo test --release
/// -p attn-tests --test suite -- --ignored exp::`.
#[test]
#[ignore]
fn exhaustive_softmax_exp() {
    for isa in Isa::supported() {
        let m = sweep_of(Which::Softmax, isa, -0.0, NORMAL_LO, 1, SOFTMAX_EXP_MAX_ULP, "exh");
        eprintln!("{isa}: softmax exp max error {m:.4} ULP over every x in [{NORMAL_LO}, 0]");
    }
}
