//! The reference's layers against hand-computed values and an independent naive f64
//! re-implementation: linear, scores, positional encodings, layer norm, feed-forward, the
//! seed's multi-head and cross-attention, the post-norm encoder block, and zero-length inputs.

use attn_reference::attention::attention;
use attn_reference::*;
use attn_tests::reference_support::{assert_rel_close, assert_within, SplitMix};

use attn_tests::numerics::U;

#[test]
fn linear_with_bias_and_pytorch_weight_layout() {
    // x [2, 3], W [3, 2]; y = xW + b in small integers: exact.
    let x = [1., 2., 3., -1., 0., 2.];
    let w = [1., 0., 0., 1., 2., -1.];
    let b = [0.5, -0.5];
    let mut y = [f32::NAN; 4];
    linear(
        MatRef::row_major(&x, 2, 3),
        MatRef::row_major(&w, 3, 2),
        Some(&b),
        MatMut::row_major(&mut y, 2, 2),
    )
    .unwrap();
    assert_eq!(y, [7.5, -1.5, 3.5, -2.5]);
    // The same weight stored as PyTorch does, [out, in], seen transposed.
    let w_t = [1., 0., 2., 0., 1., -1.];
    let mut y2 = [f32::NAN; 4];
    linear(
        MatRef::row_major(&x, 2, 3),
        MatRef::new(&w_t, MatLayout::row_major(2, 3).transposed()),
        Some(&b),
        MatMut::row_major(&mut y2, 2, 2),
    )
    .unwrap();
    assert_eq!(y, y2);
    // in = 0: y = b.
    let mut y3 = [f32::NAN; 4];
    linear(
        MatRef::row_major(&[], 2, 0),
        MatRef::row_major(&[], 0, 2),
        Some(&b),
        MatMut::row_major(&mut y3, 2, 2),
    )
    .unwrap();
    assert_eq!(y3, [0.5, -0.5, 0.5, -0.5]);
}

#[test]
fn additive_scores_match_the_formula() {
    // dq = 2, dk = 1, da = 2: s_ij = Σ_a w_a tanh((q_i·Wq)_a + (k_j·Wk)_a).
    let q = [1., 0., 0.5, -1.];
    let k = [0.25, -2., 1.];
    let wq = [0.5, -1., 1., 0.25];
    let wk = [1., 2.];
    let w = [2., -0.5];
    let mut s = [f32::NAN; 6];
    additive_scores(
        MatRef::row_major(&q, 2, 2),
        MatRef::row_major(&k, 3, 1),
        &AdditiveWeights {
            wq: MatRef::row_major(&wq, 2, 2),
            wk: MatRef::row_major(&wk, 1, 2),
            w: &w,
        },
        MatMut::row_major(&mut s, 2, 3),
    )
    .unwrap();
    let mut want = Vec::new();
    for i in 0..2 {
        for &kj in &k {
            let mut acc = 0.0f64;
            for a in 0..2 {
                let pq = q[i * 2] as f64 * wq[a] as f64 + q[i * 2 + 1] as f64 * wq[2 + a] as f64;
                let pk = kj as f64 * wk[a] as f64;
                acc += w[a] as f64 * (pq + pk).tanh();
            }
            want.push(acc);
        }
    }
    assert_rel_close(&s, &want, U, "additive scores");
    // Spot value: i = 0, j = 0: 2·tanh(0.5 + 0.25) − 0.5·tanh(−1 + 0.5).
    assert_rel_close(&s[..1], &[2.0 * 0.75f64.tanh() - 0.5 * (-0.5f64).tanh()], U, "s00");
}

