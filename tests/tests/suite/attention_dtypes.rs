//! Attention with bf16/f16 operands and int8 (Q8) K/V caches against the f64 reference, on
//! every path (flash, decode, unfused, auto), every ISA this CPU has, both layouts, odd
//! strides, GQA, every mask kind.
//!
//! # How the reference sees the operands
//!
//! A case is drawn in f32 ([`Case`]), then each operand is rounded to its storage type and the
//! case's f32 buffers are overwritten with the values the stored elements represent:
//! - bf16/f16: the widened value, which is exact, so the reference (f64 on the case's f32
//!   buffers) computes on exactly the values the kernel reads, and the f32 bound of
//!   `attention_support` applies unchanged;
//! - Q8: the kernels dequantise in registers as `fl(q·scale)`, one f32 rounding
//!   (`|fl(q·s) − q·s| ≤ u·|q·s|`, stated in `attn_kernels`' attention blocks). The test scales
//!   have at most 8 significant bits (rounded to bf16), so `q·s` (8 × 8 bits) is an f32 and the
//!   kernel's dequantised value is exact: the case holds exactly the values `q·s`, and the f32
//!   bound applies unchanged (an off-by-a-block scale or a misplaced element shows).
//!   `quantize_q8`'s full-precision scales would add `u` per K and V element to the bound.
//!
//! # Output rounding
//!
//! The kernel's f32 result `y` (within `B` of the reference `o`) is rounded once to the output
//! type: `|round(y) − y| ≤ u_T·|y| + s_T/2`, with `u_T` = half an ULP relative (`2⁻⁸` for
//! bf16, `2⁻¹¹` for f16, 0 for f32) and `s_T` the smallest subnormal (`2⁻¹³³`, `2⁻²⁴`). So
//! the tolerance is `B + u_T·(|o| + B) + s_T/2`, where `o` is the reference's f32 result (its own
//! rounding is part of `B`'s subnormal slack at most `u·|o|`, also counted by `u_T·|o|`, since
//! `u ≤ u_T` for the half types; for f32 output the existing harness's rule applies).

use attn_kernels::attention::{Attention, Path};
use attn_kernels::gemm::{bf16_dot_available, HalfPath};
use attn_kernels::{alibi_slopes, bf16, f16, Error, Isa, Parallelism, Q8Ref, Tensor4Layout};
use attn_reference::{TensorMut, TensorRef};
use attn_tests::attention_support::{compare, with_lse, Case, MaskKind, Rng};
use proptest::prelude::*;

/// Storage type of one operand in a test combination.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ty {
    F32,
    BF16,
    F16,
    Q8,
}

/// The dtype combinations engines pass: all-same half types, f32 Q (and O) with half K/V,
/// int8 K/V with f32 or bf16 Q/O.
const COMBOS: [(Ty, Ty, Ty); 7] = [
    (Ty::BF16, Ty::BF16, Ty::BF16),
    (Ty::F16, Ty::F16, Ty::F16),
    (Ty::F32, Ty::BF16, Ty::F32),
    (Ty::F32, Ty::F16, Ty::F32),
    (Ty::F32, Ty::Q8, Ty::F32),
    (Ty::BF16, Ty::Q8, Ty::BF16),
    (Ty::F16, Ty::F32, Ty::F16),
];

const PATHS: [Path; 4] = [Path::Flash, Path::Decode, Path::Unfused, Path::Auto];

/// `(half an ULP relative, smallest subnormal)` of an output type.
fn out_rounding(t: Ty) -> (f64, f64) {
    match t {
        Ty::BF16 => (2f64.powi(-8), 2f64.powi(-133)),
        Ty::F16 => (2f64.powi(-11), 2f64.powi(-24)),
        _ => (0.0, 0.0),
    }
}

/// A tensor's elements in one storage type (same layout as the case's f32 buffer).
enum Buf {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    /// Values (the case's layout) and scales (`[b, h, s, ⌈d/32⌉]`, contiguous).
    Q8(Vec<i8>, Vec<f32>),
}

