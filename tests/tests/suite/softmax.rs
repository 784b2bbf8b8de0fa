//! The fused scale-mask-softmax, log-softmax and logsumexp against the reference, on every ISA
//! this CPU supports.
//!
//! Tolerances come from the error analysis in `attn_kernels::softmax` (module docs), term by
//! term, with `u = 2⁻²⁴`, `E = SOFTMAX_EXP_MAX_ULP` (the
//! softmax's own exp for arguments `≤ 0`):
//! - logits: `ẑ_j` is `z_j` rounded once (twice for the portable ISA without FMA), so
//!   `|ẑ_j − z_j| ≤ ζ_j = u(|s·x_j| + |z_j|)(1 + 2u)`, and 0 when `s·x_j` and `z_j` are f32
//!   already (scale 1 or a power of two with dyadic data: the special-value cases);
//! - the max moves by at most `ζ_max = max_j ζ_j`; `ẑ_j − m̂` rounds once: the exponent of
//!   element `j` is off by at most `δ_j = ζ_j + ζ_max + u|d_j|`, `d_j = z_j − m`;
//! - `exp` is within `E` ULP, i.e. relative `2Eu`, or `E·2⁻¹⁴⁹` absolute for subnormals;
//! - the f32 sum of `n` terms is within `γ_n = nu/(1 − nu)` relative, in any order;
//! - `1/Σ` and the product each round once: `(1 ± u)²`.
//!
//! So `ê_j ∈ [e^(d_j − δ_j)(1 − 2Eu) − E·2⁻¹⁴⁹, e^(d_j + δ_j)(1 + 2Eu) + E·2⁻¹⁴⁹]`, and `ŷ_j`
//! lies between the lower end over the largest possible sum and the upper end over the
//! smallest, within `(1 ± u)²` and half a subnormal. Exact conventions (masked → 0, fully
//! masked → zeros and lse −∞, NaN rows, +∞ sharing) are compared bit for bit.

use attn_kernels::arch::convert::Convertible;
use attn_kernels::softmax::{
    log_softmax_with_isa, logsumexp_with_isa, scale_mask_softmax_inplace_with_isa,
    scale_mask_softmax_with_isa, SOFTMAX_EXP_MAX_ULP,
};
use attn_kernels::{bf16, f16, DType, Isa, Mask, MatLayout, Parallelism, Tensor4Layout};
use attn_reference::softmax as reference;
use attn_reference::{MatMut, MatRef, TensorMut, TensorRef};
use proptest::prelude::*;

use attn_tests::numerics::{
    BF16_SUBNORMAL_HALF, BF16_U, F16_SUBNORMAL_HALF, F16_U, SUBNORMAL_ULP as SUBNORMAL, U,
};

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

/// A test case: input, its layout, the output layout, mask data, scale.
#[derive(Clone, Debug)]
struct Case {
    dims: [usize; 4],
    x: Vec<f32>,
    x_layout: Tensor4Layout,
    y_layout: Tensor4Layout,
    scale: f32,
    mask: MaskSpec,
}

#[derive(Clone, Debug)]
enum MaskSpec {
    None,
    Causal(Option<isize>),
    Keep(Vec<bool>, Tensor4Layout),
    Bias(Vec<f32>, Tensor4Layout),
}

impl MaskSpec {
    fn mask(&self) -> Mask<'_> {
        match self {
            MaskSpec::None => Mask::None,
            MaskSpec::Causal(offset) => Mask::Causal { offset: *offset },
            MaskSpec::Keep(k, l) => Mask::Keep { keep: k, layout: *l },
            MaskSpec::Bias(b, l) => Mask::Bias { bias: b, layout: *l },
        }
    }
}

/// Per-row expectations built from the reference's f64 logits.
struct RowBound {
    /// `(lo, hi)` for each column; masked columns are `None`.
    interval: Vec<Option<(f64, f64)>>,
    /// Reference f64 probabilities and logsumexp.
    p: Vec<f64>,
    lse: f64,
    lse_tol: f64,
    visible: usize,
}

fn row_bound(case: &Case, b: usize, h: usize, i: usize) -> RowBound {
    let [_, _, rows, cols] = case.dims;
    let mask = case.mask.mask();
    let s = f64::from(case.scale);
    // (z_j, ζ_j) for visible columns, as the reference forms them.
    let terms: Vec<Option<(f64, f64)>> = (0..cols)
        .map(|j| {
            mask.term(b, h, i, j, rows, cols).map(|t| {
                let sx = s * f64::from(case.x[case.x_layout.index(b, h, i, j)]);
                let z = sx + f64::from(t);
                let exact = |v: f64| !v.is_finite() || f64::from(v as f32) == v;
                let zeta = if exact(sx) && exact(z) {
                    0.0
                } else {
                    U * (sx.abs() + z.abs()) * (1.0 + 2.0 * U)
                };
                (z, zeta)
            })
        })
        .collect();
    let logits: Vec<Option<f64>> = terms.iter().map(|t| t.map(|(z, _)| z)).collect();
    let (p, lse) = reference::softmax_row(&logits);
    let visible = terms.iter().flatten().count();
    let m = logits.iter().flatten().copied().fold(f64::NEG_INFINITY, f64::max);
    let zeta_max = terms.iter().flatten().map(|t| t.1).fold(0.0, f64::max);
    let e_rel = 2.0 * SOFTMAX_EXP_MAX_ULP * U;
    let e_abs = SOFTMAX_EXP_MAX_ULP * SUBNORMAL;
    let mut lo_e = vec![0.0; cols];
    let mut hi_e = vec![0.0; cols];
    for (j, t) in terms.iter().enumerate() {
        if let Some((z, zeta)) = t {
            let d = z - m;
            if d == f64::NEG_INFINITY {
                continue; // ẑ_j = −∞ too: exp gives exactly 0.
            }
            let delta = zeta + zeta_max + U * d.abs();
            lo_e[j] = ((d - delta).exp() * (1.0 - e_rel) - e_abs).max(0.0);
            // ẑ_j − m̂ ≤ 0, so ê_j ≤ exp(0)(1 + 2Eu) whatever δ_j says.
            hi_e[j] = ((d + delta).exp() * (1.0 + e_rel) + e_abs).min(1.0 + e_rel);
        }
    }
    let g = gamma(visible);
    // The computed sum includes exp(0) = 1 exactly (the max), and f32 rounding is monotone.
    let s_lo = (lo_e.iter().sum::<f64>() * (1.0 - g)).max(1.0);
    let s_hi = hi_e.iter().sum::<f64>() * (1.0 + g);
    let interval = terms
        .iter()
        .enumerate()
        .map(|(j, t)| {
            t.map(|_| {
                (
                    lo_e[j] / s_hi * (1.0 - U).powi(2) - SUBNORMAL,
                    hi_e[j] / s_lo * (1.0 + U).powi(2) + SUBNORMAL,
                )
            })
        })
        .collect();
    // lse = m̂ + ln Ŝ: the max moves by ζ_max, ln Ŝ by the log of the sum interval; both the
    // kernel and the reference round the result to f32.
    let s_exact: f64 = terms.iter().flatten().map(|(z, _)| (z - m).exp()).sum();
    let ln_tol = (s_hi / s_exact).ln().max((s_exact / s_lo).ln());
    let lse_tol = zeta_max + ln_tol + 2.0 * U * lse.abs();
    RowBound { interval, p, lse, lse_tol, visible }
}

