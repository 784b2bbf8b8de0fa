//! The layers (`attn_kernels::layers`) against the reference's modules: each output within the
//! bound derived stage by stage in `layers_support` (projections, scores, softmax, weighted sum,
//! layer norm, feed-forward), including the seed's shapes; the no-allocation forms bitwise equal
//! to the allocating ones; bad input rejected with the reference's error.

use crate::layers_support::*;
use attn_kernels::layers::{self, *};
use attn_kernels::{alibi_slopes, Parallelism};
use attn_reference::{
    self as r, Error, Mask, MatLayout, MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef,
};
use attn_tests::fuzz_decode::VariantSpec;
use proptest::prelude::*;

const SEQ: Parallelism = Parallelism::Sequential;

fn seq(batch: usize, n: usize, d: usize) -> Tensor4Layout {
    Tensor4Layout::batch_seq(batch, n, d)
}

/// The kernel's self-attention output for contiguous `x`.
fn kernel_mha(p: &MhaParams, x: &[f32], batch: usize, n: usize, mask: &Mask<'_>) -> Vec<f32> {
    let d = p.cfg.in_dim;
    let mut y = vec![f32::NAN; batch * n * d];
    multi_head_attention(
        &p.cfg,
        &p.weights(),
        TensorRef::new(x, seq(batch, n, d)),
        mask,
        TensorMut::new(&mut y, seq(batch, n, d)),
        SEQ,
    )
    .unwrap();
    y
}

#[test]
fn linear_matches_reference() {
    let mut g = Gen::new(1);
    for &(n, k, m) in &[(0, 4, 3), (1, 1, 1), (5, 17, 13), (17, 64, 33), (3, 0, 5), (63, 12, 65)] {
        for bias in [false, true] {
            let x = g.vec(n * k, 1.0);
            let w = g.vec(k * m, 1.0);
            let b = bias.then(|| g.vec(m, 1.0));
            let want = linear_b(
                &Bounded::exact(x.clone(), n, k),
                MatRef::row_major(&w, k, m),
                b.as_deref(),
            );
            // The weight as a transposed PyTorch-style [out, in] buffer: same operand, no copy.
            let mut wt = vec![0.0; k * m];
            for p in 0..k {
                for j in 0..m {
                    wt[j * k + p] = w[p * m + j];
                }
            }
            let wv = MatRef::new(&wt, MatLayout::row_major(m, k).transposed());
            let mut y = vec![f32::NAN; n * m];
            linear(
                MatRef::row_major(&x, n, k),
                wv,
                b.as_deref(),
                MatMut::row_major(&mut y, n, m),
                SEQ,
            )
            .unwrap();
            assert_bounded(&y, &want, &format!("linear {n}x{k}x{m} bias={bias}"));
        }
    }
}

#[test]
fn layer_norm_matches_reference() {
    let mut g = Gen::new(2);
    for &(n, d) in &[(1, 1), (3, 5), (4, 16), (7, 17), (2, 63), (5, 257), (1, 1024)] {
        for &(shift, eps) in &[(0.0f32, 1e-5f32), (100.0, 1e-5), (0.5, 0.0)] {
            let x: Vec<f32> = g.vec(n * d, 1.0).into_iter().map(|v| v + shift).collect();
            let gamma = g.vec(d, 2.0);
            let beta = g.vec(d, 1.0);
            if d == 1 && eps == 0.0 {
                continue; // 0/0: NaN on both sides, checked below
            }
            let want = layer_norm_b(&Bounded::exact(x.clone(), n, d), &gamma, &beta, eps);
            let w = LayerNormWeights { gamma: &gamma, beta: &beta };
            let mut y = vec![f32::NAN; n * d];
            layer_norm(MatRef::row_major(&x, n, d), &w, eps, MatMut::row_major(&mut y, n, d))
                .unwrap();
            assert_bounded(&y, &want, &format!("layer_norm {n}x{d} shift {shift}"));
            // Column-major input and padded output rows: the strided path, same values.
            let mut xc = vec![0.0; n * d];
            for i in 0..n {
                for j in 0..d {
                    xc[j * n + i] = x[i * d + j];
                }
            }
            let mut y2 = vec![f32::NAN; n * (d + 3)];
            let yl = MatLayout::strided(n, d, d + 3, 1, 0);
            layer_norm(
                MatRef::new(&xc, MatLayout::col_major(n, d)),
                &w,
                eps,
                MatMut::new(&mut y2, yl),
            )
            .unwrap();
            let y2: Vec<f32> = (0..n * d).map(|i| y2[yl.index(i / d, i % d)]).collect();
            assert_eq!(y2, y, "strided layer_norm equals contiguous (same summation order)");
        }
    }
    // A constant row with eps = 0 is 0/0 = NaN, as in the reference and PyTorch.
    let w = LayerNormWeights { gamma: &[1.0, 1.0], beta: &[0.0, 0.0] };
    let mut y = [0.0; 2];
    layer_norm(MatRef::row_major(&[3.0, 3.0], 1, 2), &w, 0.0, MatMut::row_major(&mut y, 1, 2))
        .unwrap();
    assert!(y.iter().all(|v| v.is_nan()));
}