/// The elements of `x` (layout `l`) in type `t`; the view's elements of `x` are overwritten by
/// the exact values the stored ones represent (see the module docs).
fn convert(t: Ty, x: &mut [f32], l: Tensor4Layout) -> Buf {
    match t {
        Ty::F32 => Buf::F32(x.to_vec()),
        Ty::BF16 => {
            let b: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            x.iter_mut().zip(&b).for_each(|(x, b)| *x = b.to_f32());
            Buf::BF16(b)
        }
        Ty::F16 => {
            let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            x.iter_mut().zip(&h).for_each(|(x, h)| *x = h.to_f32());
            Buf::F16(h)
        }
        Ty::Q8 => {
            let [nb, nh, ns, nd] = l.dims;
            let nblk = nd.div_ceil(32);
            let mut qv = vec![0i8; x.len()];
            let mut sc = vec![0.0f32; nb * nh * ns * nblk];
            // Scales with at most 8 significant bits (rounded to bf16): `q·scale` is then an
            // f32, the exact value the kernel's `fl(q·s)` also gives, so the case holds the
            // exact dequantised values (module docs).
            for b in 0..nb {
                for h in 0..nh {
                    for s in 0..ns {
                        for k in 0..nblk {
                            let r = k * 32..(k * 32 + 32).min(nd);
                            let m = r
                                .clone()
                                .map(|d| x[l.index(b, h, s, d)].abs())
                                .fold(0.0f32, f32::max);
                            let scale = bf16::from_f32(m / 127.0).to_f32();
                            sc[((b * nh + h) * ns + s) * nblk + k] = scale;
                            for d in r {
                                let i = l.index(b, h, s, d);
                                let q = if scale == 0.0 {
                                    0
                                } else {
                                    (x[i] / scale).round_ties_even().clamp(-127.0, 127.0) as i8
                                };
                                qv[i] = q;
                                let exact = f64::from(q) * f64::from(scale);
                                x[i] = exact as f32;
                                assert_eq!(f64::from(x[i]), exact, "q8_exact");
                            }
                        }
                    }
                }
            }
            Buf::Q8(qv, sc)
        }
    }
}

/// The K or V view of a typed buffer laid out as `l`.
fn kv(b: &Buf, l: Tensor4Layout) -> attn_kernels::KvRef<'_> {
    match b {
        Buf::F32(x) => TensorRef::new(&x[..], l).into(),
        Buf::BF16(x) => TensorRef::new(&x[..], l).into(),
        Buf::F16(x) => TensorRef::new(&x[..], l).into(),
        Buf::Q8(x, s) => {
            let [nb, nh, ns, nd] = l.dims;
            let sl = Tensor4Layout::bhsd(nb, nh, ns, nd.div_ceil(32));
            Q8Ref::new(TensorRef::new(&x[..], l), TensorRef::new(&s[..], sl)).into()
        }
    }
}

/// Runs `a` (the problem over the typed operands) on an output of type `t` laid out as the
/// case's; returns the output widened to f32 (NaN-filled where unwritten) and the lse.
fn run_typed(
    case: &Case,
    t: Ty,
    q: &Buf,
    k: &Buf,
    v: &Buf,
    f: impl Fn(Attention<'_>) -> Attention<'_>,
) -> Result<(Vec<f32>, Vec<f32>), Error> {
    let n = case.output().len();
    let mut lse = vec![f32::NAN; case.batch * case.hq * case.nq];
    let ol = case.o_layout;
    let qv: attn_kernels::AnyRef<'_> = match q {
        Buf::F32(x) => TensorRef::new(&x[..], case.q.1).into(),
        Buf::BF16(x) => TensorRef::new(&x[..], case.q.1).into(),
        Buf::F16(x) => TensorRef::new(&x[..], case.q.1).into(),
        Buf::Q8(..) => unreachable!("Q is never quantised"),
    };
    let a = Attention::new(qv, kv(k, case.k.1), kv(v, case.v.1))
        .scale(case.scale)
        .mask(case.mask())
        .variants(case.variants());
    let a = f(with_lse(a, Some(&mut lse)));
    let out: Vec<f32> = match t {
        Ty::BF16 => {
            let mut o = vec![bf16::NAN; n];
            a.run(TensorMut::new(&mut o[..], ol))?;
            o.iter().map(|x| x.to_f32()).collect()
        }
        Ty::F16 => {
            let mut o = vec![f16::NAN; n];
            a.run(TensorMut::new(&mut o[..], ol))?;
            o.iter().map(|x| x.to_f32()).collect()
        }
        _ => {
            let mut o = vec![f32::NAN; n];
            a.run(TensorMut::new(&mut o[..], ol))?;
            o
        }
    };
    Ok((out, lse))
}