#[test]
fn sinusoidal_encoding_values() {
    let mut pe = [f32::NAN; 3 * 4];
    sinusoidal_table(0, MatMut::row_major(&mut pe, 3, 4)).unwrap();
    // Position 0: sin 0 = 0, cos 0 = 1, exactly.
    assert_eq!(&pe[..4], &[0.0, 1.0, 0.0, 1.0]);
    // Position 1, d = 4: sin 1, cos 1, sin(1/100), cos(1/100).
    let want = [0.8414709848078965, 0.5403023058681398, 0.009999833334166664, 0.9999500004166653];
    assert_rel_close(&pe[4..8], &want, U, "PE(1, ·)");
    // Position 2: sin 2, cos 2, sin(0.02), cos(0.02).
    let want2 = [0.9092974268256817, -0.4161468365471424, 0.01999866669333308, 0.9998000066665778];
    assert_rel_close(&pe[8..], &want2, U, "PE(2, ·)");
    // A table starting at position 1 is the same rows shifted; odd width ends in a sine.
    let mut pe1 = [f32::NAN; 2 * 4];
    sinusoidal_table(1, MatMut::row_major(&mut pe1, 2, 4)).unwrap();
    assert_eq!(&pe1[..], &pe[4..]);
    let mut odd = [f32::NAN; 3];
    sinusoidal_table(1, MatMut::row_major(&mut odd, 1, 3)).unwrap();
    let f = 10000f64.powf(2.0 / 3.0);
    assert_rel_close(&odd, &[1f64.sin(), 1f64.cos(), (1.0 / f).sin()], U, "odd width");
}

#[test]
fn positional_encodings_are_added() {
    let (batch, n, d) = (2, 3, 4);
    let x: Vec<f32> = (0..batch * n * d).map(|i| i as f32 * 0.25).collect();
    let seq = Tensor4Layout::batch_seq(batch, n, d);
    // Learned: a dyadic table, so the sums are exact.
    let table: Vec<f32> = (0..5 * d).map(|i| i as f32 * 0.5 - 3.0).collect();
    let mut y = vec![f32::NAN; x.len()];
    let pe = PositionalEncoding::Learned { table: MatRef::row_major(&table, 5, d), start: 2 };
    add_positional_encoding(TensorRef::new(&x, seq), &pe, TensorMut::new(&mut y, seq)).unwrap();
    for b in 0..batch {
        for s in 0..n {
            for j in 0..d {
                let i = (b * n + s) * d + j;
                assert_eq!(y[i], x[i] + table[(2 + s) * d + j]);
            }
        }
    }
    // Sinusoidal equals adding the table row by row.
    let mut pe_rows = vec![0.0; n * d];
    sinusoidal_table(7, MatMut::row_major(&mut pe_rows, n, d)).unwrap();
    let pe = PositionalEncoding::Sinusoidal { start: 7 };
    add_positional_encoding(TensorRef::new(&x, seq), &pe, TensorMut::new(&mut y, seq)).unwrap();
    for (i, &got) in y.iter().enumerate() {
        // One rounding of x + PE(f64) vs x + round(PE): within 1.5 ulp of the sum.
        let want = x[i] + pe_rows[i % (n * d)];
        assert!((got - want).abs() <= 1.5 * f32::EPSILON * want.abs().max(1.0), "{got} {want}");
    }
}

#[test]
fn layer_norm_values_and_properties() {
    let x = [1., 2., 3., 4., 10., 10., 10., 14.];
    let gamma = [1., 2., 1., 1.];
    let beta = [0., 0., 0., 1.];
    let mut y = [f32::NAN; 8];
    layer_norm(
        MatRef::row_major(&x, 2, 4),
        &LayerNormWeights { gamma: &gamma, beta: &beta },
        0.0,
        MatMut::row_major(&mut y, 2, 4),
    )
    .unwrap();
    // Row 0: mean 2.5, var 1.25. Row 1: mean 11, var 3, so (x − 11)/√3.
    let r5 = 1.25f64.sqrt();
    let r3 = 3f64.sqrt();
    let want = [
        -1.5 / r5,
        2.0 * -0.5 / r5,
        0.5 / r5,
        1.5 / r5 + 1.0,
        -1. / r3,
        -2. / r3,
        -1. / r3,
        3. / r3 + 1.0,
    ];
    assert_rel_close(&y, &want, U, "layer norm");
    // x = [1, 3], eps = 0: exactly ±1.
    let mut y2 = [f32::NAN; 2];
    layer_norm(
        MatRef::row_major(&[1., 3.], 1, 2),
        &LayerNormWeights { gamma: &[1., 1.], beta: &[0., 0.] },
        0.0,
        MatMut::row_major(&mut y2, 1, 2),
    )
    .unwrap();
    assert_eq!(y2, [-1.0, 1.0]);
    // eps enters under the root: var 1 + eps 3 → ±1/2.
    layer_norm(
        MatRef::row_major(&[1., 3.], 1, 2),
        &LayerNormWeights { gamma: &[1., 1.], beta: &[0., 0.] },
        3.0,
        MatMut::row_major(&mut y2, 1, 2),
    )
    .unwrap();
    assert_eq!(y2, [-0.5, 0.5]);
}

