//! The int8 K/V layout (`attn_core::quant`): random tensors of f32, bf16 and f16 in both
//! layouts, with tail blocks, quantised and dequantised by the reference (`dequantize_q8`),
//! within the stated round-trip bound (`q8_round_trip_bound`); and what the dequantiser gives
//! for scales the quantiser never writes (0, ±∞, NaN) and for `q = −128`.

use attn_reference::quant::{
    q8_blocks, q8_dequantize, q8_round_trip_bound, quantize_q8, Q8Mut, Q8Ref, Q8_BLOCK,
};
use attn_reference::{dequantize_q8, widen, Error, Tensor4Layout, TensorMut, TensorRef};
use half::{bf16, f16};
use proptest::prelude::*;

/// Which element type a case quantises from.
#[derive(Clone, Copy, Debug)]
enum Src {
    F32,
    Bf16,
    F16,
}

/// Runs one case: `x` laid out by `layout` (bhsd or bshd per `bshd`), of type `src`; checks the
/// scales, the codes and the bound of every element against the reference's dequantisation.
fn check_case(src: Src, x: &[f32], dims: [usize; 4], bshd: bool) {
    let [b, h, s, d] = dims;
    let layout =
        if bshd { Tensor4Layout::bshd(b, s, h, d) } else { Tensor4Layout::bhsd(b, h, s, d) };
    let mut qv = vec![0i8; x.len()];
    let mut qs = vec![f32::NAN; b * h * s * q8_blocks(d)];
    let dst = Q8Mut::bhsd(&mut qv, &mut qs, b, h, s, d);
    // The exact values quantised, in bhsd order.
    let exact = match src {
        Src::F32 => {
            let t = TensorRef::new(x, layout);
            quantize_q8(t, dst).unwrap();
            widen(t).unwrap()
        }
        Src::Bf16 => {
            let xs: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            let t = TensorRef::new(&xs[..], layout);
            quantize_q8(t, dst).unwrap();
            widen(t).unwrap()
        }
        Src::F16 => {
            let xs: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            let t = TensorRef::new(&xs[..], layout);
            quantize_q8(t, dst).unwrap();
            widen(t).unwrap()
        }
    };
    let q = Q8Ref::bhsd(&qv, &qs, b, h, s, d);
    let deq = dequantize_q8(q).unwrap();
    for (row, (xr, yr)) in exact.chunks(d).zip(deq.chunks(d)).enumerate() {
        for (k, (xb, yb)) in xr.chunks(Q8_BLOCK).zip(yr.chunks(Q8_BLOCK)).enumerate() {
            let scale = qs[row * q8_blocks(d) + k];
            let m = xb.iter().fold(0.0f64, |m, v| m.max(v.abs())) as f32;
            assert_eq!(scale, m / 127.0, "row {row} block {k}");
            let codes = &qv[row * d + k * Q8_BLOCK..][..xb.len()];
            assert!(codes.iter().all(|&c| c != -128));
            // With a normal scale the largest magnitude maps to ±127 (a subnormal scale is
            // rounded too coarsely for that).
            if scale >= f32::MIN_POSITIVE {
                assert!(codes.iter().any(|&c| c.abs() == 127), "the max maps to ±127");
            }
            let bound = q8_round_trip_bound(scale);
            for (j, (&xv, &yv)) in xb.iter().zip(yb).enumerate() {
                assert!(
                    (xv - yv).abs() <= bound,
                    "{src:?} row {row} block {k} j {j}: x {xv:e} deq {yv:e} scale {scale:e}"
                );
                assert_eq!(yv, q8_dequantize(codes[j], scale));
            }
        }
    }
}

/// A tensor's values: per row a magnitude `2^e`, `e` in `exps`, some rows all zero, some
/// entries zero.
fn values(n_rows: usize, d: usize, exps: std::ops::Range<i32>) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(
        (
            exps,
            proptest::bool::weighted(0.1),
            proptest::collection::vec((-1.0f32..1.0, proptest::bool::weighted(0.1)), d),
        ),
        n_rows,
    )
    .prop_map(|rows| {
        rows.into_iter()
            .flat_map(|(e, zero_row, xs)| {
                xs.into_iter().map(
                    move |(v, zero)| {
                        if zero_row || zero {
                            0.0
                        } else {
                            v * 2f32.powi(e)
                        }
                    },
                )
            })
            .collect()
    })
}