/// Typed operands for `case` (whose buffers then hold the exact values, module docs).
fn typed(case: &mut Case, tq: Ty, tkv: Ty) -> (Buf, Buf, Buf) {
    let q = convert(tq, &mut case.q.0, case.q.1);
    let k = convert(tkv, &mut case.k.0, case.k.1);
    let v = convert(tkv, &mut case.v.0, case.v.1);
    (q, k, v)
}

/// The case's bounds plus the output rounding of `to` (module docs).
fn dtype_bounds(case: &Case, to: Ty, want: &(Vec<f32>, Vec<f32>)) -> (Vec<f64>, Vec<f64>) {
    with_output_rounding(case, case.bounds(), to, want)
}

/// `bounds` (the case's, of some path) plus the output rounding of `to` (module docs).
fn with_output_rounding(
    case: &Case,
    (mut ob, lb): (Vec<f64>, Vec<f64>),
    to: Ty,
    want: &(Vec<f32>, Vec<f32>),
) -> (Vec<f64>, Vec<f64>) {
    let (ut, st) = out_rounding(to);
    let l = case.o_layout;
    for b in 0..case.batch {
        for h in 0..case.hq {
            for i in 0..case.nq {
                let row = (b * case.hq + h) * case.nq + i;
                for d in 0..case.dv {
                    let o = f64::from(want.0[l.index(b, h, i, d)]).abs();
                    let x = &mut ob[row * case.dv + d];
                    *x += ut * (o + *x) + st / 2.0;
                }
            }
        }
    }
    (ob, lb)
}

/// Every combination, path and supported ISA on `case`; the first failure as an error.
fn check_case(case: &Case, threads: usize) -> Result<(), String> {
    for (tq, tkv, to) in COMBOS {
        let mut c = case.clone();
        let (q, k, v) = typed(&mut c, tq, tkv);
        let want = c.reference();
        let bounds = dtype_bounds(&c, to, &want);
        for isa in Isa::supported() {
            for path in PATHS {
                let got = run_typed(&c, to, &q, &k, &v, |a| {
                    a.isa(isa).path(path).parallelism(Parallelism::threads(threads))
                })
                .map_err(|e| format!("{e}"))?;
                let what = format!("{tq:?}/{tkv:?}/{to:?} {isa} {path:?}");
                compare(&c, &what, &got, &want, &bounds, 1.0)?;
            }
        }
        if (tq, tkv) == (Ty::BF16, Ty::BF16) {
            check_dot(&c, to, (&q, &k, &v), &want, threads)?;
        }
    }
    Ok(())
}

/// The flash and decode paths on `vdpbf16ps` (`HalfPath::Dot`) against the reference with
/// their own bounds (`Case::bounds_dot`; `Case::bounds_dot_scores` for decode, which runs only
/// the scores on it, and only for an even `dk`), where this CPU has it (else
/// `isas_not_runnable_here_are_named` says so); the operands are bf16, as the path requires.
fn check_dot(
    c: &Case,
    to: Ty,
    (q, k, v): (&Buf, &Buf, &Buf),
    want: &(Vec<f32>, Vec<f32>),
    threads: usize,
) -> Result<(), String> {
    if !bf16_dot_available() {
        return Ok(());
    }
    for path in [Path::Flash, Path::Decode] {
        let raw = if path == Path::Flash { c.bounds_dot() } else { c.bounds_dot_scores() };
        let bounds = with_output_rounding(c, raw, to, want);
        let got = run_typed(c, to, q, k, v, |a| {
            a.isa(Isa::Avx512)
                .path(path)
                .half_path(HalfPath::Dot)
                .parallelism(Parallelism::threads(threads))
        })
        .map_err(|e| format!("{e}"))?;
        let what = format!("BF16/BF16/{to:?} avx512 {path:?} HalfPath::Dot");
        compare(c, &what, &got, want, &bounds, 1.0)?;
    }
    Ok(())
}

fn mask_kind() -> impl Strategy<Value = MaskKind> {
    prop_oneof![
        Just(MaskKind::None),
        prop::sample::select(vec![None, Some(0), Some(-3), Some(5)]).prop_map(MaskKind::Causal),
        (2u32..6, any::<bool>())
            .prop_map(|(density, broadcast)| MaskKind::Keep { density, broadcast }),
        Just(MaskKind::Bias),
    ]
}