#[test]
fn positional_encodings_equal_reference_bitwise() {
    let mut g = Gen::new(3);
    for &(batch, n, d, start) in &[(1, 5, 64, 0), (2, 7, 17, 3), (1, 1, 1, 1 << 20), (3, 0, 4, 0)] {
        let mut t = vec![0.0; n * d];
        let mut tr = vec![0.0; n * d];
        sinusoidal_table(start, MatMut::row_major(&mut t, n, d)).unwrap();
        r::sinusoidal_table(start, MatMut::row_major(&mut tr, n, d)).unwrap();
        assert_eq!(t, tr, "table {n}x{d}");
        let x = g.vec(batch * n * d, 1.0);
        let table = g.vec((start.min(16) + n) * d, 1.0);
        let encs = [
            PositionalEncoding::Sinusoidal { start },
            PositionalEncoding::Learned {
                table: MatRef::row_major(&table, start.min(16) + n, d),
                start: start.min(16),
            },
        ];
        for pe in &encs {
            let l = seq(batch, n, d);
            let (mut y, mut yr) = (vec![f32::NAN; x.len()], vec![f32::NAN; x.len()]);
            add_positional_encoding(TensorRef::new(&x, l), pe, TensorMut::new(&mut y, l)).unwrap();
            r::add_positional_encoding(TensorRef::new(&x, l), pe, TensorMut::new(&mut yr, l))
                .unwrap();
            assert_eq!(y, yr);
            let mut inplace = x.clone();
            layers::posenc::add_positional_encoding_in_place(TensorMut::new(&mut inplace, l), pe)
                .unwrap();
            assert_eq!(inplace, y);
        }
    }
    // A learned table too short for the positions: the reference's error.
    let t = [0.0; 8];
    let pe = PositionalEncoding::Learned { table: MatRef::row_major(&t, 2, 4), start: 1 };
    let x = [0.0; 8];
    let mut y = [0.0; 8];
    let l = seq(1, 2, 4);
    let e = add_positional_encoding(TensorRef::new(&x, l), &pe, TensorMut::new(&mut y, l));
    let er = r::add_positional_encoding(TensorRef::new(&x, l), &pe, TensorMut::new(&mut y, l));
    assert_eq!(e, er);
    assert!(e.is_err());
}

/// The seed's shapes: x (1, 5, 64) through 64→64 projections with bias and two heads gives
/// (1, 5, 64); and the golden example's three tokens of width 4 with one head.
#[test]
fn mha_seed_shapes() {
    let mut g = Gen::new(4);
    for (cfg, batch, n) in
        [(MhaConfig::new(64, 32, 32, 2), 1, 5), (MhaConfig::new(4, 3, 3, 1), 1, 3)]
    {
        for fused in [false, true] {
            let p = MhaParams::new(cfg, true, fused, &mut g);
            let x = g.vec(batch * n * cfg.in_dim, 1.0);
            let want = mha_b(
                &p,
                &Bounded::exact(x.clone(), batch * n, cfg.in_dim),
                None,
                batch,
                &Mask::None,
            );
            let y = kernel_mha(&p, &x, batch, n, &Mask::None);
            assert_eq!(y.len(), batch * n * 64.min(cfg.in_dim.max(4)));
            assert_bounded(&y, &want, &format!("seed mha {cfg:?} fused={fused}"));
            // The first-order worst-case bound stays below 0.1% of the output's scale here, so a
            // wrong head, mask or bias (errors of order 1) cannot pass.
            let max_err = want.err.iter().copied().fold(0.0, f64::max);
            let max_val = want.val.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max);
            assert!(max_err < 1e-3 * max_val, "bound {max_err:e} too loose to catch errors");
        }
    }
}

#[test]
fn mha_matches_reference_over_configs_and_masks() {
    let mut g = Gen::new(5);
    // (in_dim, k_dim, v_dim, heads, kv_heads, batch, n)
    let cases = [
        (16, 8, 8, 2, 2, 1, 1),
        (24, 8, 5, 3, 3, 2, 17),
        (32, 16, 8, 4, 2, 1, 33), // GQA
        (32, 4, 12, 4, 1, 2, 9),  // MQA, k_dim ≠ v_dim
        (12, 1, 1, 1, 1, 1, 63),
        (8, 8, 8, 2, 2, 1, 0),
    ];
    for &(d, dk, dv, h, hkv, batch, n) in &cases {
        let cfg = MhaConfig::new(d, dk, dv, h).with_kv_heads(hkv);
        let keep: Vec<bool> = (0..batch * n).map(|i| i % 3 != 1).collect();
        // A keep-mask whose row 0 is fully masked: its attention row is 0, so y = bo there.
        let mut keep_mat: Vec<bool> = (0..n * n).map(|i| i % 5 != 2).collect();
        keep_mat.iter_mut().take(n).for_each(|k| *k = false);
        let bias = g.vec(n * n, 2.0);
        let masks = [
            Mask::None,
            Mask::CAUSAL,
            Mask::Causal { offset: Some(-2) },
            Mask::key_padding(&keep, batch, h, n, n),
            Mask::keep_mat(&keep_mat, batch, h, n, n),
            Mask::bias_mat(&bias, batch, h, n, n),
        ];
        for (mi, mask) in masks.iter().enumerate() {
            let fused = mi % 2 == 0;
            let p = MhaParams::new(cfg, mi != 1, fused, &mut g);
            let x = g.vec(batch * n * d, 1.0);
            let want = mha_b(&p, &Bounded::exact(x.clone(), batch * n, d), None, batch, mask);
            let y = kernel_mha(&p, &x, batch, n, mask);
            assert_bounded(&y, &want, &format!("mha {cfg:?} b{batch} n{n} mask {mi}"));
        }
    }
}