/// Checks `y` (output view) and `lse` of one call against the bounds.
fn check_case(case: &Case, y: &[f32], lse: &[f32], what: &str) -> Result<(), TestCaseError> {
    let [batch, heads, rows, cols] = case.dims;
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..rows {
                let rb = row_bound(case, b, h, i);
                let got = |j: usize| y[case.y_layout.index(b, h, i, j)];
                let l = lse[(b * heads + h) * rows + i];
                let ctx = format!("{what} row ({b},{h},{i}) cols {cols}");
                if rb.lse.is_nan() {
                    for j in 0..cols {
                        prop_assert!(got(j).is_nan(), "{ctx}: NaN row expected at {j}");
                    }
                    prop_assert!(l.is_nan(), "{ctx}: lse {l}");
                    continue;
                }
                if rb.lse.is_infinite() {
                    // Fully masked / all −∞ (zeros, −∞) or +∞ sharing: exact.
                    for j in 0..cols {
                        prop_assert_eq!(got(j).to_bits(), (rb.p[j] as f32).to_bits(), "{}", ctx);
                    }
                    prop_assert_eq!(l, rb.lse as f32, "{}", ctx);
                    continue;
                }
                let mut sum = 0.0f64;
                for (j, iv) in rb.interval.iter().enumerate() {
                    let v = got(j);
                    sum += f64::from(v);
                    match iv {
                        None => prop_assert_eq!(v.to_bits(), 0, "{}: masked col {} not +0", ctx, j),
                        Some((lo, hi)) => {
                            let v = f64::from(v);
                            prop_assert!(
                                *lo <= v && v <= *hi,
                                "{ctx} col {j}: {v:e} outside [{lo:e}, {hi:e}] (p = {:e})",
                                rb.p[j]
                            );
                            // Equivalence with the reference's own f32 output.
                            let r = f64::from(rb.p[j] as f32);
                            let tol = (hi - rb.p[j]).max(rb.p[j] - lo) + U * r;
                            prop_assert!((v - r).abs() <= tol, "{ctx} col {j}: {v:e} vs ref {r:e}");
                        }
                    }
                }
                // Rows sum to one within (1 ± u)²(1 ± γ_n) plus subnormal rounding.
                let n = rb.visible;
                let sum_tol = (1.0 + U).powi(2) * (1.0 + gamma(n)) - 1.0 + n as f64 * SUBNORMAL;
                prop_assert!((sum - 1.0).abs() <= sum_tol, "{ctx}: sum {sum} (tol {sum_tol:e})");
                let dl = (f64::from(l) - rb.lse).abs();
                prop_assert!(
                    dl <= rb.lse_tol,
                    "{ctx}: lse {l} vs {} (tol {:e})",
                    rb.lse,
                    rb.lse_tol
                );
            }
        }
    }
    Ok(())
}

/// Runs the reference and every supported ISA (out of place, in place, 2 threads) on a case.
fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let [batch, heads, rows, _] = case.dims;
    let mask = case.mask.mask();
    let ylen = case.y_layout.required_len().unwrap();
    let nrows = batch * heads * rows;
    let x = TensorRef::new(&case.x, case.x_layout);
    // The reference accepts the same inputs (and must, for the comparison to mean anything).
    let mut y_ref = vec![f32::NAN; ylen];
    let mut lse_ref = vec![0.0; nrows];
    reference::scale_mask_softmax(
        x,
        case.scale,
        &mask,
        TensorMut::new(&mut y_ref, case.y_layout),
        Some(&mut lse_ref),
    )
    .unwrap();
    for isa in Isa::supported() {
        let mut y = vec![f32::NAN; ylen];
        let mut lse = vec![0.0; nrows];
        let seq = Parallelism::Sequential;
        let yv = TensorMut::new(&mut y, case.y_layout);
        scale_mask_softmax_with_isa(isa, x, case.scale, &mask, yv, Some(&mut lse), seq).unwrap();
        check_case(case, &y, &lse, isa.name())?;
        // Positions outside the output view stay untouched (guard band of NaN).
        let inside = view_positions(&case.y_layout);
        for (k, v) in y.iter().enumerate() {
            if !inside[k] {
                prop_assert!(v.is_nan(), "{isa}: wrote outside the view at {k}");
            }
        }
        // In place equals out of place, bit for bit: copy x into y's layout first.
        let mut z = vec![f32::NAN; ylen];
        for_each_index(case.dims, |b, h, i, j| {
            z[case.y_layout.index(b, h, i, j)] = case.x[case.x_layout.index(b, h, i, j)];
        });
        let mut lse2 = vec![0.0; nrows];
        let zv = TensorMut::new(&mut z, case.y_layout);
        scale_mask_softmax_inplace_with_isa(isa, zv, case.scale, &mask, Some(&mut lse2), seq)
            .unwrap();
        prop_assert!(bits(&z) == bits(&y), "{isa}: in place differs from out of place");
        prop_assert!(bits(&lse2) == bits(&lse), "{isa}: in-place lse differs");
    }
    Ok(())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn for_each_index(dims: [usize; 4], mut f: impl FnMut(usize, usize, usize, usize)) {
    for b in 0..dims[0] {
        for h in 0..dims[1] {
            for i in 0..dims[2] {
                for j in 0..dims[3] {
                    f(b, h, i, j);
                }
            }
        }
    }
}

fn view_positions(l: &Tensor4Layout) -> Vec<bool> {
    let mut inside = vec![false; l.required_len().unwrap()];
    for_each_index(l.dims, |b, h, i, j| inside[l.index(b, h, i, j)] = true);
    inside
}

// ---- Strategies ----

/// Row lengths: anything in 0..=300, biased toward the vector widths ± 1.
fn cols() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..=300,
        prop::sample::select(vec![1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65]),
    ]
}

/// Values: ordinary logits at a few magnitudes, plus special values now and then.
fn value(sigma: f32) -> impl Strategy<Value = f32> {
    prop_oneof![
        40 => (-1.0f32..1.0).prop_map(move |v| v * sigma),
        1 => prop::sample::select(vec![
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e30,
            -1e30,
            1e-40,
            -1e-40,
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            88.0,
            -200.0,
        ]),
    ]
}

/// A layout for `dims`: `bhsd`, `bshd`, or with every stride doubled (odd strides, gaps), with
/// a random offset.
fn layout(dims: [usize; 4], kind: u8, offset: usize) -> Tensor4Layout {
    let [b, h, s, d] = dims;
    let mut l = match kind % 3 {
        0 => Tensor4Layout::bhsd(b, h, s, d),
        1 => Tensor4Layout::bshd(b, s, h, d),
        _ => {
            let t = Tensor4Layout::bhsd(b, h, s, d);
            Tensor4Layout::strided(dims, t.strides.map(|v| v * 2), 0)
        }
    };
    l.offset = offset;
    l
}