fn small_case() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        1usize..=2,
        prop::sample::select(vec![(1usize, 1usize), (2, 1), (2, 2), (1, 4)]),
        prop::sample::select(vec![1usize, 2, 5, 16, 17, 33, 70]),
        prop::sample::select(vec![1usize, 7, 16, 33, 130, 300]),
        prop::sample::select(vec![1usize, 16, 40, 64, 128]),
        any::<bool>(),
        prop::sample::select(vec![0usize, 3]),
        mask_kind(),
        any::<u8>(),
    )
        .prop_map(|(seed, batch, (hkv, group), nq, nk, d, bshd, pad, mask, var)| {
            let dv = if seed % 3 == 0 { 32 } else { d };
            let mut c = Case::new(seed, batch, hkv, group, nq, nk, d, dv, bshd, pad, mask, 2.0);
            // The variants (issue 22) with every element type: each bit of `var` sets one.
            let mut rng = Rng::new(seed ^ 0xD7E5);
            let hq = c.hq;
            c.variants.window =
                (var & 1 != 0).then_some((usize::from(var >> 4) * 5, var as usize % 3));
            c.variants.softcap = (var & 2 != 0).then_some(5.0);
            c.variants.sinks =
                (var & 4 != 0).then(|| (0..hq).map(|_| rng.uniform(-3.0, 3.0)).collect());
            c.variants.alibi = (var & 8 != 0).then(|| alibi_slopes(hq));
            c
        })
}