#[test]
fn mha_strided_activations() {
    // x and y with padded rows and a batch stride that does not stack rows: the per-batch path.
    let mut g = Gen::new(6);
    let (batch, n, d) = (3, 7, 16);
    let cfg = MhaConfig::new(d, 4, 6, 4).with_kv_heads(2);
    let p = MhaParams::new(cfg, true, true, &mut g);
    let x = g.vec(batch * n * d, 1.0);
    let want = mha_b(&p, &Bounded::exact(x.clone(), batch * n, d), None, batch, &Mask::CAUSAL);
    let l = Tensor4Layout::strided([batch, 1, n, d], [n * (d + 2) + 5, 0, d + 2, 1], 3);
    let mut xs = vec![f32::NAN; l.required_len().unwrap() + 4];
    for b in 0..batch {
        for s in 0..n {
            for j in 0..d {
                xs[l.index(b, 0, s, j)] = x[(b * n + s) * d + j];
            }
        }
    }
    let mut ys = vec![f32::NAN; xs.len()];
    multi_head_attention(
        &p.cfg,
        &p.weights(),
        TensorRef::new(&xs, l),
        &Mask::CAUSAL,
        TensorMut::new(&mut ys, l),
        SEQ,
    )
    .unwrap();
    let y: Vec<f32> =
        (0..batch * n * d).map(|i| ys[l.index(i / (n * d), 0, (i / d) % n, i % d)]).collect();
    assert_bounded(&y, &want, "strided mha");
    // Nothing outside y's view is written.
    for (i, v) in ys.iter().enumerate() {
        let inside = (0..batch * n * d).any(|e| l.index(e / (n * d), 0, (e / d) % n, e % d) == i);
        assert_eq!(inside, !v.is_nan(), "element {i}");
    }
}

#[test]
fn cross_attention_matches_reference() {
    let mut g = Gen::new(7);
    // (in_dim1, in_dim2, k_dim, v_dim, heads, kv_heads, batch, n1, n2)
    for &(d1, d2, dk, dv, h, hkv, batch, n1, n2) in &[
        (16, 24, 8, 8, 2, 2, 1, 5, 9),
        (12, 7, 4, 6, 3, 1, 2, 17, 3),
        (8, 8, 4, 4, 2, 2, 1, 4, 0), // no keys: y = bo
        (8, 5, 4, 4, 2, 2, 2, 0, 3),
    ] {
        let cfg = MhaConfig::cross(d1, d2, dk, dv, h).with_kv_heads(hkv);
        let p = MhaParams::new(cfg, true, false, &mut g);
        let x1 = g.vec(batch * n1 * d1, 1.0);
        let x2 = g.vec(batch * n2 * d2, 1.0);
        for mask in [Mask::None, Mask::CAUSAL] {
            let b2 = Bounded::exact(x2.clone(), batch * n2, d2);
            let want =
                mha_b(&p, &Bounded::exact(x1.clone(), batch * n1, d1), Some(&b2), batch, &mask);
            let mut yr = vec![0.0; batch * n1 * d1];
            r::cross_attention(
                &cfg,
                &p.weights(),
                TensorRef::new(&x1, seq(batch, n1, d1)),
                TensorRef::new(&x2, seq(batch, n2, d2)),
                &mask,
                TensorMut::new(&mut yr, seq(batch, n1, d1)),
            )
            .unwrap();
            assert_eq!(yr, want.val, "reference stages reproduce the reference module");
            let mut y = vec![f32::NAN; batch * n1 * d1];
            cross_attention(
                &cfg,
                &p.weights(),
                TensorRef::new(&x1, seq(batch, n1, d1)),
                TensorRef::new(&x2, seq(batch, n2, d2)),
                &mask,
                TensorMut::new(&mut y, seq(batch, n1, d1)),
                SEQ,
            )
            .unwrap();
            assert_bounded(&y, &want, &format!("cross {cfg:?} n1 {n1} n2 {n2}"));
        }
    }
}

fn encoder_cfg(d: usize, dk: usize, h: usize, ff: usize, act: Activation) -> EncoderConfig {
    EncoderConfig { attn: MhaConfig::new(d, dk, dk, h), ff_dim: ff, activation: act, eps: 1e-5 }
}

#[test]
fn encoder_matches_reference() {
    let mut g = Gen::new(8);
    for &(d, dk, h, ff, batch, n, act) in &[
        (64, 32, 2, 128, 1, 5, Activation::Relu),
        (32, 8, 4, 64, 2, 17, Activation::GeluTanh),
        (24, 6, 4, 40, 1, 33, Activation::Relu),
        (16, 8, 2, 16, 1, 0, Activation::Relu),
    ] {
        let cfg = encoder_cfg(d, dk, h, ff, act);
        for (fused, mask) in [(true, Mask::None), (false, Mask::CAUSAL)] {
            let p = EncoderParams::new(cfg, fused, &mut g);
            let x = g.vec(batch * n * d, 1.0);
            let want = encoder_b(&p, &Bounded::exact(x.clone(), batch * n, d), batch, &mask);
            let mut yr = vec![0.0; x.len()];
            let l = seq(batch, n, d);
            r::encoder_block(
                &cfg,
                &p.weights(),
                TensorRef::new(&x, l),
                &mask,
                TensorMut::new(&mut yr, l),
            )
            .unwrap();
            assert_eq!(yr, want.val, "reference stages reproduce the reference block");
            let mut y = vec![f32::NAN; x.len()];
            encoder_block(
                &cfg,
                &p.weights(),
                TensorRef::new(&x, l),
                &mask,
                TensorMut::new(&mut y, l),
                SEQ,
            )
            .unwrap();
            assert_bounded(&y, &want, &format!("encoder d{d} h{h} ff{ff} n{n} {act:?}"));
        }
    }
}