fn mask_spec(dims: [usize; 4]) -> impl Strategy<Value = MaskSpec> {
    let [b, h, nq, nk] = dims;
    let n = b * h * nq * nk;
    prop_oneof![
        Just(MaskSpec::None),
        prop::option::of(-6isize..=6).prop_map(MaskSpec::Causal),
        // Full keep-mask, or a key-padding mask broadcast over heads and queries.
        (prop::sample::select(vec![0.0, 0.3, 0.9, 1.0]), any::<bool>(), any::<u64>()).prop_map(
            move |(p, broadcast, seed)| {
                let mut rng = seed;
                let mut coin = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    (rng >> 11) as f64 / (1u64 << 53) as f64 <= p
                };
                if broadcast {
                    let keep = (0..b * nk).map(|_| coin()).collect();
                    let l = Tensor4Layout::strided(dims, [nk, 0, 0, 1], 0);
                    MaskSpec::Keep(keep, l)
                } else {
                    let keep = (0..n).map(|_| coin()).collect();
                    MaskSpec::Keep(keep, Tensor4Layout::bhsd(b, h, nq, nk))
                }
            }
        ),
        // Bias per head broadcast over batch (ALiBi-like), with −∞ entries sometimes.
        (prop::collection::vec(value(4.0), h * nq * nk), any::<bool>()).prop_map(
            move |(bias, neg_inf)| {
                let bias = bias
                    .into_iter()
                    .enumerate()
                    .map(|(k, v)| if neg_inf && k % 3 == 0 { f32::NEG_INFINITY } else { v })
                    .collect();
                MaskSpec::Bias(bias, Tensor4Layout::strided(dims, [0, nq * nk, nk, 1], 0))
            }
        ),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=2, 1usize..=2, 0usize..=3, cols(), 0u8..3, 0u8..3, 0usize..3)
        .prop_flat_map(|(b, h, s, d, xk, yk, off)| {
            let dims = [b, h, s, d];
            let x_layout = layout(dims, xk, off);
            let y_layout = layout(dims, yk, 2 - off);
            let len = x_layout.required_len().unwrap();
            let sigma = prop::sample::select(vec![0.5f32, 4.0, 40.0]);
            let scale =
                prop_oneof![prop::sample::select(vec![1.0f32, 0.125, 2.0, -1.0]), -3.0f32..3.0,];
            (
                Just(dims),
                sigma.prop_flat_map(move |s| prop::collection::vec(value(s), len)),
                Just(x_layout),
                Just(y_layout),
                scale,
                mask_spec(dims),
            )
        })
        .prop_map(|(dims, x, x_layout, y_layout, scale, mask)| Case {
            dims,
            x,
            x_layout,
            y_layout,
            scale,
            mask,
        })
}

