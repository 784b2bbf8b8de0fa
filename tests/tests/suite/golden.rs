//! The design's golden example (the seed "8 steps" article) through every reference stage, and
//! the seed's (1, 5, 64) shape example through multi-head attention.
//!
//! Projections and scores are small-integer arithmetic, so they must be exact; softmax and
//! outputs are checked to 1e-6 relative against the values in the design (computed in high
//! precision; f32 rounding alone is 6e-8 relative).

use attn_reference::attention::attention;
use attn_reference::softmax::softmax;
use attn_reference::*;
use attn_tests::reference_support::golden::*;
use attn_tests::reference_support::{assert_rel_close, SplitMix};

const REL: f64 = 1e-6;

fn project(w: &[f32]) -> Vec<f32> {
    let mut y = vec![f32::NAN; 9];
    linear(
        MatRef::row_major(&X, 3, 4),
        MatRef::row_major(w, 4, 3),
        None,
        MatMut::row_major(&mut y, 3, 3),
    )
    .unwrap();
    y
}

fn one_head(m: &[f32]) -> TensorRef<'_> {
    TensorRef::new(m, Tensor4Layout::bhsd(1, 1, 3, 3))
}

#[test]
fn projections_are_exact() {
    assert_eq!(project(&W_KEY), KEYS);
    assert_eq!(project(&W_QUERY), QUERIES);
    assert_eq!(project(&W_VALUE), VALUES);
}

#[test]
fn scores_are_exact() {
    let mut s = vec![f32::NAN; 9];
    dot_product_scores(
        MatRef::row_major(&QUERIES, 3, 3),
        MatRef::row_major(&KEYS, 3, 3),
        MatMut::row_major(&mut s, 3, 3),
    )
    .unwrap();
    assert_eq!(s, SCORES);
    // Scale 1 is exactly the dot product.
    scaled_dot_product_scores(
        MatRef::row_major(&QUERIES, 3, 3),
        MatRef::row_major(&KEYS, 3, 3),
        1.0,
        MatMut::row_major(&mut s, 3, 3),
    )
    .unwrap();
    assert_eq!(s, SCORES);
    // Scale 1/√3: one rounding of the exact score·scale.
    let scale = attention::default_scale(3);
    scaled_dot_product_scores(
        MatRef::row_major(&QUERIES, 3, 3),
        MatRef::row_major(&KEYS, 3, 3),
        scale,
        MatMut::row_major(&mut s, 3, 3),
    )
    .unwrap();
    let want: Vec<f32> = SCORES.iter().map(|&v| (f64::from(v) * f64::from(scale)) as f32).collect();
    assert_eq!(s, want);
}

#[test]
fn softmax_matches_the_design() {
    let mut p = vec![f32::NAN; 9];
    softmax(MatRef::row_major(&SCORES, 3, 3), MatMut::row_major(&mut p, 3, 3)).unwrap();
    assert_rel_close(&p, &SOFTMAX, REL, "softmax");
}

#[test]
fn output_scale_1_matches_the_design() {
    let mut o = vec![f32::NAN; 9];
    let o_layout = Tensor4Layout::bhsd(1, 1, 3, 3);
    attention(
        one_head(&QUERIES),
        one_head(&KEYS),
        one_head(&VALUES),
        1.0,
        &Mask::None,
        TensorMut::new(&mut o, o_layout),
        None,
    )
    .unwrap();
    assert_rel_close(&o, &OUTPUT_SCALE_1, REL, "output, scale 1");

    // Steps 6–7 of the article: weights (softmax) times values, summed.
    let weights: Vec<f32> = SOFTMAX.iter().map(|&v| v as f32).collect();
    let stepwise = matmul::matmul_rm(&weights, &VALUES, 3, 3, 3).unwrap();
    assert_rel_close(&stepwise, &OUTPUT_SCALE_1, REL, "softmax · values");
}

#[test]
fn output_scale_rsqrt3_matches_the_design() {
    let mut o = vec![f32::NAN; 9];
    attention(
        one_head(&QUERIES),
        one_head(&KEYS),
        one_head(&VALUES),
        attention::default_scale(3),
        &Mask::None,
        TensorMut::new(&mut o, Tensor4Layout::bhsd(1, 1, 3, 3)),
        None,
    )
    .unwrap();
    assert_rel_close(&o, &OUTPUT_SCALE_RSQRT3, REL, "output, scale 1/√3");
}