/// One layer's two forms on the same input: `alloc` (the allocating form, writing the `out_len`
/// output it is given) and `with_ws` (the `*_in` form, given the output and a workspace) must
/// agree bit for bit when the workspace holds `ws_len` elements and more, NaN-filled so stale
/// contents cannot leak; one element short must be [`Error::OutOfBounds`] naming it.
fn check_forms(
    what: &str,
    (out_len, ws_len): (usize, usize),
    alloc: impl FnOnce(&mut [f32]) -> r::Result<()>,
    with_ws: impl Fn(&mut [f32], &mut [f32]) -> r::Result<()>,
) {
    let mut y = vec![0.0; out_len];
    alloc(&mut y).unwrap();
    let mut y2 = vec![0.0; out_len];
    with_ws(&mut y2, &mut vec![f32::NAN; ws_len + 7]).unwrap();
    assert_eq!(y, y2, "{what}");
    let e = with_ws(&mut y2, &mut vec![0.0; ws_len - 1]);
    let short = Error::OutOfBounds { arg: "workspace", required: ws_len, len: ws_len - 1 };
    assert_eq!(e, Err(short), "{what}");
}

/// The `_in` forms with a NaN-filled (so stale contents cannot leak) oversized workspace give
/// bitwise the allocating forms' results; one element short is the typed error.
#[test]
fn workspace_forms_equal_allocating_bitwise() {
    let mut g = Gen::new(9);
    let (batch, n, n2, d) = (2, 9, 5, 16);

    let cfg = encoder_cfg(d, 4, 4, 24, Activation::Relu);
    let p = EncoderParams::new(cfg, true, &mut g);
    let x = g.vec(batch * n * d, 1.0);
    let l = seq(batch, n, d);
    let w = p.weights();
    let xt = TensorRef::new(&x, l);

    let len = mha_workspace_len(&cfg.attn, batch, n, n);
    let mha = MultiHeadAttention::new(cfg.attn, w.attn).unwrap();
    assert_eq!(mha.workspace_len(batch, n), len);
    check_forms(
        "mha",
        (x.len(), len),
        |y| multi_head_attention(&cfg.attn, &w.attn, xt, &Mask::CAUSAL, TensorMut::new(y, l), SEQ),
        |y, ws| mha.forward_in(xt, &Mask::CAUSAL, TensorMut::new(y, l), ws, SEQ),
    );

    let ccfg = MhaConfig::cross(d, 7, 4, 8, 2);
    let cp = MhaParams::new(ccfg, true, false, &mut g);
    let x2 = g.vec(batch * n2 * 7, 1.0);
    let x2t = TensorRef::new(&x2, seq(batch, n2, 7));
    let cross = CrossAttention::new(ccfg, cp.weights()).unwrap();
    check_forms(
        "cross",
        (x.len(), cross.workspace_len(batch, n, n2)),
        |y| cross.forward(xt, x2t, &Mask::None, TensorMut::new(y, l), SEQ),
        |y, ws| cross.forward_in(xt, x2t, &Mask::None, TensorMut::new(y, l), ws, SEQ),
    );

    let enc = EncoderLayer::new(cfg, w).unwrap();
    let len = enc.workspace_len(batch, n);
    assert_eq!(len, encoder_workspace_len(&cfg, batch, n));
    check_forms(
        "encoder",
        (x.len(), len),
        |y| enc.forward(xt, &Mask::None, TensorMut::new(y, l), SEQ),
        |y, ws| enc.forward_in(xt, &Mask::None, TensorMut::new(y, l), ws, SEQ),
    );

    let rows = batch * n;
    let xm = MatRef::row_major(&x, rows, d);
    let act = Activation::GeluTanh;
    check_forms(
        "feed_forward",
        (x.len(), feed_forward_workspace_len(rows, cfg.ff_dim)),
        |y| feed_forward(xm, &w.ff, act, MatMut::row_major(y, rows, d), SEQ),
        |y, ws| feed_forward_in(xm, &w.ff, act, MatMut::row_major(y, rows, d), ws, SEQ),
    );

    // Saturated sizes are a too-small workspace, never a wrapped one.
    assert_eq!(mha_workspace_len(&cfg.attn, usize::MAX, 2, 2), usize::MAX);
}