/// Half-precision inputs and outputs: every pair of element types `X → Y` but f32 → f32, on
/// every ISA, in the case's layouts and mask. The typed call must give, bit for bit, the f32
/// call on the widened inputs with each output rounded once to `Y` (and the same logsumexps);
/// nothing outside the output view is written; in place (`Y = X`) equals out of place. And
/// against the reference on the widened values: each output within the f32 bounds of
/// [`row_bound`] widened by one rounding to `Y` (`2⁻⁸` relative for bf16 plus `2⁻¹³⁴` absolute
/// among its subnormals, `2⁻¹¹` for f16 plus `2⁻²⁵` absolute below its normal range).
fn run_typed_case<X: Convertible, Y: Convertible>(c: &Case) -> Result<(), TestCaseError> {
    let [batch, heads, rows, _] = c.dims;
    let nrows = batch * heads * rows;
    let mask = c.mask.mask();
    let ylen = c.y_layout.required_len().unwrap();
    let xs: Vec<X> = c.x.iter().map(|&v| X::from_f32(v)).collect();
    // The case on the values the typed input represents (what the reference computes on).
    let widened = Case { x: xs.iter().map(|v| v.to_f32()).collect(), ..c.clone() };
    let sentinel = Y::from_f32(-7.0);
    let (u_out, abs_out) = match Y::DTYPE {
        DType::BF16 => (BF16_U, BF16_SUBNORMAL_HALF),
        DType::F16 => (F16_U, F16_SUBNORMAL_HALF),
        _ => (0.0, 0.0),
    };
    let seq = Parallelism::Sequential;
    for isa in Isa::supported() {
        let what = format!("{isa} {:?} -> {:?}", X::DTYPE, Y::DTYPE);
        let mut y32 = vec![f32::NAN; ylen];
        let mut lse32 = vec![0.0; nrows];
        let xw = TensorRef::new(&widened.x, c.x_layout);
        let yv = TensorMut::new(&mut y32, c.y_layout);
        scale_mask_softmax_with_isa(isa, xw, c.scale, &mask, yv, Some(&mut lse32), seq).unwrap();
        let mut y = vec![sentinel; ylen];
        let mut lse = vec![0.0; nrows];
        let yv = TensorMut::new(&mut y, c.y_layout);
        let xt = TensorRef::new(&xs, c.x_layout);
        scale_mask_softmax_with_isa(isa, xt, c.scale, &mask, yv, Some(&mut lse), seq).unwrap();
        let inside = view_positions(&c.y_layout);
        for (k, v) in y.iter().enumerate() {
            let want = if inside[k] { Y::from_f32(y32[k]) } else { sentinel };
            prop_assert!(
                v.to_f32().to_bits() == want.to_f32().to_bits(),
                "{what}: element {k} is {v:?}, want {want:?}"
            );
        }
        prop_assert!(bits(&lse) == bits(&lse32), "{what}: logsumexps differ from f32's");
        // Against the reference, on the widened values.
        for b in 0..batch {
            for h in 0..heads {
                for i in 0..rows {
                    let rb = row_bound(&widened, b, h, i);
                    if !rb.lse.is_finite() {
                        continue; // special rows: exact, covered by the bitwise check above
                    }
                    for (j, iv) in rb.interval.iter().enumerate() {
                        let v = f64::from(y[c.y_layout.index(b, h, i, j)].to_f32());
                        let (lo, hi) = iv.unwrap_or((0.0, 0.0));
                        let (lo, hi) = (lo * (1.0 - u_out) - abs_out, hi * (1.0 + u_out) + abs_out);
                        prop_assert!(
                            lo <= v && v <= hi,
                            "{what} ({b},{h},{i}) col {j}: {v:e} outside [{lo:e}, {hi:e}]"
                        );
                    }
                }
            }
        }
        // In place, when the output has the input's type.
        if X::DTYPE == Y::DTYPE {
            let mut z = vec![sentinel; ylen];
            for_each_index(c.dims, |b, h, i, j| {
                let v = xs[c.x_layout.index(b, h, i, j)].to_f32();
                z[c.y_layout.index(b, h, i, j)] = Y::from_f32(v);
            });
            let mut lse2 = vec![0.0; nrows];
            let zv = TensorMut::new(&mut z, c.y_layout);
            scale_mask_softmax_inplace_with_isa(isa, zv, c.scale, &mask, Some(&mut lse2), seq)
                .unwrap();
            let same = z.iter().zip(&y).all(|(a, b)| a.to_f32().to_bits() == b.to_f32().to_bits());
            prop_assert!(same, "{what}: in place differs from out of place");
            prop_assert!(bits(&lse2) == bits(&lse), "{what}: in-place lse differs");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// Every mask kind, row lengths 0..=300 and the vector widths, special values, odd
    /// layouts: within the derived bounds of the reference; in place = out of place.
    #[test]
    fn equals_reference_within_derived_bounds(c in case()) {
        run_case(&c)?;
    }

    /// bf16 and f16 logits and outputs: see [`run_typed_case`].
    #[test]
    fn half_precision_equals_f32_on_widened_values(c in case()) {
        run_typed_case::<bf16, bf16>(&c)?;
        run_typed_case::<bf16, f32>(&c)?;
        run_typed_case::<f16, f16>(&c)?;
        run_typed_case::<f16, f32>(&c)?;
        run_typed_case::<f32, bf16>(&c)?;
        run_typed_case::<f32, f16>(&c)?;
        run_typed_case::<bf16, f16>(&c)?;
    }

    /// Log-softmax and logsumexp of a matrix against the reference.
    #[test]
    fn log_softmax_and_logsumexp_match(
        rows in 0usize..4,
        cols in cols(),
        seed in prop::collection::vec(value(30.0), 4 * 300),
    ) {
        let x = &seed[..rows * cols];
        let xm = MatRef::row_major(x, rows, cols);
        let mut y_ref = vec![0.0; rows * cols];
        reference::log_softmax(xm, MatMut::row_major(&mut y_ref, rows, cols)).unwrap();
        let lse_ref = reference::logsumexp(xm).unwrap();
        for isa in Isa::supported() {
            let mut y = vec![0.0; rows * cols];
            let ym = MatMut::row_major(&mut y, rows, cols);
            log_softmax_with_isa(isa, xm, ym, Parallelism::Sequential).unwrap();
            let lse = logsumexp_with_isa(isa, xm, Parallelism::Sequential).unwrap();
            for i in 0..rows {
                let case = Case {
                    dims: [1, 1, 1, cols],
                    x: x[i * cols..(i + 1) * cols].to_vec(),
                    x_layout: Tensor4Layout::bhsd(1, 1, 1, cols),
                    y_layout: Tensor4Layout::bhsd(1, 1, 1, cols),
                    scale: 1.0,
                    mask: MaskSpec::None,
                };
                let rb = row_bound(&case, 0, 0, 0);
                let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                if rb.lse.is_finite() {
                    prop_assert!((f64::from(lse[i]) - rb.lse).abs() <= rb.lse_tol, "{isa} lse");
                } else {
                    prop_assert!(same(lse[i], lse_ref[i]), "{isa} lse {} vs {}", lse[i], lse_ref[i]);
                }
                for j in 0..cols {
                    let (a, r) = (y[i * cols + j], y_ref[i * cols + j]);
                    if !rb.lse.is_finite() || !r.is_finite() {
                        prop_assert!(same(a, r), "{isa} ({i},{j}): {a} vs {r}");
                    } else {
                        // y = x − lse: the lse error plus one rounding on each side.
                        let tol = rb.lse_tol + U * (f64::from(a).abs() + f64::from(r).abs());
                        prop_assert!((f64::from(a) - f64::from(r)).abs() <= tol, "{isa} ({i},{j})");
                    }
                }
            }
        }
    }
}

/// Rows whose range `max − min` of the logits is just below and just above 87, where the
/// kernel switches from its table exp to the full-range one (subnormal results, `−∞`), each
/// within the derived bounds: ranges 80…120, with and without a keep-mask (a row with masked
/// lanes runs the table exp with them zeroed, and its groups holding a finite lane below
/// the table's range take the full-range exp).
#[test]
fn rows_on_both_sides_of_the_table_exp_range() {
    for range in [80.0f32, 86.9, 87.0, 87.1, 95.0, 104.5, 120.0] {
        let cols = 301;
        let dims = [1, 2, 3, cols];
        let layout = Tensor4Layout::bhsd(1, 2, 3, cols);
        // Logits from 0 down to −range, shuffled, per row; scale 0.5 on doubled values.
        let x: Vec<f32> = (0..layout.len())
            .map(|k| -(((k * 37) % cols) as f32) / (cols - 1) as f32 * range * 2.0)
            .collect();
        let keep: Vec<bool> = (0..cols).map(|j| j % 7 != 3).collect();
        let masks = [
            MaskSpec::None,
            MaskSpec::Causal(Some(200)),
            MaskSpec::Keep(keep, Tensor4Layout::strided(dims, [0, 0, 0, 1], 0)),
        ];
        for mask in masks {
            let case =
                Case { dims, x: x.clone(), x_layout: layout, y_layout: layout, scale: 0.5, mask };
            if let Err(e) = run_case(&case) {
                panic!("range {range}: {e}");
            }
        }
    }
}

/// Contiguous tensors whose mask rows (if any) have contiguous columns take a fast path (whole
/// blocks of rows per call into the row kernel); every other layout takes the general per-row
/// path. Both must give the same bits: the input is also copied into a padded layout (row
/// stride `cols + 3`, general path), out of place and in place, with the lse, below and above
/// the thread threshold, for scales that do and do not fold into the table exp, rows holding
/// NaN, `±∞` and `±1e30` (the special-row and full-range exp paths), causal offsets that hide
/// every row, hide the first rows, cut rows and show everything, and keep-masks and biases
/// (broadcast over heads and queries, or over batches, at an offset into their slice, or with
/// strided columns, which a single column makes contiguous) with a fully hidden row and `−∞`
/// biases.
#[test]
fn contiguous_fast_path_equals_general_path() {
    for (dims, par) in [
        ([2, 3, 37, 301], Parallelism::Sequential),
        ([2, 3, 80, 301], Parallelism::threads(2)),
        ([1, 2, 9, 64], Parallelism::Sequential),
        // One column: every mask layout counts as contiguous (the block path).
        ([2, 3, 5, 1], Parallelism::Sequential),
    ] {
        let n: usize = dims.iter().product();
        let cols = dims[3];
        let nrows = n / cols;
        let mut x: Vec<f32> = (0..n).map(|k| ((k * 7919 % 1000) as f32 - 500.0) * 0.05).collect();
        // Row 1: a NaN; row 2: +∞; row 3: −∞ and −1e30 (wide range: the full-range exp);
        // row 4: +1e30.
        x[cols + 7] = f32::NAN;
        x[2 * cols + 3] = f32::INFINITY;
        x[3 * cols] = f32::NEG_INFINITY;
        x[3 * cols + 5] = -1e30;
        x[4 * cols + 1] = 1e30;
        let dense = Tensor4Layout::bhsd(dims[0], dims[1], dims[2], dims[3]);
        let pitch = cols + 3;
        let padded =
            Tensor4Layout::strided(dims, [dims[1] * dims[2] * pitch, dims[2] * pitch, pitch, 1], 0);
        let pad = |v: &[f32]| {
            let mut p = vec![f32::NAN; padded.required_len().unwrap()];
            for r in 0..nrows {
                p[r * pitch..r * pitch + cols].copy_from_slice(&v[r * cols..(r + 1) * cols]);
            }
            p
        };
        let unpad = |p: &[f32]| -> Vec<f32> {
            (0..nrows).flat_map(|r| p[r * pitch..r * pitch + cols].to_vec()).collect()
        };
        let xp = pad(&x);
        let [_, heads, q, _] = dims;
        // A keep-mask per row, at offset 2 in its slice, every fifth key hidden and row 6 all
        // hidden; a key-padding mask (per batch); a bias shared by the batches, at offset 1,
        // with −∞ entries and row 7 all −∞.
        let mut keep: Vec<bool> = (0..n + 2).map(|k| k % 5 != 0).collect();
        keep[2 + 6 * cols..2 + 7 * cols].fill(false);
        let pads: Vec<bool> = (0..dims[0] * cols).map(|k| k % 7 != 3).collect();
        let mut bias: Vec<f32> = (0..1 + heads * q * cols)
            .map(|k| if k % 17 == 0 { f32::NEG_INFINITY } else { (k % 13) as f32 * -0.5 })
            .collect();
        bias[1 + 7 * cols..1 + 8 * cols].fill(f32::NEG_INFINITY);
        let rowwise = Tensor4Layout::strided(dims, [heads * q * cols, q * cols, cols, 1], 2);
        // Every seventh element: strided columns (the general path, unless there is one).
        let spread_keep: Vec<bool> = (0..7 * n).map(|k| k % 3 != 1).collect();
        let spread =
            Tensor4Layout::strided(dims, [7 * heads * q * cols, 7 * q * cols, 7 * cols, 7], 0);
        let masks = [
            Mask::Keep { keep: &keep, layout: rowwise },
            Mask::Keep { keep: &spread_keep, layout: spread },
            Mask::Keep { keep: &pads, layout: Tensor4Layout::strided(dims, [cols, 0, 0, 1], 0) },
            Mask::Bias {
                bias: &bias,
                layout: Tensor4Layout::strided(dims, [0, q * cols, cols, 1], 1),
            },
            Mask::None,
            Mask::Causal { offset: None },
            Mask::Causal { offset: Some(isize::MIN) },
            Mask::Causal { offset: Some(-5) },
            Mask::Causal { offset: Some(0) },
            Mask::Causal { offset: Some(cols as isize) },
        ];
        for isa in Isa::supported() {
            for mask in &masks {
                for scale in [0.6f32, 0.125] {
                    let ctx = format!("{isa} {mask:?} {dims:?} scale {scale}");
                    let run = |xv: TensorRef<'_>| {
                        let (mut y, mut lse) = (vec![0.0; n], vec![0.0; nrows]);
                        let yv = TensorMut::new(&mut y, dense);
                        scale_mask_softmax_with_isa(isa, xv, scale, mask, yv, Some(&mut lse), par)
                            .unwrap();
                        (bits(&y), bits(&lse))
                    };
                    let fast = run(TensorRef::new(&x, dense));
                    assert_eq!(fast, run(TensorRef::new(&xp, padded)), "{ctx}");
                    // In place: the contiguous copy (fast) against the padded one (general).
                    let mut z = x.clone();
                    let mut zp = xp.clone();
                    let zv = TensorMut::new(&mut z, dense);
                    scale_mask_softmax_inplace_with_isa(isa, zv, scale, mask, None, par).unwrap();
                    let zpv = TensorMut::new(&mut zp, padded);
                    scale_mask_softmax_inplace_with_isa(isa, zpv, scale, mask, None, par).unwrap();
                    assert_eq!(bits(&z), bits(&unpad(&zp)), "{ctx}: in place");
                    assert_eq!(bits(&z), fast.0, "{ctx}: in place against out of place");
                }
            }
        }
    }
}

/// Threads change nothing: the same bits as sequential, above the parallel threshold, for each
/// mask kind and both the out-of-place and in-place forms.
#[test]
fn threaded_equals_sequential_bitwise() {
    let dims = [2, 3, 80, 301];
    let n: usize = dims.iter().product();
    assert!(n >= attn_kernels::softmax::PAR_MIN_ELEMENTS);
    let x: Vec<f32> = (0..n).map(|k| ((k * 7919 % 1000) as f32 - 500.0) * 0.03).collect();
    let l = Tensor4Layout::bhsd(dims[0], dims[1], dims[2], dims[3]);
    let keep: Vec<bool> = (0..dims[0] * dims[3]).map(|k| k % 5 != 0).collect();
    let bias: Vec<f32> = (0..dims[1] * dims[2] * dims[3]).map(|k| (k % 13) as f32 * -0.5).collect();
    let masks = [
        Mask::None,
        Mask::Causal { offset: None },
        Mask::Keep { keep: &keep, layout: Tensor4Layout::strided(dims, [dims[3], 0, 0, 1], 0) },
        Mask::Bias {
            bias: &bias,
            layout: Tensor4Layout::strided(dims, [0, dims[2] * dims[3], dims[3], 1], 0),
        },
    ];
    let two = Parallelism::threads(2);
    for isa in Isa::supported() {
        for mask in &masks {
            let run = |par: Parallelism| {
                let mut y = vec![0.0; n];
                let mut lse = vec![0.0; n / dims[3]];
                let yv = TensorMut::new(&mut y, l);
                let xv = TensorRef::new(&x, l);
                scale_mask_softmax_with_isa(isa, xv, 0.7, mask, yv, Some(&mut lse), par).unwrap();
                let mut z = x.clone();
                let zv = TensorMut::new(&mut z, l);
                scale_mask_softmax_inplace_with_isa(isa, zv, 0.7, mask, None, par).unwrap();
                assert_eq!(bits(&z), bits(&y), "{isa} {mask:?}: in place");
                (bits(&y), bits(&lse))
            };
            assert_eq!(run(Parallelism::Sequential), run(two), "{isa} {mask:?}");
        }
        let xm = MatRef::row_major(&x, n / 301, 301);
        let seq = logsumexp_with_isa(isa, xm, Parallelism::Sequential).unwrap();
        assert_eq!(bits(&seq), bits(&logsumexp_with_isa(isa, xm, two).unwrap()));
        let mut a = vec![0.0; n];
        let mut b = vec![0.0; n];
        log_softmax_with_isa(
            isa,
            xm,
            MatMut::row_major(&mut a, n / 301, 301),
            Parallelism::Sequential,
        )
        .unwrap();
        log_softmax_with_isa(isa, xm, MatMut::row_major(&mut b, n / 301, 301), two).unwrap();
        assert_eq!(bits(&a), bits(&b));
    }
}

/// bf16 logits on the threaded path (rows split over two threads, each converting its chunks
/// of rows in its own buffer): bf16 → bf16 in and out of place, and bf16 → f32, bit for bit the
/// sequential call and the f32 call on the widened logits, rounded.
#[test]
fn half_precision_threaded_equals_sequential_bitwise() {
    let dims = [2, 3, 80, 301];
    let n: usize = dims.iter().product();
    assert!(n >= attn_kernels::softmax::PAR_MIN_ELEMENTS);
    let x: Vec<bf16> =
        (0..n).map(|k| bf16::from_f32(((k * 7919 % 1000) as f32 - 500.0) * 0.03)).collect();
    let xw: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let l = Tensor4Layout::bhsd(dims[0], dims[1], dims[2], dims[3]);
    let mask = Mask::Causal { offset: None };
    let two = Parallelism::threads(2);
    for isa in Isa::supported() {
        let mut want = vec![0.0f32; n];
        let mut want_lse = vec![0.0; n / dims[3]];
        let (xv, yv) = (TensorRef::new(&xw, l), TensorMut::new(&mut want, l));
        scale_mask_softmax_with_isa(isa, xv, 0.7, &mask, yv, Some(&mut want_lse), two).unwrap();
        for par in [Parallelism::Sequential, two] {
            let mut y = vec![bf16::ZERO; n];
            let mut lse = vec![0.0; n / dims[3]];
            let (xv, yv) = (TensorRef::new(&x, l), TensorMut::new(&mut y, l));
            scale_mask_softmax_with_isa(isa, xv, 0.7, &mask, yv, Some(&mut lse), par).unwrap();
            let rounded: Vec<bf16> = want.iter().map(|&v| bf16::from_f32(v)).collect();
            assert!(y.iter().zip(&rounded).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa}");
            assert_eq!(bits(&lse), bits(&want_lse), "{isa}");
            let mut z = x.clone();
            let zv = TensorMut::new(&mut z, l);
            scale_mask_softmax_inplace_with_isa(isa, zv, 0.7, &mask, None, par).unwrap();
            assert!(z.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa} in place");
            let mut y32 = vec![0.0f32; n];
            let (xv, yv) = (TensorRef::new(&x, l), TensorMut::new(&mut y32, l));
            scale_mask_softmax_with_isa(isa, xv, 0.7, &mask, yv, None, par).unwrap();
            assert_eq!(bits(&y32), bits(&want), "{isa} bf16 -> f32");
        }
    }
}

/// Contiguous half-precision calls run their rows in chunks of a few thousand elements: with
/// 97 columns 42 rows per chunk, so chunks end inside a head and inside each thread's share;
/// with 5000 columns one row per chunk. Every mask kind, with logsumexps, bf16 → bf16 in and
/// out of place, bf16 → f32, f32 → bf16 and f16 → f16, sequential and on two threads: bit for
/// bit the f32 call on the widened logits, rounded.
#[test]
fn half_precision_chunks_equal_f32_bitwise() {
    for dims in [[1, 4, 400, 97], [1, 2, 14, 5000]] {
        half_chunks_case(dims);
    }
}

fn half_chunks_case(dims: [usize; 4]) {
    let n: usize = dims.iter().product();
    assert!(n >= attn_kernels::softmax::PAR_MIN_ELEMENTS);
    let rows = n / dims[3];
    let l = Tensor4Layout::bhsd(dims[0], dims[1], dims[2], dims[3]);
    let x: Vec<bf16> =
        (0..n).map(|k| bf16::from_f32(((k * 7919 % 1000) as f32 - 500.0) * 0.03)).collect();
    let xw: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let xh: Vec<f16> =
        (0..n).map(|k| f16::from_f32(((k * 4099 % 1000) as f32 - 500.0) * 0.03)).collect();
    let xhw: Vec<f32> = xh.iter().map(|v| v.to_f32()).collect();
    // Periods that divide neither a chunk (4074 elements) nor a task (8245): a mask row read
    // one chunk or task off would differ.
    let keep: Vec<bool> = (0..n).map(|k| k % 13 != 1).collect();
    let bias: Vec<f32> = (0..n).map(|k| (k % 11) as f32 * -0.5).collect();
    let masks = [
        Mask::None,
        Mask::Causal { offset: Some(-3) },
        Mask::Keep { keep: &keep, layout: l },
        Mask::Bias { bias: &bias, layout: l },
    ];
    let round = |v: &[f32]| v.iter().map(|&v| bf16::from_f32(v).to_bits()).collect::<Vec<_>>();
    let half_bits = |v: &[bf16]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    // The f32 call on `x`: output and logsumexps.
    let f32_call = |isa, x: &[f32], mask: &Mask<'_>, par| {
        let (mut y, mut lse) = (vec![0.0f32; n], vec![0.0; rows]);
        let (xv, yv) = (TensorRef::new(x, l), TensorMut::new(&mut y, l));
        scale_mask_softmax_with_isa(isa, xv, 0.7, mask, yv, Some(&mut lse), par).unwrap();
        (y, lse)
    };
    for isa in Isa::supported() {
        for mask in &masks {
            for par in [Parallelism::Sequential, Parallelism::threads(2)] {
                let what = format!("{isa} {dims:?} {mask:?} {par:?}");
                let (want, want_lse) = f32_call(isa, &xw, mask, par);
                let (mut y, mut lse) = (vec![bf16::ZERO; n], vec![0.0; rows]);
                let (xv, yv) = (TensorRef::new(&x, l), TensorMut::new(&mut y, l));
                scale_mask_softmax_with_isa(isa, xv, 0.7, mask, yv, Some(&mut lse), par).unwrap();
                assert_eq!(half_bits(&y), round(&want), "{what} bf16 -> bf16");
                assert_eq!(bits(&lse), bits(&want_lse), "{what} bf16 -> bf16 lse");
                let (mut z, mut lse) = (x.clone(), vec![0.0; rows]);
                let zv = TensorMut::new(&mut z, l);
                scale_mask_softmax_inplace_with_isa(isa, zv, 0.7, mask, Some(&mut lse), par)
                    .unwrap();
                assert_eq!(half_bits(&z), round(&want), "{what} bf16 in place");
                assert_eq!(bits(&lse), bits(&want_lse), "{what} bf16 in place lse");
                let (mut y32, mut lse) = (vec![0.0f32; n], vec![0.0; rows]);
                let (xv, yv) = (TensorRef::new(&x, l), TensorMut::new(&mut y32, l));
                scale_mask_softmax_with_isa(isa, xv, 0.7, mask, yv, Some(&mut lse), par).unwrap();
                assert_eq!(bits(&y32), bits(&want), "{what} bf16 -> f32");
                assert_eq!(bits(&lse), bits(&want_lse), "{what} bf16 -> f32 lse");
                let (mut yb, mut lse) = (vec![bf16::ZERO; n], vec![0.0; rows]);
                let (xv, yv) = (TensorRef::new(&xw, l), TensorMut::new(&mut yb, l));
                scale_mask_softmax_with_isa(isa, xv, 0.7, mask, yv, Some(&mut lse), par).unwrap();
                assert_eq!(half_bits(&yb), round(&want), "{what} f32 -> bf16");
                assert_eq!(bits(&lse), bits(&want_lse), "{what} f32 -> bf16 lse");
                let (want_h, want_h_lse) = f32_call(isa, &xhw, mask, par);
                let (mut yh, mut lse) = (vec![f16::ZERO; n], vec![0.0; rows]);
                let (xv, yv) = (TensorRef::new(&xh, l), TensorMut::new(&mut yh, l));
                scale_mask_softmax_with_isa(isa, xv, 0.7, mask, yv, Some(&mut lse), par).unwrap();
                let got: Vec<u16> = yh.iter().map(|v| v.to_bits()).collect();
                let want: Vec<u16> = want_h.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
                assert_eq!(got, want, "{what} f16 -> f16");
                assert_eq!(bits(&lse), bits(&want_h_lse), "{what} f16 -> f16 lse");
            }
        }
    }
}