/// The whole golden example as one seed `MultiHeadAttention(4, 3, 3, 1)` whose output
/// projection `[I₃ | 0]` just copies the head into the first three columns: the seed scales by
/// 1/√k_dim, so this is the 1/√3 output, and the fourth column is exactly 0.
#[test]
fn golden_through_multi_head_attention() {
    let cfg = MhaConfig::new(4, 3, 3, 1);
    let wo: Vec<f32> = (0..12).map(|i| if i % 4 == i / 4 { 1.0 } else { 0.0 }).collect();
    let w = MhaWeights {
        wq: MatRef::row_major(&W_QUERY, 4, 3),
        wk: MatRef::row_major(&W_KEY, 4, 3),
        wv: MatRef::row_major(&W_VALUE, 4, 3),
        wo: MatRef::row_major(&wo, 3, 4),
        bq: None,
        bk: None,
        bv: None,
        bo: None,
        variants: Variants::NONE,
    };
    let seq = Tensor4Layout::batch_seq(1, 3, 4);
    let mut y = vec![f32::NAN; 12];
    multi_head_attention(
        &cfg,
        &w,
        TensorRef::new(&X, seq),
        &Mask::None,
        TensorMut::new(&mut y, seq),
    )
    .unwrap();
    for r in 0..3 {
        assert_rel_close(&y[r * 4..r * 4 + 3], &OUTPUT_SCALE_RSQRT3[r * 3..r * 3 + 3], REL, "mha");
        assert_eq!(y[r * 4 + 3], 0.0);
    }
}

/// The seed's second example: x of shape (1, 5, 64) through 64 → 64 linear layers with bias
/// and scaled dot-product attention gives (1, 5, 64). Through `MultiHeadAttention(64, 64, 64,
/// 1)` with an identity output projection (exact in f64) it must equal the explicit chain
/// bit for bit; with two heads and a real output projection the shape is the same.
#[test]
fn shape_example_1_5_64() {
    let (n, d) = (5, 64);
    let mut rng = SplitMix::new(64);
    let x = rng.vec(n * d);
    let (wq, wk, wv) = (rng.vec(d * d), rng.vec(d * d), rng.vec(d * d));
    let (bq, bk, bv) = (rng.vec(d), rng.vec(d), rng.vec(d));
    let proj = |w: &[f32], b: &[f32]| {
        let mut y = vec![0.0; n * d];
        linear(
            MatRef::row_major(&x, n, d),
            MatRef::row_major(w, d, d),
            Some(b),
            MatMut::row_major(&mut y, n, d),
        )
        .unwrap();
        y
    };
    let (q, k, v) = (proj(&wq, &bq), proj(&wk, &bk), proj(&wv, &bv));
    let seq = Tensor4Layout::batch_seq(1, n, d);
    let mut chain = vec![0.0; n * d];
    attention(
        TensorRef::new(&q, Tensor4Layout::bhsd(1, 1, n, d)),
        TensorRef::new(&k, Tensor4Layout::bhsd(1, 1, n, d)),
        TensorRef::new(&v, Tensor4Layout::bhsd(1, 1, n, d)),
        attention::default_scale(d),
        &Mask::None,
        TensorMut::new(&mut chain, Tensor4Layout::bhsd(1, 1, n, d)),
        None,
    )
    .unwrap();

    let eye: Vec<f32> = (0..d * d).map(|i| if i % d == i / d { 1.0 } else { 0.0 }).collect();
    let mut w = MhaWeights {
        wq: MatRef::row_major(&wq, d, d),
        wk: MatRef::row_major(&wk, d, d),
        wv: MatRef::row_major(&wv, d, d),
        wo: MatRef::row_major(&eye, d, d),
        bq: Some(&bq),
        bk: Some(&bk),
        bv: Some(&bv),
        bo: None,
        variants: Variants::NONE,
    };
    let mut y = vec![f32::NAN; n * d];
    let cfg = MhaConfig::new(d, d, d, 1);
    multi_head_attention(
        &cfg,
        &w,
        TensorRef::new(&x, seq),
        &Mask::None,
        TensorMut::new(&mut y, seq),
    )
    .unwrap();
    assert_eq!(seq.dims, [1, 1, 5, 64]);
    assert_eq!(y, chain);

    let wo = rng.vec(d * d);
    let bo = rng.vec(d);
    w.wo = MatRef::row_major(&wo, d, d);
    w.bo = Some(&bo);
    let cfg2 = MhaConfig::from_embed_dim(d, 2).unwrap();
    assert_eq!((cfg2.k_dim, cfg2.v_dim), (32, 32));
    let mut y2 = vec![f32::NAN; n * d];
    multi_head_attention(
        &cfg2,
        &w,
        TensorRef::new(&x, seq),
        &Mask::None,
        TensorMut::new(&mut y2, seq),
    )
    .unwrap();
    assert!(y2.iter().all(|v| v.is_finite()), "(1, 5, 64) output must be finite");
}