#[test]
fn feed_forward_activations() {
    let gelu = |x: f64| {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
    };
    assert!(
        (attn_reference::activate(Activation::GeluTanh, 1.0) - 0.8411919906082768).abs() < 1e-15
    );
    // The reference evaluates x / (1 + e^(−2y)), the same function as the tanh form, which
    // rounds `1 + tanh` to f64 and so is off by up to about |x|·2⁻⁵³: the two agree to that.
    for i in -300..=300 {
        let x = f64::from(i) / 100.0;
        let (r, t) = (attn_reference::activate(Activation::GeluTanh, x), gelu(x));
        assert!((r - t).abs() <= 4.0 * f64::EPSILON * x.abs(), "gelu({x}): {r} vs {t}");
    }
    assert!(attn_reference::activate(Activation::Relu, f64::NAN).is_nan());
    assert!(attn_reference::activate(Activation::GeluTanh, f64::NAN).is_nan());
    assert_eq!(Activation::default(), Activation::Relu);
    // x [1, 2] · I₂ + b1 → [1, −2] → act → · [[2], [3]] + 0.5.
    let w1 = [1., 0., 0., 1.];
    let w2 = [2., 3.];
    let w = FeedForwardWeights {
        w1: MatRef::row_major(&w1, 2, 2),
        b1: Some(&[0., -2.]),
        w2: MatRef::row_major(&w2, 2, 1),
        b2: Some(&[0.5]),
    };
    let mut y = [f32::NAN];
    feed_forward(
        MatRef::row_major(&[1., 0.], 1, 2),
        &w,
        Activation::Relu,
        MatMut::row_major(&mut y, 1, 1),
    )
    .unwrap();
    assert_eq!(y, [2.5]);
    feed_forward(
        MatRef::row_major(&[1., 0.], 1, 2),
        &w,
        Activation::GeluTanh,
        MatMut::row_major(&mut y, 1, 1),
    )
    .unwrap();
    // Hidden activations are rounded to f32 before the second layer.
    let h = [gelu(1.0) as f32 as f64, gelu(-2.0) as f32 as f64];
    assert_rel_close(&y, &[2.0 * h[0] + 3.0 * h[1] + 0.5], U, "gelu ffn");
}

/// Random weights for a multi-head attention layer, owned.
struct Owned {
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    bq: Vec<f32>,
    bk: Vec<f32>,
    bv: Vec<f32>,
    bo: Vec<f32>,
}

impl Owned {
    fn random(cfg: &MhaConfig, rng: &mut SplitMix) -> Self {
        Self {
            wq: rng.vec(cfg.in_dim * cfg.q_width()),
            wk: rng.vec(cfg.kv_in_dim * cfg.k_width()),
            wv: rng.vec(cfg.kv_in_dim * cfg.v_width()),
            wo: rng.vec(cfg.o_width() * cfg.in_dim),
            bq: rng.vec(cfg.q_width()),
            bk: rng.vec(cfg.k_width()),
            bv: rng.vec(cfg.v_width()),
            bo: rng.vec(cfg.in_dim),
        }
    }
    fn view(&self, cfg: &MhaConfig) -> MhaWeights<'_> {
        MhaWeights {
            wq: MatRef::row_major(&self.wq, cfg.in_dim, cfg.q_width()),
            wk: MatRef::row_major(&self.wk, cfg.kv_in_dim, cfg.k_width()),
            wv: MatRef::row_major(&self.wv, cfg.kv_in_dim, cfg.v_width()),
            wo: MatRef::row_major(&self.wo, cfg.o_width(), cfg.in_dim),
            bq: Some(&self.bq),
            bk: Some(&self.bk),
            bv: Some(&self.bv),
            bo: Some(&self.bo),
            variants: Variants::NONE,
        }
    }
}