/// Pass A takes the elements before the input's first vector boundary on their own: a row's
/// result is the same bits at every alignment of its input, the row's max, its min, a NaN, a
/// `+∞` or a `−∞` among those first elements or not, every mask kind, in place too.
#[test]
fn input_alignment_does_not_change_the_bits() {
    let cols = 75; // 4 AVX-512 vectors and a tail: the head, the loop and the remainder
    let base: Vec<f32> = (0..cols).map(|k| ((k * 37 % 23) as f32 - 11.0) * 0.4).collect();
    let specials = [None, Some(40.0), Some(-40.0), Some(-200.0), Some(f32::NAN)];
    let specials = specials.into_iter().chain([Some(f32::INFINITY), Some(f32::NEG_INFINITY)]);
    let keep: Vec<bool> = (0..cols).map(|k| k % 4 != 1).collect();
    let bias: Vec<f32> =
        (0..cols).map(|k| if k % 6 == 2 { f32::NEG_INFINITY } else { 0.1 }).collect();
    let dims = [1, 1, 1, cols];
    let bcast = Tensor4Layout::strided(dims, [0, 0, 0, 1], 0);
    let masks = [
        Mask::None,
        Mask::Causal { offset: Some(-40) },
        Mask::Keep { keep: &keep, layout: bcast },
        Mask::Bias { bias: &bias, layout: bcast },
    ];
    for isa in Isa::supported() {
        for special in specials.clone() {
            for at in [0, 3, 9, 15] {
                let mut row = base.clone();
                if let Some(v) = special {
                    row[at] = v;
                }
                for mask in &masks {
                    let mut want = None;
                    for offset in 0..16 {
                        let mut buf = vec![0.0f32; offset + cols];
                        buf[offset..].copy_from_slice(&row);
                        let l = Tensor4Layout::strided(dims, [0, 0, 0, 1], offset);
                        let mut y = vec![0.0; cols];
                        let yl = Tensor4Layout::bhsd(1, 1, 1, cols);
                        let seq = Parallelism::Sequential;
                        let xv = TensorRef::new(&buf, l);
                        let yv = TensorMut::new(&mut y, yl);
                        let mut lse = [0.0];
                        scale_mask_softmax_with_isa(isa, xv, 0.5, mask, yv, Some(&mut lse), seq)
                            .unwrap();
                        let zv = TensorMut::new(&mut buf, l);
                        scale_mask_softmax_inplace_with_isa(isa, zv, 0.5, mask, None, seq).unwrap();
                        let got = (bits(&y), bits(&lse));
                        let what = format!("{isa} {mask:?}, {special:?} at {at}, offset {offset}");
                        assert_eq!(bits(&buf[offset..]), got.0, "{what}: in place");
                        match &want {
                            None => want = Some(got),
                            Some(w) => assert_eq!(w, &got, "{what}"),
                        }
                    }
                }
            }
        }
    }
}