/// Bad input gets the reference's error, before any workspace is looked at.
#[test]
fn bad_input_same_error_as_reference() {
    let mut g = Gen::new(10);
    let (batch, n, d) = (1, 4, 8);
    let cfg = MhaConfig::new(d, 4, 4, 2);
    let p = MhaParams::new(cfg, true, false, &mut g);
    let x = g.vec(batch * n * d, 1.0);
    let l = seq(batch, n, d);
    let keep = [true; 3];
    let wrong_bias = [0.0f32; 3];
    let mut bad_w = p.weights();
    bad_w.bk = Some(&wrong_bias);
    let cases: Vec<(MhaConfig, r::MhaWeights<'_>, Tensor4Layout, Mask<'_>, &str)> = vec![
        (MhaConfig { num_heads: 0, ..cfg }, p.weights(), l, Mask::None, "zero heads"),
        (cfg.with_kv_heads(0), p.weights(), l, Mask::None, "zero kv heads"),
        (
            MhaConfig::new(d, 4, 4, 3).with_kv_heads(2),
            p.weights(),
            l,
            Mask::None,
            "kv not dividing",
        ),
        (MhaConfig::new(d, 5, 4, 2), p.weights(), l, Mask::None, "weight shape"),
        (cfg, bad_w, l, Mask::None, "bias length"),
        (cfg, p.weights(), seq(batch, n, d + 1), Mask::None, "x width"),
        (cfg, p.weights(), l, Mask::key_padding(&keep, batch, 2, n, 3), "mask dims"),
        (cfg, p.weights(), seq(batch, n + 1, d), Mask::None, "x overruns"),
        (MhaConfig::cross(d, 5, 4, 4, 2), p.weights(), l, Mask::None, "not self-attention"),
    ];
    for (c, w, xl, mask, what) in cases {
        let mut y = vec![0.0; 64];
        let mut yr = vec![0.0; 64];
        let want = r::multi_head_attention(
            &c,
            &w,
            TensorRef::new(&x, xl),
            &mask,
            TensorMut::new(&mut yr, xl),
        );
        let got = multi_head_attention(
            &c,
            &w,
            TensorRef::new(&x, xl),
            &mask,
            TensorMut::new(&mut y, xl),
            SEQ,
        );
        assert!(want.is_err(), "{what}: the reference rejects it");
        assert_eq!(got, want, "{what}");
        let got = multi_head_attention_in(
            &c,
            &w,
            TensorRef::new(&x, xl),
            &mask,
            TensorMut::new(&mut y, xl),
            &mut [],
            SEQ,
        );
        assert_eq!(got, want, "{what} (workspace form)");
    }
    // Encoder: a negative epsilon and a wrong norm length.
    let ecfg = encoder_cfg(d, 4, 2, 8, Activation::Relu);
    let ep = EncoderParams::new(ecfg, false, &mut g);
    let mut y = vec![0.0; x.len()];
    let mut yr = vec![0.0; x.len()];
    for (c, what) in [
        (EncoderConfig { eps: -1.0, ..ecfg }, "eps"),
        (EncoderConfig { eps: f32::NAN, ..ecfg }, "nan eps"),
    ] {
        let want = r::encoder_block(
            &c,
            &ep.weights(),
            TensorRef::new(&x, l),
            &Mask::None,
            TensorMut::new(&mut yr, l),
        );
        let got = encoder_block(
            &c,
            &ep.weights(),
            TensorRef::new(&x, l),
            &Mask::None,
            TensorMut::new(&mut y, l),
            SEQ,
        );
        assert!(want.is_err());
        // Debug form: NonFinite carries a NaN, which is not == itself.
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "{what}");
    }
    let mut w = ep.weights();
    w.norm2.beta = &keep_as_f32()[..];
    let want =
        r::encoder_block(&ecfg, &w, TensorRef::new(&x, l), &Mask::None, TensorMut::new(&mut yr, l));
    let got = encoder_block(
        &ecfg,
        &w,
        TensorRef::new(&x, l),
        &Mask::None,
        TensorMut::new(&mut y, l),
        SEQ,
    );
    assert!(want.is_err());
    assert_eq!(got, want);
    assert!(EncoderLayer::new(EncoderConfig { eps: -1.0, ..ecfg }, ep.weights()).is_err());
}

fn keep_as_f32() -> &'static [f32; 3] {
    &[0.0; 3]
}

/// Two threads give the sequential result within the same bound (the GEMM is bitwise
/// thread-independent; the attention kernel's split may change summation order).
#[test]
fn encoder_two_threads() {
    let mut g = Gen::new(11);
    let cfg = encoder_cfg(64, 16, 4, 128, Activation::Relu);
    let p = EncoderParams::new(cfg, true, &mut g);
    let (batch, n) = (2, 70);
    let x = g.vec(batch * n * 64, 1.0);
    let want = encoder_b(&p, &Bounded::exact(x.clone(), batch * n, 64), batch, &Mask::CAUSAL);
    let l = seq(batch, n, 64);
    let mut y = vec![f32::NAN; x.len()];
    encoder_block(
        &cfg,
        &p.weights(),
        TensorRef::new(&x, l),
        &Mask::CAUSAL,
        TensorMut::new(&mut y, l),
        Parallelism::threads(2),
    )
    .unwrap();
    assert_bounded(&y, &want, "encoder, 2 threads");
}

/// Not a test: the fused-vs-separate QKV measurement behind the choice to fuse (interleaved
/// A/B runs, so a busy machine's load hits both sides alike). Run with
/// `cargo test --release -p attn-tests --test suite fused_qkv_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn fused_qkv_timing() {
    use std::time::{Duration, Instant};
    for (n, d, t) in [(512, 512, 1), (512, 512, 2), (2048, 1024, 1)] {
        let par = Parallelism::threads(t);
        let mut g = Gen::new(12);
        let x = g.vec(n * d, 1.0);
        let wqkv = g.vec(d * 3 * d, 0.05);
        let sep: Vec<Vec<f32>> = (0..3)
            .map(|c| (0..d).flat_map(|r| wqkv[r * 3 * d + c * d..][..d].to_vec()).collect())
            .collect();
        let mut out = vec![0.0; n * 3 * d];
        let xm = MatRef::row_major(&x, n, d);
        let (mut tf, mut ts) = (Vec::new(), Vec::new());
        for _ in 0..9 {
            let s = Instant::now();
            let o = MatMut::row_major(&mut out, n, 3 * d);
            linear(xm, MatRef::row_major(&wqkv, d, 3 * d), None, o, par).unwrap();
            tf.push(s.elapsed());
            let s = Instant::now();
            for (c, w) in sep.iter().enumerate() {
                let o = MatMut::new(&mut out, MatLayout::strided(n, d, 3 * d, 1, c * d));
                linear(xm, MatRef::row_major(w, d, d), None, o, par).unwrap();
            }
            ts.push(s.elapsed());
        }
        let med = |v: &mut Vec<Duration>| {
            v.sort();
            v[v.len() / 2].as_secs_f64() * 1e3
        };
        let (f, s) = (med(&mut tf), med(&mut ts));
        let gf = 2.0 * (n * d * 3 * d) as f64 / 1e6;
        println!(
            "QKV n {n} d {d} threads {t}: fused {f:.2} ms ({:.1} GFLOP/s), 3 GEMMs {s:.2} ms \
             ({:.1} GFLOP/s), fused/separate {:.3}",
            gf / f,
            gf / s,
            f / s
        );
    }
}

