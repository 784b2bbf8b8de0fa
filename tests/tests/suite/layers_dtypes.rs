//! The layers with bf16/f16 weights and activations (issue 21): multi-head attention,
//! cross-attention and the encoder block, for the weight and activation types engines pass.
//!
//! A layer's result is defined as the f32 layer's on the exact values its operands represent,
//! each output rounded once to the activation type. Widening is exact and the GEMM widens while
//! it packs, so the arithmetic is the f32 layer's: the typed call must equal, bit for bit, the
//! f32 call on the widened weights and inputs with its output rounded (`round_A(f32 layer)`).
//! That is checked for every case, and so is the reference's stage-by-stage bound of
//! `layers_support` on the widened values plus the output rounding: `B + u_A·(|o| + B) + s_A/2`
//! (`u_A` half an ULP relative, `s_A` the smallest subnormal; 0 for f32), as in
//! `attention_dtypes`.

use crate::layers_support::*;
use attn_kernels::arch::convert::Convertible;
use attn_kernels::layers::*;
use attn_kernels::{bf16, f16, DType, Element, Error, Parallelism};
use attn_reference::{Mask, Tensor4Layout, TensorMut, TensorRef};
use attn_tests::fuzz_decode::VariantSpec;

const SEQ: Parallelism = Parallelism::Sequential;

fn seq(batch: usize, n: usize, d: usize) -> Tensor4Layout {
    Tensor4Layout::batch_seq(batch, n, d)
}

/// `(half an ULP relative, smallest subnormal)` of an output type (zeros for f32: the f32
/// bound already holds the f32 output's rounding).
fn out_rounding<A: Element>() -> (f64, f64) {
    match A::DTYPE {
        DType::BF16 => (2f64.powi(-8), 2f64.powi(-133)),
        DType::F16 => (2f64.powi(-11), 2f64.powi(-24)),
        _ => (0.0, 0.0),
    }
}

/// `x` rounded to `A`, and the exact values the rounded elements represent.
fn round<A: Element>(x: &[f32]) -> (Vec<A>, Vec<f32>) {
    let a: Vec<A> = x.iter().map(|&v| A::from_f32(v)).collect();
    let w = a.iter().map(|v| v.to_f32()).collect();
    (a, w)
}

/// The bits of the values (for comparing typed outputs exactly; widening is injective).
fn bits<A: Element>(x: &[A]) -> Vec<u32> {
    x.iter().map(|v| v.to_f32().to_bits()).collect()
}

/// Checks a typed output `got` against the f32 kernel's output `f32_out` on the widened
/// operands (bitwise, after rounding) and against the reference's bound `want` plus the
/// output rounding.
fn check_output<A: Element>(got: &[A], f32_out: &[f32], want: &Bounded, what: &str) {
    let rounded: Vec<A> = f32_out.iter().map(|&v| A::from_f32(v)).collect();
    assert!(bits(got) == bits(&rounded), "{what}: not the f32 layer's output rounded once");
    let (u, s) = out_rounding::<A>();
    let widened: Vec<f32> = got.iter().map(|v| v.to_f32()).collect();
    let mut wider = want.clone();
    for (e, &o) in wider.err.iter_mut().zip(&want.val) {
        *e += u * (f64::from(o).abs() + *e) + s / 2.0;
    }
    // An f16 output beyond 65520 is ±∞ by definition (rounding overflows); compare those by
    // the rule above only (the bitwise check covered them).
    let finite: Vec<usize> = (0..got.len()).filter(|&i| widened[i].is_finite()).collect();
    let pick = |v: &[f32]| finite.iter().map(|&i| v[i]).collect::<Vec<_>>();
    let sub = Bounded {
        rows: 1,
        cols: finite.len(),
        val: pick(&wider.val),
        err: finite.iter().map(|&i| wider.err[i]).collect(),
    };
    assert_bounded(&pick(&widened), &sub, what);
}