/// Outputs above `STREAM_MIN_BYTES` take the staged, non-temporal path: same bits as computing
/// each row by itself (small calls never stream), on a misaligned output, on one thread or two.
#[test]
fn streaming_path_equals_row_by_row() {
    let cols = 1029; // rows start at every alignment
    let rows = attn_kernels::softmax::STREAM_MIN_BYTES / 4 / cols + 1;
    let x: Vec<f32> = (0..rows * cols).map(|k| ((k * 31 % 977) as f32 - 488.0) * 0.05).collect();
    for isa in Isa::supported() {
        let seq = Parallelism::Sequential;
        // The whole call into a misaligned output (offset 1), on `par`.
        let whole = |par: Parallelism| {
            let mut y = vec![0.0; rows * cols + 1];
            let l = MatLayout::strided(rows, cols, cols, 1, 1);
            let xv = TensorRef::new(&x, Tensor4Layout::from_mat(MatLayout::row_major(rows, cols)));
            let yv = TensorMut::new(&mut y, Tensor4Layout::from_mat(l));
            let mask = Mask::Causal { offset: Some(600) };
            scale_mask_softmax_with_isa(isa, xv, 1.3, &mask, yv, None, par).unwrap();
            y
        };
        let y = whole(seq);
        for i in (0..rows).step_by(97) {
            let xr = &x[i * cols..(i + 1) * cols];
            let mut yr = vec![0.0; cols];
            let ml = Tensor4Layout::bhsd(1, 1, 1, cols);
            // Row i of the big call sees columns j ≤ i + 600: a one-row call with that offset.
            let mask = Mask::Causal { offset: Some(i as isize + 600) };
            let xv = TensorRef::new(xr, ml);
            scale_mask_softmax_with_isa(
                isa,
                xv,
                1.3,
                &mask,
                TensorMut::new(&mut yr, ml),
                None,
                seq,
            )
            .unwrap();
            assert_eq!(bits(&yr), bits(&y[1 + i * cols..1 + (i + 1) * cols]), "{isa} row {i}");
        }
        // Two threads stream their rows and fence them once each, when their share ends.
        let y2 = whole(Parallelism::threads(2));
        assert!(bits(&y2) == bits(&y), "{isa}: two threads differ from one");
    }
}