#[test]
fn isas_not_runnable_here_are_named() {
    for isa in Isa::ALL {
        if !Isa::supported().contains(&isa) {
            eprintln!("attention_dtypes: {isa} not supported by this CPU; its paths were skipped");
        }
    }
    if !bf16_dot_available() {
        eprintln!(
            "attention_dtypes: the flash path on vdpbf16ps (HalfPath::Dot) needs AVX-512F and \
             AVX512_BF16, which this CPU lacks; skipped"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn every_dtype_combination_matches_the_reference(case in small_case(), threads in 1usize..=2) {
        if let Err(e) = check_case(&case, threads) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// A decode case typical of generation: 1–4 queries over many keys, GQA, d 128.
#[test]
fn decode_shapes_with_every_dtype() {
    for (seed, nq, group, mask) in [
        (1u64, 1usize, 4usize, MaskKind::None),
        (2, 3, 2, MaskKind::Causal(None)),
        (3, 1, 1, MaskKind::Keep { density: 3, broadcast: false }),
        (4, 2, 4, MaskKind::Bias),
    ] {
        for bshd in [false, true] {
            let case = Case::new(seed, 1, 2, group, nq, 1100, 128, 128, bshd, 0, mask, 2.0);
            check_case(&case, 2).unwrap();
        }
    }
}

/// One-head problem of `n` keys, d = `d`, from explicit K and V (q all ones).
fn one_head(k: Vec<f32>, v: Vec<f32>, n: usize, d: usize) -> Case {
    let mut c = Case::new(9, 1, 1, 1, 1, n, d, d, false, 0, MaskKind::None, 1.0);
    c.q.0.iter_mut().for_each(|x| {
        if !x.is_nan() {
            *x = 1.0
        }
    });
    let (kl, vl) = (c.k.1, c.v.1);
    for j in 0..n {
        for e in 0..d {
            c.k.0[kl.index(0, 0, j, e)] = k[j * d + e];
            c.v.0[vl.index(0, 0, j, e)] = v[j * d + e];
        }
    }
    c
}

/// f16 output overflows to ±∞ (documented): values of 70000 averaged are 70000 > 65504.
#[test]
fn f16_output_overflows_to_infinity() {
    let (n, d) = (3, 16);
    let v: Vec<f32> = (0..n * d).map(|i| if i % 2 == 0 { 70000.0 } else { -70000.0 }).collect();
    let mut c = one_head(vec![0.0; n * d], v, n, d);
    let (q, k, v) = typed(&mut c, Ty::F32, Ty::F32);
    for isa in Isa::supported() {
        for path in PATHS {
            let (o, _) = run_typed(&c, Ty::F16, &q, &k, &v, |a| a.isa(isa).path(path)).unwrap();
            let l = c.o_layout;
            for e in 0..d {
                let want = if e % 2 == 0 { f32::INFINITY } else { f32::NEG_INFINITY };
                assert_eq!(o[l.index(0, 0, 0, e)], want, "{isa} {path:?} d {e}");
            }
        }
    }
}

/// bf16 values near the f32 limits: keys whose scores stay finite while the values are
/// `3·10³⁸` and `−1.5·10³⁸` (bf16's largest finite is about `3.39·10³⁸`); their mean is exact. And a NaN payload in a bf16/f16 value reaches the output as NaN.
#[test]
fn bf16_near_f32_limits_and_nan_payloads() {
    let (n, d) = (2, 32);
    let big = bf16::from_f32(3.0e38).to_f32();
    let v: Vec<f32> = (0..n * d).map(|i| if i < d { big } else { -big / 2.0 }).collect();
    let mut c = one_head(vec![0.0; n * d], v, n, d);
    let (q, k, v) = typed(&mut c, Ty::BF16, Ty::BF16);
    for isa in Isa::supported() {
        for path in PATHS {
            let (o, lse) = run_typed(&c, Ty::BF16, &q, &k, &v, |a| a.isa(isa).path(path)).unwrap();
            // Weights 1/2 each: (big − big/2)/2 = big/4, exact in bf16 (a power-of-two scaling);
            // the partial sums stay below f32::MAX.
            let want = big / 4.0;
            for e in 0..d {
                let got = o[c.o_layout.index(0, 0, 0, e)];
                let tol = 2.0 * 2f64.powi(-8) * f64::from(want);
                assert!((f64::from(got) - f64::from(want)).abs() <= tol, "{isa} {path:?}: {got}");
            }
            assert!((lse[0] - 2f32.ln()).abs() < 1e-6);
        }
    }
    // NaN payloads: one value element is a bf16 / f16 NaN with a payload; its column is NaN.
    for t in [Ty::BF16, Ty::F16] {
        let mut c = one_head(vec![0.5; n * d], vec![1.0; n * d], n, d);
        let (q, k, mut v) = typed(&mut c, t, t);
        let at = c.v.1.index(0, 0, 1, 5);
        match &mut v {
            Buf::BF16(x) => x[at] = bf16::from_bits(0x7F81),
            Buf::F16(x) => x[at] = f16::from_bits(0x7C01),
            _ => unreachable!(),
        }
        for isa in Isa::supported() {
            for path in PATHS {
                let (o, _) = run_typed(&c, t, &q, &k, &v, |a| a.isa(isa).path(path)).unwrap();
                for e in 0..d {
                    let x = o[c.o_layout.index(0, 0, 0, e)];
                    assert_eq!(x.is_nan(), e == 5, "{t:?} {isa} {path:?} d {e}: {x}");
                }
            }
        }
    }
}

/// One query of bf16 0.25s (`d` of them) against `n = values.len() / d` int8 keys and values
/// of width `d` (both `values`), with K scales `ks` and V scales `vs` (`⌈d/32⌉` per row), on
/// `isa` and `path`: the output row.
fn q8_row(values: &[i8], ks: &[f32], vs: &[f32], d: usize, isa: Isa, path: Path) -> Vec<f32> {
    let n = values.len() / d;
    let l = Tensor4Layout::bhsd(1, 1, n, d);
    let sl = Tensor4Layout::bhsd(1, 1, n, d.div_ceil(32));
    let q = vec![bf16::from_f32(0.25); d];
    let ql = Tensor4Layout::bhsd(1, 1, 1, d);
    let mut o = vec![0.0f32; d];
    Attention::new(
        TensorRef::new(&q[..], ql),
        Q8Ref::new(TensorRef::new(values, l), TensorRef::new(ks, sl)),
        Q8Ref::new(TensorRef::new(values, l), TensorRef::new(vs, sl)),
    )
    .isa(isa)
    .path(path)
    .run(TensorMut::new(&mut o[..], ql))
    .unwrap();
    o
}

/// Q8 scales of 0 and ±∞: a zero scale makes its block's values ±0; an infinite scale makes
/// `q·∞ = ±∞` (and `0·∞ = NaN`) flow in as the same f32 values would (here into V, so the
/// output column is ±∞ or NaN by the f32 rules); infinite K scales give ±∞ scores.
#[test]
fn q8_special_scales() {
    let (n, d) = (3, 64);
    let qv: Vec<i8> = (0..n * d).map(|i| ((i % 7) as i8) - 3).collect();
    // K scales all 0: every score 0; V scales: block 0 of row 1 is +∞, the rest 1.
    let ks = vec![0.0f32; n * 2];
    let mut vs = vec![1.0f32; n * 2];
    vs[2] = f32::INFINITY;
    for isa in Isa::supported() {
        for path in PATHS {
            let o = q8_row(&qv, &ks, &vs, d, isa, path);
            for e in 0..d {
                let qe = |j: usize| f64::from(qv[j * d + e]);
                let want = if e < 32 {
                    match qe(1) {
                        x if x > 0.0 => f32::INFINITY,
                        x if x < 0.0 => f32::NEG_INFINITY,
                        _ => f32::NAN,
                    }
                } else {
                    ((qe(0) + qe(1) + qe(2)) / 3.0) as f32
                };
                let got = o[e];
                let ok = if want.is_nan() {
                    got.is_nan()
                } else if want.is_infinite() {
                    got == want
                } else {
                    (got - want).abs() <= 1e-6
                };
                assert!(ok, "{isa} {path:?} d {e}: {got} want {want}");
            }
        }
    }
}

/// An infinite K scale over a zero int8 value gives a NaN score (`0·∞`), as the same f32
/// values would, on every path: here the scale is −∞ and the block's other values positive,
/// so a kernel that applied the scale to the block's partial product (`t·(−∞) = −∞`, a zero
/// weight) would return a finite row instead of NaN (such a kernel was measured on
/// 2026-12-04, see the perf journal, and checked to fail here).
#[test]
fn q8_infinite_key_scale_over_zero_is_nan() {
    let (n, d) = (5, 64);
    let mut kv = vec![1i8; n * d];
    kv[d] = 0; // row 1, block 0
    let mut ks = vec![1.0f32; n * 2];
    ks[2] = f32::NEG_INFINITY;
    let vs = vec![1.0f32; n * 2];
    for isa in Isa::supported() {
        for path in PATHS {
            let o = q8_row(&kv, &ks, &vs, d, isa, path);
            assert!(o.iter().all(|x| x.is_nan()), "{isa} {path:?}: {o:?}");
        }
    }
}

/// The flash path on `vdpbf16ps` with `±∞`/NaN values at keys whose weight is 0 (hidden by a
/// keep mask, or past a row's causal diagonal inside its tile's block, e.g. unwritten cache
/// slots): they must not reach those rows, as the reference skips zero weights. The paired
/// output product guards a block only when it holds such a value, so this is the test of that
/// guard; an odd number of keys adds a padded pair.
#[test]
fn dot_flash_nonfinite_values_at_zero_weights_do_not_leak() {
    if !bf16_dot_available() {
        eprintln!(
            "attention_dtypes: HalfPath::Dot needs AVX512_BF16, which this CPU lacks; skipped"
        );
        return;
    }
    // Zero queries and keys: every visible key scores 0.
    let run = |nq: usize, nk: usize, d: usize, v: &[f32], mask: attn_kernels::Mask<'_>| {
        let (q, k) = (vec![bf16::ZERO; nq * d], vec![bf16::ZERO; nk * d]);
        let v: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
        let (ql, kl) = (Tensor4Layout::bhsd(1, 1, nq, d), Tensor4Layout::bhsd(1, 1, nk, d));
        let mut o = vec![f32::NAN; nq * d];
        Attention::new(
            TensorRef::new(&q[..], ql),
            TensorRef::new(&k[..], kl),
            TensorRef::new(&v[..], kl),
        )
        .isa(Isa::Avx512)
        .path(Path::Flash)
        .half_path(HalfPath::Dot)
        .mask(mask)
        .run(TensorMut::new(&mut o[..], ql))
        .unwrap();
        o
    };
    // Keep mask: every row sees keys 0 and 1 (values 1 and 2) only; keys 2 and 3 hold +∞ and
    // NaN. Equal scores: weights 1/2 each (exact in bf16), so every output is 1.5 exactly.
    for nk in [4, 5] {
        let (nq, d) = (7, 2);
        let mut v = vec![0.0f32; nk * d];
        for (j, x) in [1.0, 2.0, f32::INFINITY, f32::NAN, 3.0].iter().take(nk).enumerate() {
            v[j * d..(j + 1) * d].fill(*x);
        }
        let keep: Vec<bool> = (0..nq * nk).map(|e| e % nk < 2).collect();
        let layout = Tensor4Layout::bhsd(1, 1, nq, nk);
        let o = run(nq, nk, d, &v, attn_kernels::Mask::Keep { keep: &keep, layout });
        assert!(o.iter().all(|&x| x == 1.5), "keep, nk {nk}: {o:?}");
    }
    // Causal: key j holds the value j, but key 20 holds +∞ in column 0 and NaN in column 1.
    // Rows i < 20 see keys 0..=i with equal weights (a mean of exactly representable values);
    // rows from 20 on see the non-finite key.
    let (n, d) = (41, 2);
    let mut v: Vec<f32> = (0..n * d).map(|e| (e / d) as f32).collect();
    v[20 * d] = f32::INFINITY;
    v[20 * d + 1] = f32::NAN;
    let o = run(n, n, d, &v, attn_kernels::Mask::Causal { offset: None });
    for i in 0..n {
        for c in 0..d {
            let got = o[i * d + c];
            if i < 20 {
                let want = i as f32 / 2.0;
                // The weights 1/(i+1) are rounded to bf16: within 2⁻⁸ relative of the mean.
                assert!((got - want).abs() <= want * 2f32.powi(-7), "row {i} col {c}: {got}");
            } else if c == 0 {
                assert_eq!(got, f32::INFINITY, "row {i} col {c}");
            } else {
                assert!(got.is_nan(), "row {i} col {c}: {got}");
            }
        }
    }
}

/// Mismatched scale tensors and other bad typed operands are typed errors, the same on every
/// path, and nothing is written.
#[test]
fn bad_scale_shapes_are_typed_errors() {
    let (n, d) = (4, 40);
    let qv = vec![1i8; n * d];
    let l = Tensor4Layout::bhsd(1, 1, n, d);
    let q = vec![1.0f32; d];
    let ql = Tensor4Layout::bhsd(1, 1, 1, d);
    let good_s = vec![1.0f32; n * 2];
    for path in PATHS {
        // One block per row instead of ⌈40/32⌉ = 2.
        let bad = vec![1.0f32; n];
        let mut o = vec![7.0f32; d];
        let r = Attention::new(
            TensorRef::new(&q[..], ql),
            Q8Ref::new(
                TensorRef::new(&qv[..], l),
                TensorRef::new(&bad[..], Tensor4Layout::bhsd(1, 1, n, 1)),
            ),
            Q8Ref::new(
                TensorRef::new(&qv[..], l),
                TensorRef::new(&good_s[..], Tensor4Layout::bhsd(1, 1, n, 2)),
            ),
        )
        .path(path)
        .run(TensorMut::new(&mut o[..], ql));
        assert_eq!(
            r,
            Err(Error::ShapeMismatch { arg: "k_scales", dim: "dim", expected: 2, actual: 1 }),
            "{path:?}"
        );
        // Too short a scale slice for V.
        let r = Attention::new(
            TensorRef::new(&q[..], ql),
            Q8Ref::new(
                TensorRef::new(&qv[..], l),
                TensorRef::new(&good_s[..], Tensor4Layout::bhsd(1, 1, n, 2)),
            ),
            Q8Ref::new(
                TensorRef::new(&qv[..], l),
                TensorRef::new(&good_s[..7], Tensor4Layout::bhsd(1, 1, n, 2)),
            ),
        )
        .path(path)
        .run(TensorMut::new(&mut o[..], ql));
        assert_eq!(r, Err(Error::OutOfBounds { arg: "v_scales", required: 8, len: 7 }), "{path:?}");
        // A bf16 output of the wrong length.
        let mut ob = vec![bf16::ZERO; d - 1];
        let r = Attention::new(
            TensorRef::new(&q[..], ql),
            Q8Ref::new(
                TensorRef::new(&qv[..], l),
                TensorRef::new(&good_s[..], Tensor4Layout::bhsd(1, 1, n, 2)),
            ),
            Q8Ref::new(
                TensorRef::new(&qv[..], l),
                TensorRef::new(&good_s[..], Tensor4Layout::bhsd(1, 1, n, 2)),
            ),
        )
        .path(path)
        .run(TensorMut::new(&mut ob[..], ql));
        assert!(matches!(r, Err(Error::OutOfBounds { arg: "o", .. })), "{path:?}: {r:?}");
        assert!(o.iter().all(|&x| x == 7.0));
    }
}

/// The output of every element type is the f32 result rounded once to nearest even.
#[test]
fn output_is_the_f32_result_rounded_once() {
    let (n, d) = (37, 48);
    let c = Case::new(77, 1, 1, 1, 3, n, d, d, false, 0, MaskKind::None, 2.0);
    let mut c2 = c.clone();
    let (q, k, v) = typed(&mut c2, Ty::F32, Ty::F32);
    for isa in Isa::supported() {
        for path in PATHS {
            let (f, _) = run_typed(&c2, Ty::F32, &q, &k, &v, |a| a.isa(isa).path(path)).unwrap();
            let (b, _) = run_typed(&c2, Ty::BF16, &q, &k, &v, |a| a.isa(isa).path(path)).unwrap();
            let (h, _) = run_typed(&c2, Ty::F16, &q, &k, &v, |a| a.isa(isa).path(path)).unwrap();
            for i in 0..f.len() {
                if f[i].is_nan() {
                    assert!(b[i].is_nan() && h[i].is_nan());
                    continue;
                }
                assert_eq!(b[i], bf16::from_f32(f[i]).to_f32(), "{isa} {path:?}");
                assert_eq!(h[i], f16::from_f32(f[i]).to_f32(), "{isa} {path:?}");
            }
        }
    }
}

/// The flash path on `vdpbf16ps` at prefill sizes: long rows (so many key blocks and rescales),
/// d 64 and 128, odd lengths (pair padding at the block ends), causal, a window whose edges
/// fall at odd keys, and GQA; bf16 and f32 outputs. Skipped where the CPU lacks AVX512_BF16
/// (named by `isas_not_runnable_here_are_named`).
#[test]
fn dot_flash_at_prefill_sizes() {
    for (seed, nq, nk, d, mask, window) in [
        (11u64, 130usize, 1100usize, 64usize, MaskKind::None, None),
        (12, 257, 257, 128, MaskKind::Causal(None), None),
        (13, 200, 333, 64, MaskKind::Causal(None), Some((37, 0))),
        (14, 65, 901, 128, MaskKind::Bias, Some((101, 3))),
    ] {
        for bshd in [false, true] {
            let mut case = Case::new(seed, 1, 2, 2, nq, nk, d, d, bshd, 0, mask, 2.0);
            case.variants.window = window;
            let (q, k, v) = typed(&mut case, Ty::BF16, Ty::BF16);
            let want = case.reference();
            for to in [Ty::BF16, Ty::F32] {
                check_dot(&case, to, (&q, &k, &v), &want, 2).unwrap();
            }
        }
    }
}

/// `HalfPath::Dot` where it cannot run is a typed error naming the setting: an f32 or f16 operand, or an ISA other than avx512 (or, on a CPU without
/// AVX512_BF16, any call).
#[test]
fn dot_path_where_it_cannot_run_is_an_error() {
    let case = Case::new(5, 1, 1, 1, 20, 40, 16, 16, false, 0, MaskKind::None, 1.0);
    for (tq, tkv, isa) in [
        (Ty::F32, Ty::BF16, Isa::Avx512),
        (Ty::BF16, Ty::F16, Isa::Avx512),
        (Ty::BF16, Ty::F32, Isa::Avx512),
        (Ty::BF16, Ty::BF16, Isa::Portable),
        (Ty::BF16, Ty::BF16, Isa::Avx2),
    ] {
        if !Isa::supported().contains(&isa) {
            continue;
        }
        let mut c = case.clone();
        let (q, k, v) = typed(&mut c, tq, tkv);
        let r = run_typed(&c, Ty::F32, &q, &k, &v, |a| {
            a.isa(isa).path(Path::Flash).half_path(HalfPath::Dot)
        });
        match r {
            Err(Error::InvalidParameter { arg: "path", .. }) => {}
            other => panic!("{tq:?}/{tkv:?} {isa}: {other:?}"),
        }
    }
    if !bf16_dot_available() {
        let mut c = case.clone();
        let (q, k, v) = typed(&mut c, Ty::BF16, Ty::BF16);
        let r = run_typed(&c, Ty::F32, &q, &k, &v, |a| a.half_path(HalfPath::Dot));
        assert!(matches!(r, Err(Error::InvalidParameter { arg: "path", .. })), "{r:?}");
    }
}