/// Self-attention with weights `W` and activations `A` on `batch` sequences of `n` tokens.
fn check_mha<W: Convertible, A: Convertible>(
    p: &MhaParams,
    x: &[f32],
    batch: usize,
    n: usize,
    mask: &Mask<'_>,
) {
    let d = p.cfg.in_dim;
    let pw = p.map(W::from_f32);
    let pf = pw.map(|w| w.to_f32());
    let (xa, xf) = round::<A>(x);
    let l = seq(batch, n, d);
    let mut y32 = vec![f32::NAN; batch * n * d];
    let (tf, tm) = (TensorRef::new(&xf, l), TensorMut::new(&mut y32, l));
    multi_head_attention(&p.cfg, &pf.weights(), tf, mask, tm, SEQ).unwrap();
    let mut y = vec![A::from_f32(f32::NAN); y32.len()];
    let w = pw.weights();
    let what = format!("mha {:?}/{:?} {:?} b{batch} n{n} {mask:?}", W::DTYPE, A::DTYPE, p.cfg);
    multi_head_attention(&p.cfg, &w, TensorRef::new(&xa, l), mask, TensorMut::new(&mut y, l), SEQ)
        .unwrap();
    let want = mha_b(&pf, &Bounded::exact(xf.clone(), batch * n, d), None, batch, mask);
    check_output(&y, &y32, &want, &what);
    // The layer type and the no-allocation form with exactly the stated workspace, bitwise
    // the same; one element less is the workspace error.
    let layer = MultiHeadAttention::new(p.cfg, w).unwrap();
    let mut ws = vec![f32::NAN; layer.workspace_len(batch, n)];
    let mut y2 = vec![A::from_f32(f32::NAN); y.len()];
    let xt = TensorRef::new(&xa, l);
    layer.forward_in(xt, mask, TensorMut::new(&mut y2, l), &mut ws, SEQ).unwrap();
    assert!(bits(&y2) == bits(&y), "{what}: layer type differs");
    if let Some(short) = ws.len().checked_sub(1) {
        let err = layer.forward_in(xt, mask, TensorMut::new(&mut y2, l), &mut ws[..short], SEQ);
        assert!(matches!(err, Err(Error::OutOfBounds { arg: "workspace", .. })), "{what}: {err:?}");
    }
}

/// Cross-attention with weights `W` and activations `A`: `n1` queries, `n2` keys.
fn check_cross<W: Convertible, A: Convertible>(
    p: &MhaParams,
    x1: &[f32],
    x2: &[f32],
    batch: usize,
    n1: usize,
    n2: usize,
    mask: &Mask<'_>,
) {
    let (d1, d2) = (p.cfg.in_dim, p.cfg.kv_in_dim);
    let pw = p.map(W::from_f32);
    let pf = pw.map(|w| w.to_f32());
    let ((x1a, x1f), (x2a, x2f)) = (round::<A>(x1), round::<A>(x2));
    let (l1, l2) = (seq(batch, n1, d1), seq(batch, n2, d2));
    let mut y32 = vec![f32::NAN; batch * n1 * d1];
    let (t1, t2) = (TensorRef::new(&x1f, l1), TensorRef::new(&x2f, l2));
    cross_attention(&p.cfg, &pf.weights(), t1, t2, mask, TensorMut::new(&mut y32, l1), SEQ)
        .unwrap();
    let mut y = vec![A::from_f32(f32::NAN); y32.len()];
    let (t1, t2) = (TensorRef::new(&x1a, l1), TensorRef::new(&x2a, l2));
    let layer = CrossAttention::new(p.cfg, pw.weights()).unwrap();
    let mut ws = vec![f32::NAN; layer.workspace_len(batch, n1, n2)];
    layer.forward_in(t1, t2, mask, TensorMut::new(&mut y, l1), &mut ws, SEQ).unwrap();
    let b2 = Bounded::exact(x2f.clone(), batch * n2, d2);
    let want = mha_b(&pf, &Bounded::exact(x1f.clone(), batch * n1, d1), Some(&b2), batch, mask);
    let what = format!("cross {:?}/{:?} {:?} n1 {n1} n2 {n2}", W::DTYPE, A::DTYPE, p.cfg);
    check_output(&y, &y32, &want, &what);
}

/// The encoder block with weights `W` and activations `A`.
fn check_encoder<W: Convertible, A: Convertible>(
    p: &EncoderParams,
    x: &[f32],
    batch: usize,
    n: usize,
    mask: &Mask<'_>,
) {
    let d = p.cfg.attn.in_dim;
    let pw = p.map(W::from_f32);
    let pf = pw.map(|w| w.to_f32());
    let (xa, xf) = round::<A>(x);
    let l = seq(batch, n, d);
    let mut y32 = vec![f32::NAN; xf.len()];
    encoder_block(
        &p.cfg,
        &pf.weights(),
        TensorRef::new(&xf, l),
        mask,
        TensorMut::new(&mut y32, l),
        SEQ,
    )
    .unwrap();
    let mut y = vec![A::from_f32(f32::NAN); xf.len()];
    let layer = EncoderLayer::new(p.cfg, pw.weights()).unwrap();
    layer.forward(TensorRef::new(&xa, l), mask, TensorMut::new(&mut y, l), SEQ).unwrap();
    let want = encoder_b(&pf, &Bounded::exact(xf.clone(), batch * n, d), batch, mask);
    let what = format!("encoder {:?}/{:?} {:?} b{batch} n{n} {mask:?}", W::DTYPE, A::DTYPE, p.cfg);
    check_output(&y, &y32, &want, &what);
}