/// Large contiguous calls stream by blocks of rows, each row's non-temporal writes deferred into
/// the next row's passes: the same bits and logsumexps as the row-by-row streamed path that
/// other layouts take (here the same rows, described with a different stride for the unit
/// heads dimension). Every mask kind, out of place and in place, on one thread and two, into
/// an output that starts off a vector boundary; special rows (a NaN, a `+∞`, all `−∞`, a `±1e30`
/// spread beyond the table exp, fully masked) sit between ordinary ones, so that a pending
/// row is written around each of them. Each row stages its terms at its own offset (in phase
/// with its output row) from where the previous row's drain still reads them: rows of 1029
/// columns move the stage 5 floats later per row, rows of 1329 305 floats, both wrapping
/// back within the page; causal rows grow by one, and with offset 0 each batch's first
/// one-element row follows a full row whose drain is pending (each of the two `Drain::clear`
/// calls, removed, makes this fail).
#[test]
fn streamed_row_blocks_equal_row_by_row() {
    for cols in [1029, 1329] {
        streamed_row_blocks_case(cols);
    }
}

fn streamed_row_blocks_case(cols: usize) {
    let (batch, q) = (3, 1359); // rows start at every alignment
    let dims = [batch, 1, q, cols];
    let n = batch * q * cols;
    assert!(n * 4 >= attn_kernels::softmax::STREAM_MIN_BYTES);
    let mut x: Vec<f32> = (0..n).map(|k| ((k * 31 % 977) as f32 - 488.0) * 0.05).collect();
    x[5 * cols + 7] = f32::NAN;
    x[9 * cols + 100] = f32::INFINITY;
    x[12 * cols..13 * cols].fill(f32::NEG_INFINITY);
    x[13 * cols + 3] = f32::NEG_INFINITY;
    x[20 * cols] = 1e30;
    x[20 * cols + 1] = -1e30;
    // The same rows; `other` differs from `bhsd` only in the stride of the unit heads
    // dimension, which is enough for the call to take the row-by-row path.
    let dense = Tensor4Layout::bhsd(batch, 1, q, cols);
    let other = Tensor4Layout::strided(dims, [q * cols, 7, cols, 1], 0);
    // Per-query masks broadcast over batches, each with a fully masked row.
    let keep: Vec<bool> = (0..q * cols).map(|k| k % 11 != 0 && k / cols != 30).collect();
    let bias: Vec<f32> = (0..q * cols)
        .map(|k| if k / cols == 31 || k % 13 == 0 { f32::NEG_INFINITY } else { (k % 5) as f32 })
        .collect();
    let per_query = Tensor4Layout::strided(dims, [0, 0, cols, 1], 0);
    let masks = [
        Mask::None,
        Mask::Causal { offset: Some(-5) }, // the first five queries of each batch see nothing
        Mask::Causal { offset: Some(0) },
        Mask::Keep { keep: &keep, layout: per_query },
        Mask::Bias { bias: &bias, layout: per_query },
    ];
    let names = ["none", "causal -5", "causal 0", "keep", "bias"];
    let two = Parallelism::threads(2);
    for isa in Isa::supported() {
        for (mask, name) in masks.iter().zip(names) {
            let ctx = &format!("{isa} {name}, {cols} columns");
            // Out of place into `y[1..]`, and in place; (output, lse) bits.
            let run = |l: Tensor4Layout, par: Parallelism| {
                let mut y = vec![0.0; n + 1];
                let mut lse = vec![0.0; batch * q];
                let (xv, yv) = (TensorRef::new(&x, l), TensorMut::new(&mut y[1..], l));
                scale_mask_softmax_with_isa(isa, xv, 0.7, mask, yv, Some(&mut lse), par).unwrap();
                let mut z = x.clone();
                let zv = TensorMut::new(&mut z, l);
                scale_mask_softmax_inplace_with_isa(isa, zv, 0.7, mask, None, par).unwrap();
                assert!(bits(&z) == bits(&y[1..]), "{ctx}: in place differs");
                (bits(&y[1..]), bits(&lse))
            };
            let blocks = run(dense, Parallelism::Sequential);
            assert!(blocks == run(other, Parallelism::Sequential), "{ctx}: blocks against rows");
            assert!(blocks == run(dense, two), "{ctx}: two threads against one");
        }
    }
}

