//! The kernels' elementwise math against the f64 reference: GELU (tanh form) on every ISA this
//! CPU runs, held to the bound built from its published constants
//! (`attn_tests::numerics::gelu_tanh_bound`): special values exactly, a dense sweep of the range
//! where it varies, random inputs over the whole f32 range, and position independence.

use attn_kernels::math::gelu_tanh_with_isa;
use attn_kernels::{Activation, Isa};
use attn_reference::activate;
use attn_tests::numerics::gelu_tanh_bound;
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