/// The seed's forward pass written out in plain f64 loops, independent of the reference's
/// building blocks, with the bound on the reference's deviation from it: the reference rounds
/// Q, K, V, the head outputs and y to f32 (each u relative). A logit moves by at most
/// δ = 2u·scale·max Σ_d |q||k|, a softmax weight by a relative ≤ 2δ (+ rounding), so a head
/// output by ≤ (2δ + 2u)·max|v|, and y_c by that times Σ_r |Wo_rc| plus its own rounding.
/// Returns (y, tolerance per element).
fn naive_cross(
    cfg: &MhaConfig,
    w: &Owned,
    x1: &[f32],
    x2: &[f32],
    n1: usize,
    n2: usize,
    keep: impl Fn(usize, usize, usize) -> bool,
) -> (Vec<f32>, Vec<f64>) {
    let proj = |x: &[f32], n: usize, din: usize, wm: &[f32], b: &[f32], dout: usize| {
        let mut out = vec![0.0f64; n * dout];
        for i in 0..n {
            for c in 0..dout {
                let mut acc = b[c] as f64;
                for p in 0..din {
                    acc += x[i * din + p] as f64 * wm[p * dout + c] as f64;
                }
                out[i * dout + c] = acc;
            }
        }
        out
    };
    let (h, g_size, dk, dv) = (cfg.num_heads, cfg.num_heads / cfg.kv_heads, cfg.k_dim, cfg.v_dim);
    let q = proj(x1, n1, cfg.in_dim, &w.wq, &w.bq, cfg.q_width());
    let k = proj(x2, n2, cfg.kv_in_dim, &w.wk, &w.bk, cfg.k_width());
    let v = proj(x2, n2, cfg.kv_in_dim, &w.wv, &w.bv, cfg.v_width());
    let scale = 1.0 / (dk as f64).sqrt();
    let ow = cfg.o_width();
    let mut o = vec![0.0f64; n1 * ow];
    let mut delta = 0.0f64;
    for hh in 0..h {
        let g = hh / g_size;
        for i in 0..n1 {
            let mut s: Vec<Option<f64>> = vec![None; n2];
            for (j, sj) in s.iter_mut().enumerate() {
                if keep(hh, i, j) {
                    let (mut dot, mut mag) = (0.0, 0.0);
                    for d in 0..dk {
                        let (a, b) =
                            (q[i * cfg.q_width() + hh * dk + d], k[j * cfg.k_width() + g * dk + d]);
                        dot += a * b;
                        mag += (a * b).abs();
                    }
                    delta = delta.max(2.0 * U * scale * mag);
                    *sj = Some(dot * scale);
                }
            }
            let m = s.iter().flatten().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            let z: f64 = s.iter().flatten().map(|&x| (x - m).exp()).sum();
            for (j, sj) in s.iter().enumerate() {
                if let Some(x) = sj {
                    let p = (x - m).exp() / z;
                    for e in 0..dv {
                        o[i * ow + hh * dv + e] += p * v[j * cfg.v_width() + g * dv + e];
                    }
                }
            }
        }
    }
    let vmax = v.iter().fold(0.0f64, |a, b| a.max(b.abs()));
    let mut y = vec![0.0f32; n1 * cfg.in_dim];
    let mut tol = vec![0.0f64; n1 * cfg.in_dim];
    for i in 0..n1 {
        for c in 0..cfg.in_dim {
            let mut acc = w.bo[c] as f64;
            let mut wsum = 0.0;
            for r in 0..ow {
                acc += o[i * ow + r] * w.wo[r * cfg.in_dim + c] as f64;
                wsum += (w.wo[r * cfg.in_dim + c] as f64).abs();
            }
            y[i * cfg.in_dim + c] = acc as f32;
            // Factor 2 of slack over the first-order bound.
            tol[i * cfg.in_dim + c] =
                2.0 * ((2.0 * delta + 2.0 * U) * vmax * wsum + 2.0 * U * acc.abs());
        }
    }
    (y, tol)
}

#[test]
fn multi_head_attention_matches_naive_f64() {
    let mut rng = SplitMix::new(7);
    for (cfg, batch, n) in [
        (MhaConfig::new(8, 4, 4, 2), 2, 5),
        (MhaConfig::new(6, 3, 5, 4), 1, 7), // k_dim ≠ v_dim
        (MhaConfig::new(8, 2, 3, 4).with_kv_heads(2), 2, 4), // GQA
        (MhaConfig::new(5, 4, 2, 3).with_kv_heads(1), 1, 6), // MQA
        (MhaConfig::new(4, 3, 3, 1), 1, 1),
    ] {
        let w = Owned::random(&cfg, &mut rng);
        let x = rng.vec(batch * n * cfg.in_dim);
        let seq = Tensor4Layout::batch_seq(batch, n, cfg.in_dim);
        for causal in [false, true] {
            let mask = if causal { Mask::CAUSAL } else { Mask::None };
            let mut y = vec![f32::NAN; x.len()];
            multi_head_attention(
                &cfg,
                &w.view(&cfg),
                TensorRef::new(&x, seq),
                &mask,
                TensorMut::new(&mut y, seq),
            )
            .unwrap();
            for b in 0..batch {
                let xb = &x[b * n * cfg.in_dim..(b + 1) * n * cfg.in_dim];
                let (want, tol) = naive_cross(&cfg, &w, xb, xb, n, n, |_, i, j| !causal || j <= i);
                assert_within(
                    &y[b * n * cfg.in_dim..(b + 1) * n * cfg.in_dim],
                    &want,
                    &tol,
                    &format!("{cfg:?} b{b} causal {causal}"),
                );
            }
        }
    }
}