#[test]
fn encoder_is_bitwise_identical_across_thread_counts() {
    // Issue 25: every kernel the layers call (SGEMM, attention) splits its work by the problem,
    // never by the thread count, so the whole block is bitwise the same at 1, 2, 3 and 8
    // threads. n = 40 queries take the flash path; a 4-query call takes the decode path.
    let mut g = Gen::new(25);
    let cfg = encoder_cfg(64, 16, 4, 128, Activation::GeluTanh);
    let p = EncoderParams::new(cfg, true, &mut g);
    for (batch, n, mask) in [(2, 40, Mask::CAUSAL), (3, 4, Mask::None)] {
        let x = g.vec(batch * n * 64, 1.0);
        let l = seq(batch, n, 64);
        let run = |par| {
            let mut y = vec![f32::NAN; x.len()];
            let (xr, yr) = (TensorRef::new(&x, l), TensorMut::new(&mut y, l));
            encoder_block(&cfg, &p.weights(), xr, &mask, yr, par).unwrap();
            y.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let one = run(SEQ);
        for threads in [2, 3, 8] {
            assert!(run(Parallelism::threads(threads)) == one, "{threads} threads, n {n}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Attention variants in the layers (issue 22): `MhaWeights::variants` reaches every head of
// multi-head attention, cross-attention and the encoder block, as in the reference.

/// Owned variants for `h` query heads from the strategy's choices.
fn variant_spec(
    h: usize,
    seed: u64,
    window: Option<(usize, usize)>,
    softcap: Option<f32>,
    sinks: bool,
    alibi: Option<bool>,
) -> VariantSpec {
    let mut g = Gen::new(seed ^ 0x5EED);
    VariantSpec {
        window,
        softcap,
        sinks: sinks.then(|| g.vec(h, 3.0)),
        // `Some(true)`: the standard slopes; `Some(false)`: random ones of either sign.
        alibi: alibi.map(|std| if std { alibi_slopes(h) } else { g.vec(h, 0.5) }),
    }
}

/// A layer shape, its variants and a mask: `(cfg, batch, n, n2, mask, variants, fused, seed)`.
type LayerCase = (MhaConfig, usize, usize, usize, Mask<'static>, VariantSpec, bool, u64);

/// Small layers (both attention paths: n ≤ 16 decodes, n > 16 takes the flash path) with
/// random variants, each on about half the time, with no mask or a causal one (any offset).
fn layer_case() -> impl Strategy<Value = LayerCase> {
    let heads = vec![(1usize, 1usize), (2, 1), (2, 2), (3, 3), (4, 2), (4, 1)];
    let side = prop::sample::select(vec![0usize, 1, 3, 8, usize::MAX]);
    let window = prop_oneof![1 => Just(None), 2 => (side.clone(), side).prop_map(Some)];
    let mask = prop::sample::select(vec![
        Mask::None,
        Mask::CAUSAL,
        Mask::Causal { offset: Some(-2) },
        Mask::Causal { offset: Some(3) },
    ]);
    (
        (
            prop::sample::select(heads),
            prop::sample::select(vec![4usize, 8, 12]),
            prop::sample::select(vec![1usize, 4, 8]),
            prop::sample::select(vec![1usize, 4, 8]),
        ),
        (
            1usize..=2,
            prop::sample::select(vec![1usize, 3, 16, 17, 40]),
            prop::sample::select(vec![0usize, 1, 5, 33]),
        ),
        mask,
        (
            window,
            prop::option::of(prop::sample::select(vec![0.5f32, 2.0, 30.0])),
            any::<bool>(),
            prop::option::of(any::<bool>()),
        ),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(
                ((h, hkv), d, dk, dv),
                (batch, n, n2),
                mask,
                (win, cap, sinks, alibi),
                fused,
                seed,
            )| {
                let cfg = MhaConfig::new(d, dk, dv, h).with_kv_heads(hkv);
                let var = variant_spec(h, seed, win, cap, sinks, alibi);
                (cfg, batch, n, n2, mask, var, fused, seed)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Self-attention, the layer type and the no-allocation form with variants: within the
    /// stage-by-stage bound of the reference (`mha_b`, whose attention stage adds the softcap's
    /// and the ALiBi term's errors), the three forms bitwise equal.
    #[test]
    fn mha_with_variants_matches_reference(case in layer_case()) {
        let (cfg, batch, n, _, mask, var, fused, seed) = case;
        let mut g = Gen::new(seed);
        let p = MhaParams::new(cfg, seed % 3 != 0, fused, &mut g).with_variants(var);
        let x = g.vec(batch * n * cfg.in_dim, 1.0);
        let want = mha_b(&p, &Bounded::exact(x.clone(), batch * n, cfg.in_dim), None, batch, &mask);
        let y = kernel_mha(&p, &x, batch, n, &mask);
        assert_bounded(&y, &want, &format!("mha {cfg:?} b{batch} n{n} {mask:?} {:?}", p.var));
        let layer = MultiHeadAttention::new(cfg, p.weights()).unwrap();
        let l = seq(batch, n, cfg.in_dim);
        let mut y2 = vec![f32::NAN; y.len()];
        let mut ws = vec![f32::NAN; layer.workspace_len(batch, n)];
        layer.forward_in(TensorRef::new(&x, l), &mask, TensorMut::new(&mut y2, l), &mut ws, SEQ)
            .unwrap();
        prop_assert!(bits(&y2) == bits(&y), "layer type differs from the free function");
    }

    /// Cross-attention with variants (the window and ALiBi measure from the mask's offset,
    /// `n2 − n1` by default) against the reference's stages; `n2 = 0` leaves only the sinks.
    #[test]
    fn cross_attention_with_variants_matches_reference(case in layer_case()) {
        let (c, batch, n1, n2, mask, var, _, seed) = case;
        let d2 = c.in_dim + 3;
        let cfg = MhaConfig::cross(c.in_dim, d2, c.k_dim, c.v_dim, c.num_heads)
            .with_kv_heads(c.kv_heads);
        let mut g = Gen::new(seed);
        let p = MhaParams::new(cfg, true, false, &mut g).with_variants(var);
        let (d1, w) = (cfg.in_dim, p.weights());
        let x1 = g.vec(batch * n1 * d1, 1.0);
        let x2 = g.vec(batch * n2 * d2, 1.0);
        let b2 = Bounded::exact(x2.clone(), batch * n2, d2);
        let want = mha_b(&p, &Bounded::exact(x1.clone(), batch * n1, d1), Some(&b2), batch, &mask);
        let (l1, l2) = (seq(batch, n1, d1), seq(batch, n2, d2));
        let mut yr = vec![0.0; batch * n1 * d1];
        let (t1, t2) = (TensorRef::new(&x1, l1), TensorRef::new(&x2, l2));
        r::cross_attention(&cfg, &w, t1, t2, &mask, TensorMut::new(&mut yr, l1)).unwrap();
        prop_assert!(bits(&yr) == bits(&want.val), "reference stages reproduce the module");
        let mut y = vec![f32::NAN; yr.len()];
        cross_attention(&cfg, &w, t1, t2, &mask, TensorMut::new(&mut y, l1), SEQ).unwrap();
        assert_bounded(&y, &want, &format!("cross {cfg:?} n1 {n1} n2 {n2} {mask:?} {:?}", p.var));
    }

    /// The encoder block with variants on its attention, against the reference's stages.
    #[test]
    fn encoder_with_variants_matches_reference(case in layer_case()) {
        let (attn, batch, n, _, mask, var, fused, seed) = case;
        let act = if seed % 2 == 0 { Activation::Relu } else { Activation::GeluTanh };
        let cfg = EncoderConfig { attn, ff_dim: 2 * attn.in_dim, activation: act, eps: 1e-5 };
        let mut g = Gen::new(seed);
        let mut p = EncoderParams::new(cfg, fused, &mut g);
        p.attn.var = var;
        let d = attn.in_dim;
        let x = g.vec(batch * n * d, 1.0);
        let want = encoder_b(&p, &Bounded::exact(x.clone(), batch * n, d), batch, &mask);
        let l = seq(batch, n, d);
        let mut yr = vec![0.0; x.len()];
        let xt = TensorRef::new(&x, l);
        r::encoder_block(&cfg, &p.weights(), xt, &mask, TensorMut::new(&mut yr, l)).unwrap();
        prop_assert!(bits(&yr) == bits(&want.val), "reference stages reproduce the block");
        let mut y = vec![f32::NAN; x.len()];
        encoder_block(&cfg, &p.weights(), xt, &mask, TensorMut::new(&mut y, l), SEQ).unwrap();
        assert_bounded(&y, &want, &format!("encoder {attn:?} n{n} {mask:?} {:?}", p.attn.var));
        let layer = EncoderLayer::new(cfg, p.weights()).unwrap();
        let mut y2 = vec![f32::NAN; x.len()];
        layer.forward(xt, &mask, TensorMut::new(&mut y2, l), SEQ).unwrap();
        prop_assert!(bits(&y2) == bits(&y), "layer type differs from the free function");
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Variants that change nothing (a window unbounded on both sides, ALiBi slopes of zero) give
/// bitwise the plain layer's output, on both attention paths; so does `Variants::NONE` set
/// explicitly. And a variant that changes something does change the output (the variants do
/// reach the heads).
#[test]
fn neutral_variants_are_bitwise_plain() {
    let mut g = Gen::new(22);
    let cfg = MhaConfig::new(16, 8, 8, 4).with_kv_heads(2);
    let plain = MhaParams::new(cfg, true, true, &mut g);
    let neutral = [
        VariantSpec { window: Some((usize::MAX, usize::MAX)), ..VariantSpec::default() },
        VariantSpec { alibi: Some(vec![0.0; 4]), ..VariantSpec::default() },
        VariantSpec {
            window: Some((usize::MAX, usize::MAX)),
            alibi: Some(vec![0.0; 4]),
            ..VariantSpec::default()
        },
    ];
    let with = |var: VariantSpec| {
        let mut p = MhaParams::new(cfg, true, true, &mut Gen::new(0));
        (p.wqkv, p.wo, p.bq, p.bk, p.bv, p.bo) = (
            plain.wqkv.clone(),
            plain.wo.clone(),
            plain.bq.clone(),
            plain.bk.clone(),
            plain.bv.clone(),
            plain.bo.clone(),
        );
        p.with_variants(var)
    };
    for (batch, n) in [(2, 5), (1, 40)] {
        let x = g.vec(batch * n * 16, 1.0);
        for mask in [Mask::None, Mask::CAUSAL] {
            let base = bits(&kernel_mha(&plain, &x, batch, n, &mask));
            for var in &neutral {
                let y = kernel_mha(&with(var.clone()), &x, batch, n, &mask);
                assert!(bits(&y) == base, "n {n} {mask:?} {var:?}");
            }
            let y = kernel_mha(
                &with(VariantSpec { window: Some((1, 0)), ..Default::default() }),
                &x,
                batch,
                n,
                &mask,
            );
            assert!(bits(&y) != base, "a window of 2 keys changes the output (n {n}, {mask:?})");
        }
    }
}

/// Bad variants (non-finite or misnumbered sinks and slopes, a softcap that is not finite and
/// positive) are the reference's typed errors in every layer and both forms, and the layer
/// types refuse them at set-up.
#[test]
fn bad_variants_same_error_as_reference() {
    let mut g = Gen::new(23);
    let (batch, n, d, h) = (1, 4, 8, 2);
    let cfg = MhaConfig::new(d, 4, 4, h);
    let x = g.vec(batch * n * d, 1.0);
    let l = seq(batch, n, d);
    let spec = |f: fn(&mut VariantSpec)| {
        let mut v = VariantSpec::default();
        f(&mut v);
        v
    };
    // Each bad spec with the test its error must pass.
    type Expect = fn(&Error) -> bool;
    let bad: [(VariantSpec, Expect); 9] = [
        (spec(|v| v.sinks = Some(vec![0.0, f32::NAN])), |e| {
            matches!(e, Error::NonFinite { arg: "sinks", .. })
        }),
        (spec(|v| v.sinks = Some(vec![f32::NEG_INFINITY, 0.0])), |e| {
            matches!(e, Error::NonFinite { arg: "sinks", .. })
        }),
        (spec(|v| v.alibi = Some(vec![0.5, f32::INFINITY])), |e| {
            matches!(e, Error::NonFinite { arg: "alibi", .. })
        }),
        (spec(|v| v.alibi = Some(vec![0.5])), |e| {
            matches!(e, Error::ShapeMismatch { arg: "alibi", .. })
        }),
        (spec(|v| v.sinks = Some(vec![0.5; 3])), |e| {
            matches!(e, Error::ShapeMismatch { arg: "sinks", .. })
        }),
        (spec(|v| v.softcap = Some(-1.0)), |e| {
            matches!(e, Error::InvalidParameter { arg: "softcap", .. })
        }),
        (spec(|v| v.softcap = Some(0.0)), |e| {
            matches!(e, Error::InvalidParameter { arg: "softcap", .. })
        }),
        (spec(|v| v.softcap = Some(f32::NAN)), |e| {
            matches!(e, Error::NonFinite { arg: "softcap", .. })
        }),
        (spec(|v| v.softcap = Some(f32::INFINITY)), |e| {
            matches!(e, Error::NonFinite { arg: "softcap", .. })
        }),
    ];
    let dbg = |r: &r::Result<()>| format!("{r:?}");
    for (var, is_expected) in bad {
        let what = format!("{var:?}");
        let p = MhaParams::new(cfg, true, true, &mut g).with_variants(var);
        let w = p.weights();
        let xt = TensorRef::new(&x, l);
        let (mut y, mut yr) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        let want = r::multi_head_attention(&cfg, &w, xt, &Mask::None, TensorMut::new(&mut yr, l));
        assert!(want.as_ref().is_err_and(is_expected), "{what}: reference gives {want:?}");
        let got = multi_head_attention(&cfg, &w, xt, &Mask::None, TensorMut::new(&mut y, l), SEQ);
        assert_eq!(dbg(&got), dbg(&want), "{what}: mha");
        let got = multi_head_attention_in(
            &cfg,
            &w,
            xt,
            &Mask::None,
            TensorMut::new(&mut y, l),
            &mut [],
            SEQ,
        );
        assert_eq!(dbg(&got), dbg(&want), "{what}: mha (workspace form)");
        assert_eq!(dbg(&MultiHeadAttention::new(cfg, w).map(|_| ())), dbg(&want), "{what}");

        let ccfg = MhaConfig::cross(d, 5, 4, 4, h);
        let cp = MhaParams::new(ccfg, true, false, &mut g).with_variants(p.var.clone());
        let x2 = g.vec(batch * 3 * 5, 1.0);
        let x2t = TensorRef::new(&x2, seq(batch, 3, 5));
        let want = r::cross_attention(
            &ccfg,
            &cp.weights(),
            xt,
            x2t,
            &Mask::None,
            TensorMut::new(&mut yr, l),
        );
        assert!(want.as_ref().is_err_and(is_expected), "{what}: reference cross gives {want:?}");
        let got = cross_attention(
            &ccfg,
            &cp.weights(),
            xt,
            x2t,
            &Mask::None,
            TensorMut::new(&mut y, l),
            SEQ,
        );
        assert_eq!(dbg(&got), dbg(&want), "{what}: cross");
        let got = CrossAttention::new(ccfg, cp.weights()).map(|_| ());
        assert_eq!(dbg(&got), dbg(&want), "{what}: cross layer");

        let ecfg = EncoderConfig { attn: cfg, ff_dim: 8, activation: Activation::Relu, eps: 1e-5 };
        let mut ep = EncoderParams::new(ecfg, false, &mut g);
        ep.attn.var = p.var.clone();
        let want =
            r::encoder_block(&ecfg, &ep.weights(), xt, &Mask::None, TensorMut::new(&mut yr, l));
        assert!(want.as_ref().is_err_and(is_expected), "{what}: reference encoder gives {want:?}");
        let got =
            encoder_block(&ecfg, &ep.weights(), xt, &Mask::None, TensorMut::new(&mut y, l), SEQ);
        assert_eq!(dbg(&got), dbg(&want), "{what}: encoder");
        let got = encoder_block_in(
            &ecfg,
            &ep.weights(),
            xt,
            &Mask::None,
            TensorMut::new(&mut y, l),
            &mut [],
            SEQ,
        );
        assert_eq!(dbg(&got), dbg(&want), "{what}: encoder (workspace form)");
        let got = EncoderLayer::new(ecfg, ep.weights()).map(|_| ());
        assert_eq!(dbg(&got), dbg(&want), "{what}: encoder layer");
    }
}