/// Runs `$f::<W, A>` for the weight/activation type pairs engines use: all bf16, all f16,
/// half weights under f32 activations, f32 weights with half activations.
macro_rules! each_combo {
    ($f:ident($($arg:expr),*)) => {
        $f::<bf16, bf16>($($arg),*);
        $f::<f16, f16>($($arg),*);
        $f::<bf16, f32>($($arg),*);
        $f::<f16, f32>($($arg),*);
        $f::<f32, bf16>($($arg),*);
        $f::<f32, f16>($($arg),*);
        $f::<bf16, f16>($($arg),*);
    };
}

#[test]
fn mha_in_half_precision() {
    let mut g = Gen::new(21);
    // (in, dk, dv, heads, kv heads): GQA, k ≠ v widths, and q_w < in_dim (the output staging
    // then needs more than the projections: the workspace's maximum).
    for &(d, dk, dv, h, hkv) in &[(32, 8, 8, 4, 2), (24, 4, 6, 2, 1), (16, 8, 8, 2, 2)] {
        let cfg = MhaConfig::new(d, dk, dv, h).with_kv_heads(hkv);
        for &(batch, n, fused, mask) in &[
            (1, 1, true, Mask::None),
            (2, 5, false, Mask::CAUSAL),
            (1, 17, true, Mask::CAUSAL),
            (2, 40, true, Mask::None),
            (1, 0, false, Mask::None),
        ] {
            let p = MhaParams::new(cfg, n % 2 == 1, fused, &mut g);
            let x = g.vec(batch * n * d, 1.0);
            each_combo!(check_mha(&p, &x, batch, n, &mask));
        }
    }
}

#[test]
fn mha_variants_in_half_precision() {
    let mut g = Gen::new(22);
    let cfg = MhaConfig::new(32, 8, 8, 4).with_kv_heads(2);
    let var = VariantSpec {
        window: Some((5, 0)),
        softcap: Some(2.0),
        sinks: Some(g.vec(4, 3.0)),
        alibi: Some(attn_kernels::alibi_slopes(4)),
    };
    let p = MhaParams::new(cfg, true, true, &mut g).with_variants(var);
    let x = g.vec(2 * 33 * 32, 1.0);
    each_combo!(check_mha(&p, &x, 2, 33, &Mask::CAUSAL));
}

#[test]
fn cross_attention_in_half_precision() {
    let mut g = Gen::new(23);
    // The second config has q_w = 8 < in_dim = 24: with n2 = 0 the output staging is all of
    // the projections' region.
    for &(d1, d2, dk, h) in &[(32, 20, 8, 4), (24, 30, 4, 2)] {
        let cfg = MhaConfig::cross(d1, d2, dk, dk, h);
        for &(batch, n1, n2, mask) in
            &[(1, 3, 17, Mask::None), (2, 20, 0, Mask::None), (1, 17, 40, Mask::CAUSAL)]
        {
            let p = MhaParams::new(cfg, true, false, &mut g);
            let x1 = g.vec(batch * n1 * d1, 1.0);
            let x2 = g.vec(batch * n2 * d2, 1.0);
            each_combo!(check_cross(&p, &x1, &x2, batch, n1, n2, &mask));
        }
    }
}

#[test]
fn encoder_in_half_precision() {
    let mut g = Gen::new(24);
    for &(d, dk, h, ff, batch, n, act) in &[
        (32, 8, 4, 64, 1, 5, Activation::Relu),
        (32, 8, 4, 48, 2, 17, Activation::GeluTanh),
        (16, 8, 2, 16, 1, 0, Activation::Relu),
    ] {
        let cfg = EncoderConfig {
            attn: MhaConfig::new(d, dk, dk, h),
            ff_dim: ff,
            activation: act,
            eps: 1e-5,
        };
        let p = EncoderParams::new(cfg, n % 2 == 1, &mut g);
        let x = g.vec(batch * n * d, 1.0);
        each_combo!(check_encoder(&p, &x, batch, n, &Mask::CAUSAL));
    }
}

/// An f16 output overflows to ±∞ from 65520 on (documented): an output bias of 7·10⁴ (held in
/// bf16 weights) gives +∞ in every f16 output element, the bf16 output holds the value.
#[test]
fn f16_output_overflows_to_infinity() {
    let mut g = Gen::new(25);
    let cfg = MhaConfig::new(16, 8, 8, 2);
    let mut p = MhaParams::new(cfg, true, true, &mut g);
    p.bo = Some(vec![7.0e4; 16]);
    let x = g.vec(3 * 16, 1.0);
    check_mha::<bf16, f16>(&p, &x, 1, 3, &Mask::None);
    let pw = p.map(bf16::from_f32);
    let l = seq(1, 3, 16);
    let (xa, _) = round::<f16>(&x);
    let mut y = vec![f16::ZERO; 48];
    let t = TensorRef::new(&xa, l);
    multi_head_attention(&cfg, &pw.weights(), t, &Mask::None, TensorMut::new(&mut y, l), SEQ)
        .unwrap();
    assert!(y.iter().all(|v| v.to_f32() == f32::INFINITY), "{y:?}");
}