#[test]
fn cross_attention_matches_naive_f64() {
    let mut rng = SplitMix::new(11);
    // Two sequences of different lengths and widths; GQA in one case; a key-padding mask.
    for (cfg, n1, n2) in [
        (MhaConfig::cross(6, 10, 4, 3, 2), 3, 7),
        (MhaConfig::cross(4, 3, 2, 5, 4).with_kv_heads(2), 5, 2),
    ] {
        let batch = 2;
        let w = Owned::random(&cfg, &mut rng);
        let x1 = rng.vec(batch * n1 * cfg.in_dim);
        let x2 = rng.vec(batch * n2 * cfg.kv_in_dim);
        let keep: Vec<bool> = (0..batch * n2).map(|i| i % n2 != 1).collect();
        let mask = Mask::key_padding(&keep, batch, cfg.num_heads, n1, n2);
        let l1 = Tensor4Layout::batch_seq(batch, n1, cfg.in_dim);
        let l2 = Tensor4Layout::batch_seq(batch, n2, cfg.kv_in_dim);
        let mut y = vec![f32::NAN; x1.len()];
        cross_attention(
            &cfg,
            &w.view(&cfg),
            TensorRef::new(&x1, l1),
            TensorRef::new(&x2, l2),
            &mask,
            TensorMut::new(&mut y, l1),
        )
        .unwrap();
        for b in 0..batch {
            let (want, tol) = naive_cross(
                &cfg,
                &w,
                &x1[b * n1 * cfg.in_dim..(b + 1) * n1 * cfg.in_dim],
                &x2[b * n2 * cfg.kv_in_dim..(b + 1) * n2 * cfg.kv_in_dim],
                n1,
                n2,
                |_, _, j| keep[b * n2 + j],
            );
            assert_within(
                &y[b * n1 * cfg.in_dim..(b + 1) * n1 * cfg.in_dim],
                &want,
                &tol,
                &format!("{cfg:?} b{b}"),
            );
        }
    }
}