/// The golden example's softmax row-by-row, and ±1e30 logits: no overflow, no NaN.
#[test]
fn golden_scores_and_huge_logits() {
    use attn_tests::reference_support::golden;
    let (scores, want) = (golden::SCORES, golden::SOFTMAX);
    let huge = [1e30f32, -1e30, 0.0, 1e30, -1e30, -1e30, 5.0, 1e30, 1e30];
    for isa in Isa::supported() {
        let mut y = [0.0f32; 9];
        let l = Tensor4Layout::bhsd(1, 1, 3, 3);
        let seq = Parallelism::Sequential;
        let yv = TensorMut::new(&mut y, l);
        scale_mask_softmax_with_isa(
            isa,
            TensorRef::new(&scores, l),
            1.0,
            &Mask::None,
            yv,
            None,
            seq,
        )
        .unwrap();
        for (a, w) in y.iter().zip(want) {
            // Scores are small integers: ζ = 0, δ ≤ u·14, so 2Eu + γ_3 + 2u + 14u ≈ 20u.
            assert!((f64::from(*a) - w).abs() <= w * 20.0 * U + 1e-12, "{isa}: {a} vs {w}");
        }
        let mut lse = [0.0f32; 3];
        let yv = TensorMut::new(&mut y, l);
        scale_mask_softmax_with_isa(
            isa,
            TensorRef::new(&huge, l),
            1.0,
            &Mask::None,
            yv,
            Some(&mut lse),
            seq,
        )
        .unwrap();
        assert_eq!(y, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.5], "{isa}");
        assert_eq!(lse[0], 1e30, "{isa}");
        assert!(lse.iter().all(|v| v.is_finite()));
    }
}

/// Bad arguments give the reference's error, in the reference's order.
#[test]
fn errors_match_the_reference() {
    let x = vec![0.0f32; 24];
    let good = Tensor4Layout::bhsd(1, 2, 3, 4);
    let keep = vec![true; 12];
    let cases: Vec<(Tensor4Layout, Tensor4Layout, f32, Mask<'_>, usize)> = vec![
        (good, good, f32::NAN, Mask::None, 6),
        (good, good, f32::INFINITY, Mask::None, 6),
        (Tensor4Layout::bhsd(1, 2, 3, 5), good, 1.0, Mask::None, 6),
        (good, Tensor4Layout::bhsd(1, 2, 3, 3), 1.0, Mask::None, 6),
        (good, Tensor4Layout::strided([1, 2, 3, 4], [0, 0, 4, 1], 0), 1.0, Mask::None, 6),
        (good, good, 1.0, Mask::Keep { keep: &keep, layout: good }, 6),
        (good, good, 1.0, Mask::Keep { keep: &keep, layout: Tensor4Layout::bhsd(1, 1, 3, 4) }, 6),
        (good, good, 1.0, Mask::None, 5),
        (Tensor4Layout::strided([1, 2, 3, 4], [0, usize::MAX, 4, 1], 0), good, 1.0, Mask::None, 6),
    ];
    for (xl, yl, scale, mask, nl) in cases {
        let mut y1 = vec![0.0f32; 24];
        let mut y2 = vec![0.0f32; 24];
        let mut l1 = vec![0.0f32; nl];
        let mut l2 = vec![0.0f32; nl];
        let xv = TensorRef::new(&x, xl);
        let want = reference::scale_mask_softmax(
            xv,
            scale,
            &mask,
            TensorMut::new(&mut y1, yl),
            Some(&mut l1),
        )
        .unwrap_err();
        for isa in Isa::supported() {
            let yv = TensorMut::new(&mut y2, yl);
            let got = scale_mask_softmax_with_isa(
                isa,
                xv,
                scale,
                &mask,
                yv,
                Some(&mut l2),
                Parallelism::Sequential,
            )
            .unwrap_err();
            // Debug, not ==: NaN payloads in NonFinite compare unequal.
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "{isa}");
        }
    }
    for isa in Isa::ALL.into_iter().filter(|i| !i.is_supported()) {
        let mut y = vec![0.0f32; 24];
        let err = scale_mask_softmax_with_isa(
            isa,
            TensorRef::new(&x, good),
            1.0,
            &Mask::None,
            TensorMut::new(&mut y, good),
            None,
            Parallelism::Sequential,
        )
        .unwrap_err();
        assert!(matches!(err, attn_kernels::Error::InvalidParameter { arg: "isa", .. }));
    }
}

/// Zero-sized views: nothing written, lse −∞ for rows of zero columns.
#[test]
fn empty_shapes() {
    for isa in Isa::supported() {
        for dims in [[0, 2, 3, 4], [1, 0, 3, 4], [1, 2, 0, 4], [1, 2, 3, 0]] {
            let l = Tensor4Layout::bhsd(dims[0], dims[1], dims[2], dims[3]);
            let mut lse = vec![7.0f32; dims[0] * dims[1] * dims[2]];
            let mut y: Vec<f32> = vec![];
            let yv = TensorMut::new(&mut y, l);
            let mask = Mask::Causal { offset: None };
            scale_mask_softmax_with_isa(
                isa,
                TensorRef::<f32>::new(&[], l),
                1.0,
                &mask,
                yv,
                Some(&mut lse),
                Parallelism::Sequential,
            )
            .unwrap();
            assert!(lse.iter().all(|v| *v == f32::NEG_INFINITY), "{isa} {dims:?}");
        }
        // Zero columns with strides and an offset far outside the (empty) slices.
        let l = Tensor4Layout::strided([2, 2, 3, 0], [1000, 300, 70, 9], 55);
        let keep: [bool; 0] = [];
        let mask = Mask::Keep { keep: &keep, layout: l };
        let mut lse = vec![7.0f32; 12];
        let mut y: Vec<f32> = vec![];
        let seq = Parallelism::Sequential;
        let yv = TensorMut::new(&mut y, l);
        scale_mask_softmax_with_isa(
            isa,
            TensorRef::<f32>::new(&[], l),
            1.0,
            &mask,
            yv,
            Some(&mut lse),
            seq,
        )
        .unwrap();
        assert!(lse.iter().all(|v| *v == f32::NEG_INFINITY), "{isa} strided empty");
        let xm = MatRef::new(&[], MatLayout::strided(4, 0, 17, 3, 99));
        assert_eq!(logsumexp_with_isa(isa, xm, seq).unwrap(), vec![f32::NEG_INFINITY; 4]);
        let ym = MatMut::new(&mut y, MatLayout::strided(4, 0, 17, 3, 99));
        log_softmax_with_isa(isa, xm, ym, seq).unwrap();
    }
}