fn case() -> impl Strategy<Value = (Src, [usize; 4], bool, Vec<f32>)> {
    (
        prop_oneof![Just(Src::F32), Just(Src::Bf16), Just(Src::F16)],
        1usize..3,
        1usize..4,
        0usize..5,
        prop_oneof![1usize..8, 30usize..35, 60usize..70, Just(128)],
        any::<bool>(),
    )
        .prop_flat_map(|(src, b, h, s, d, bshd)| {
            // f16 overflows at 65520 and has subnormals below 2^-14.
            let exps = if matches!(src, Src::F16) { -28..16 } else { -40..40 };
            values(b * h * s, d, exps).prop_map(move |x| (src, [b, h, s, d], bshd, x))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn round_trip_within_bound((src, dims, bshd, x) in case()) {
        check_case(src, &x, dims, bshd);
    }
}

#[test]
fn extreme_magnitudes() {
    // The largest f32 and f16 values, subnormal-scale blocks, and a 33-wide row (tail of 1).
    let d = 33;
    let mut x = vec![0.0f32; 4 * d];
    x[0] = f32::MAX;
    x[1] = -f32::MAX;
    x[2] = 1.0;
    x[d] = 65504.0;
    x[d + 32] = -65504.0;
    for (j, v) in x[2 * d..3 * d].iter_mut().enumerate() {
        *v = f32::from_bits(j as u32 * 3 + 1);
    }
    x[3 * d + 32] = f32::MIN_POSITIVE;
    for src in [Src::F32, Src::F16, Src::Bf16] {
        let mut y = x.clone();
        // f32::MAX rounds to ∞ in bf16 and f16, which the quantiser rejects.
        if !matches!(src, Src::F32) {
            y[0] = 0.0;
            y[1] = 0.0;
        }
        check_case(src, &y, [1, 1, 4, d], false);
    }
}

#[test]
fn special_scales_in_the_dequantiser() {
    // One 2×3 tensor (d = 3, one block per row) per scale; codes 0, 5, −128.
    let codes = [0i8, 5, -128, 0, 5, -128];
    for (scale, want) in [
        (0.0f32, [0.0, 0.0, -0.0]),
        (-0.0, [-0.0, -0.0, 0.0]),
        (f32::INFINITY, [f64::NAN, f64::INFINITY, f64::NEG_INFINITY]),
        (f32::NEG_INFINITY, [f64::NAN, f64::NEG_INFINITY, f64::INFINITY]),
        (f32::NAN, [f64::NAN; 3]),
        (0.25, [0.0, 1.25, -32.0]),
    ] {
        let scales = [scale, scale];
        let out = dequantize_q8(Q8Ref::bhsd(&codes, &scales, 1, 1, 2, 3)).unwrap();
        for (i, &v) in out.iter().enumerate() {
            let w = want[i % 3];
            assert!(
                (v.is_nan() && w.is_nan())
                    || (v == w && v.is_sign_negative() == w.is_sign_negative()),
                "scale {scale}: element {i} is {v}, want {w}"
            );
        }
    }
}

#[test]
fn layout_errors_name_the_argument() {
    let codes = [0i8; 70];
    let scales = [1.0f32; 6];
    let ok = Q8Ref::bhsd(&codes, &scales, 1, 1, 2, 35);
    assert!(dequantize_q8(ok).is_ok());
    let short = Q8Ref::bhsd(&codes, &scales[..3], 1, 1, 2, 35);
    assert_eq!(
        dequantize_q8(short),
        Err(Error::OutOfBounds { arg: "q_scales", required: 4, len: 3 })
    );
    let wrong = Q8Ref::new(
        TensorRef::new(&codes[..], Tensor4Layout::bhsd(1, 1, 2, 35)),
        TensorRef::new(&scales[..], Tensor4Layout::bhsd(1, 1, 3, 2)),
    );
    assert_eq!(
        dequantize_q8(wrong),
        Err(Error::ShapeMismatch { arg: "q_scales", dim: "seq", expected: 2, actual: 3 })
    );
    let mut qv = [0i8; 70];
    let mut qs = [0.0f32; 4];
    let aliased = Q8Mut::new(
        TensorMut::new(&mut qv[..], Tensor4Layout::strided([1, 1, 2, 35], [0, 0, 0, 1], 0)),
        TensorMut::new(&mut qs[..], Tensor4Layout::bhsd(1, 1, 2, 2)),
    );
    let x = [1.0f32; 70];
    assert_eq!(
        quantize_q8(TensorRef::new(&x[..], Tensor4Layout::bhsd(1, 1, 2, 35)), aliased),
        Err(Error::AliasedOutput { arg: "dst" })
    );
}