/// The seed's loop over heads: per head, project with the head's column block of the weights
/// (a strided sub-view, no copy), attend, and write the head's block of the concatenation;
/// then the output projection. Bitwise equal to the fused-heads call.
#[test]
fn multi_head_attention_equals_loop_of_single_heads() {
    let mut rng = SplitMix::new(3);
    let cfg = MhaConfig::new(8, 3, 2, 4).with_kv_heads(2);
    let (batch, n) = (1, 6);
    let w = Owned::random(&cfg, &mut rng);
    let x = rng.vec(batch * n * cfg.in_dim);
    let seq = Tensor4Layout::batch_seq(batch, n, cfg.in_dim);
    let mut y = vec![f32::NAN; x.len()];
    multi_head_attention(
        &cfg,
        &w.view(&cfg),
        TensorRef::new(&x, seq),
        &Mask::CAUSAL,
        TensorMut::new(&mut y, seq),
    )
    .unwrap();

    let xm = MatRef::row_major(&x, n, cfg.in_dim);
    let (dk, dv) = (cfg.k_dim, cfg.v_dim);
    let mut concat = vec![f32::NAN; n * cfg.o_width()];
    for h in 0..cfg.num_heads {
        let g = h / (cfg.num_heads / cfg.kv_heads);
        let mut q = vec![0.0; n * dk];
        let mut k = vec![0.0; n * dk];
        let mut v = vec![0.0; n * dv];
        linear(
            xm,
            MatRef::new(&w.wq, MatLayout::strided(cfg.in_dim, dk, cfg.q_width(), 1, h * dk)),
            Some(&w.bq[h * dk..(h + 1) * dk]),
            MatMut::row_major(&mut q, n, dk),
        )
        .unwrap();
        linear(
            xm,
            MatRef::new(&w.wk, MatLayout::strided(cfg.in_dim, dk, cfg.k_width(), 1, g * dk)),
            Some(&w.bk[g * dk..(g + 1) * dk]),
            MatMut::row_major(&mut k, n, dk),
        )
        .unwrap();
        linear(
            xm,
            MatRef::new(&w.wv, MatLayout::strided(cfg.in_dim, dv, cfg.v_width(), 1, g * dv)),
            Some(&w.bv[g * dv..(g + 1) * dv]),
            MatMut::row_major(&mut v, n, dv),
        )
        .unwrap();
        attention(
            TensorRef::new(&q, Tensor4Layout::bhsd(1, 1, n, dk)),
            TensorRef::new(&k, Tensor4Layout::bhsd(1, 1, n, dk)),
            TensorRef::new(&v, Tensor4Layout::bhsd(1, 1, n, dv)),
            cfg.scale(),
            &Mask::CAUSAL,
            // Head h's block of the [n, heads·dv] concatenation.
            TensorMut::new(
                &mut concat,
                Tensor4Layout::strided([1, 1, n, dv], [0, 0, cfg.o_width(), 1], h * dv),
            ),
            None,
        )
        .unwrap();
    }
    let mut want = vec![f32::NAN; n * cfg.in_dim];
    linear(
        MatRef::row_major(&concat, n, cfg.o_width()),
        MatRef::row_major(&w.wo, cfg.o_width(), cfg.in_dim),
        Some(&w.bo),
        MatMut::row_major(&mut want, n, cfg.in_dim),
    )
    .unwrap();
    assert_eq!(y, want);
}

#[test]
fn encoder_block_is_post_norm() {
    let mut rng = SplitMix::new(5);
    for activation in [Activation::Relu, Activation::GeluTanh] {
        let cfg =
            EncoderConfig { attn: MhaConfig::new(8, 4, 4, 2), ff_dim: 12, activation, eps: 1e-5 };
        let (batch, n, d, ff) = (2, 5, 8, 12);
        let aw = Owned::random(&cfg.attn, &mut rng);
        let (w1, b1, w2, b2) = (rng.vec(d * ff), rng.vec(ff), rng.vec(ff * d), rng.vec(d));
        let (g1, be1, g2, be2) = (rng.vec(d), rng.vec(d), rng.vec(d), rng.vec(d));
        let ffw = FeedForwardWeights {
            w1: MatRef::row_major(&w1, d, ff),
            b1: Some(&b1),
            w2: MatRef::row_major(&w2, ff, d),
            b2: Some(&b2),
        };
        let w = EncoderWeights {
            attn: aw.view(&cfg.attn),
            norm1: LayerNormWeights { gamma: &g1, beta: &be1 },
            ff: ffw,
            norm2: LayerNormWeights { gamma: &g2, beta: &be2 },
        };
        let x = rng.vec(batch * n * d);
        let seq = Tensor4Layout::batch_seq(batch, n, d);
        let mut y = vec![f32::NAN; x.len()];
        encoder_block(&cfg, &w, TensorRef::new(&x, seq), &Mask::None, TensorMut::new(&mut y, seq))
            .unwrap();

        // Post-norm, spelled out: H = LN1(X + MHA(X)); Y = LN2(H + FFN(H)), f32 between stages.
        let mut a = vec![0.0; x.len()];
        multi_head_attention(
            &cfg.attn,
            &w.attn,
            TensorRef::new(&x, seq),
            &Mask::None,
            TensorMut::new(&mut a, seq),
        )
        .unwrap();
        let r1: Vec<f32> = x.iter().zip(&a).map(|(p, q)| p + q).collect();
        let mut h = vec![0.0; x.len()];
        layer_norm(
            MatRef::row_major(&r1, batch * n, d),
            &w.norm1,
            cfg.eps,
            MatMut::row_major(&mut h, batch * n, d),
        )
        .unwrap();
        let mut f = vec![0.0; x.len()];
        feed_forward(
            MatRef::row_major(&h, batch * n, d),
            &ffw,
            activation,
            MatMut::row_major(&mut f, batch * n, d),
        )
        .unwrap();
        let r2: Vec<f32> = h.iter().zip(&f).map(|(p, q)| p + q).collect();
        let mut want = vec![0.0; x.len()];
        layer_norm(
            MatRef::row_major(&r2, batch * n, d),
            &w.norm2,
            cfg.eps,
            MatMut::row_major(&mut want, batch * n, d),
        )
        .unwrap();
        assert_eq!(y, want, "{activation:?}");

        // With γ = 1, β = 0 every output row is normalised: mean 0, variance 1/(1 + eps/σ²).
        let ones = vec![1.0; d];
        let zeros = vec![0.0; d];
        let w_unit = EncoderWeights { norm2: LayerNormWeights { gamma: &ones, beta: &zeros }, ..w };
        encoder_block(
            &cfg,
            &w_unit,
            TensorRef::new(&x, seq),
            &Mask::None,
            TensorMut::new(&mut y, seq),
        )
        .unwrap();
        for row in y.chunks(d) {
            let mean: f64 = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var: f64 = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            // Each y is one rounding (u relative, |y| ≤ √d): |mean| ≤ u·√d; the variance
            // 1/(1 + eps/σ²) ≥ 1 − eps/σ², with σ² ≥ 1e-2 for these random rows.
            assert!(mean.abs() <= U * (d as f64).sqrt(), "mean {mean}");
            assert!((var - 1.0).abs() <= 1e-3 + 4.0 * U * d as f64, "var {var}");
        }
    }
}

#[test]
fn zero_length_sequences_give_empty_outputs() {
    let cfg = MhaConfig::cross(4, 3, 2, 2, 2);
    let w = Owned::random(&cfg, &mut SplitMix::new(1));
    let x2 = vec![0.5; 3 * 3];
    // n1 = 0: empty output, Ok.
    let l1 = Tensor4Layout::batch_seq(1, 0, 4);
    let l2 = Tensor4Layout::batch_seq(1, 3, 3);
    let mut y: Vec<f32> = vec![];
    cross_attention(
        &cfg,
        &w.view(&cfg),
        TensorRef::new(&[], l1),
        TensorRef::new(&x2, l2),
        &Mask::None,
        TensorMut::new(&mut y, l1),
    )
    .unwrap();
    // n2 = 0: no keys, every attention row is zero, so y = bo.
    let x1 = vec![0.25; 2 * 4];
    let l1 = Tensor4Layout::batch_seq(1, 2, 4);
    let mut y = vec![f32::NAN; 8];
    cross_attention(
        &cfg,
        &w.view(&cfg),
        TensorRef::new(&x1, l1),
        TensorRef::new(&[], Tensor4Layout::batch_seq(1, 0, 3)),
        &Mask::None,
        TensorMut::new(&mut y, l1),
    )
    .unwrap();
    assert_eq!(&y[..4], &w.bo[..]);
    assert_eq!(&y[4..], &w.bo[..]);
    // Self-attention, encoder and positional encoding with n = 0 or batch = 0.
    let sc = MhaConfig::new(4, 2, 2, 2);
    let sw = Owned::random(&sc, &mut SplitMix::new(2));
    for (batch, n) in [(0, 3), (2, 0)] {
        let l = Tensor4Layout::batch_seq(batch, n, 4);
        multi_head_attention(
            &sc,
            &sw.view(&sc),
            TensorRef::new(&[], l),
            &Mask::CAUSAL,
            TensorMut::new(&mut [], l),
        )
        .unwrap();
        add_positional_encoding(
            TensorRef::new(&[], l),
            &PositionalEncoding::Sinusoidal { start: 0 },
            TensorMut::new(&mut [], l),
        )
        .unwrap();
    }
    // Attention with nq = 0 and with nk = 0 (zeros, lse −∞).
    let q = [1.0; 4];
    let mut o = [f32::NAN; 4];
    let mut lse = [f32::NAN; 2];
    attention(
        TensorRef::new(&q, Tensor4Layout::bhsd(1, 1, 2, 2)),
        TensorRef::new(&[], Tensor4Layout::bhsd(1, 1, 0, 2)),
        TensorRef::new(&[], Tensor4Layout::bhsd(1, 1, 0, 2)),
        1.0,
        &Mask::None,
        TensorMut::new(&mut o, Tensor4Layout::bhsd(1, 1, 2, 2)),
        Some(&mut lse),
    )
    .unwrap();
    assert_eq!(o, [0.0; 4]);
    assert_eq!(lse, [f32::NEG_INFINITY; 2]);
}
