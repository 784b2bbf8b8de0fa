//! Absurd thread counts through the Rust API: every public entry point that takes a
//! [`Parallelism`] is called with `threads(usize::MAX)`, `threads(4096)`, `threads(0)` and a
//! directly built `Threads(usize::MAX)` on problems just large enough to be threaded, and each
//! call returns within a second (the counts are clamped to the machine's cores, one bounded set
//! of pools). SGEMM, softmax and flash results are bitwise those of a sequential run. The C
//! entry points get the same counts in `tests/c/boundary_test.c`.

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use attn_kernels::arch::selected;
use attn_kernels::attention::{Attention, Path};
use attn_kernels::gemm::{sgemm, sgemm_packed_b, PackedB};
use attn_kernels::layers::{
    cross_attention, encoder_block, feed_forward, linear, multi_head_attention, Activation,
    EncoderConfig, EncoderWeights, FeedForwardWeights, LayerNormWeights, MhaConfig, MhaWeights,
    Variants,
};
use attn_kernels::par::max_threads;
use attn_kernels::softmax::{
    log_softmax, logsumexp, scale_mask_softmax, scale_mask_softmax_inplace, softmax,
};
use attn_kernels::{Mask, Parallelism, Tensor4Layout};
use attn_reference::{MatMut, MatRef, TensorMut, TensorRef};

fn vals(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 97) as f32 / 97.0 - 0.5)
        .collect()
}

fn absurd() -> [Parallelism; 4] {
    [
        Parallelism::threads(usize::MAX),
        Parallelism::threads(4096),
        Parallelism::threads(0),
        Parallelism::Threads(NonZeroUsize::MAX),
    ]
}

/// Runs `f` once per absurd parallelism (after a sequential run), each under a second, and
/// returns the outputs (sequential first).
fn timed<T>(what: &str, mut f: impl FnMut(Parallelism) -> T) -> Vec<T> {
    let mut out = vec![f(Parallelism::Sequential)];
    for par in absurd() {
        assert!(par.count() <= max_threads(), "{what}: {par:?} counts {}", par.count());
        let t = Instant::now();
        out.push(f(par));
        let dt = t.elapsed();
        assert!(dt < Duration::from_secs(1), "{what} with {par:?} took {dt:?}");
    }
    out
}

fn assert_bitwise(what: &str, runs: &[Vec<f32>]) {
    for r in &runs[1..] {
        assert!(
            r.iter().zip(&runs[0]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: a threaded run differs from the sequential one"
        );
    }
}

#[test]
fn gemm_entry_points() {
    let n = 160;
    let (a, b) = (vals(n * n, 1), vals(n * n, 2));
    let (am, bm) = (MatRef::row_major(&a, n, n), MatRef::row_major(&b, n, n));
    let runs = timed("sgemm", |par| {
        let mut c = vec![0.0; n * n];
        sgemm(1.0, am, bm, 0.0, MatMut::row_major(&mut c, n, n), par).unwrap();
        c
    });
    assert_bitwise("sgemm", &runs);
    let packed = PackedB::new(bm).unwrap();
    let runs = timed("sgemm_packed_b", |par| {
        let mut c = vec![0.0; n * n];
        sgemm_packed_b(1.0, am, &packed, 0.0, MatMut::row_major(&mut c, n, n), par).unwrap();
        c
    });
    assert_bitwise("sgemm_packed_b", &runs);
    let runs = timed("linear", |par| {
        let mut c = vec![0.0; n * n];
        linear(am, bm, Some(&b[..n]), MatMut::row_major(&mut c, n, n), par).unwrap();
        c
    });
    assert_bitwise("linear", &runs);
}

#[test]
fn softmax_entry_points() {
    let dims = [1, 2, 256, 256];
    let len = 2 * 256 * 256;
    let x = vals(len, 3);
    let l = Tensor4Layout::strided(dims, [len, 256 * 256, 256, 1], 0);
    let runs = timed("scale_mask_softmax", |par| {
        let (mut y, mut lse) = (vec![0.0; len], vec![0.0; 512]);
        let (xt, yt) = (TensorRef::new(&x, l), TensorMut::new(&mut y, l));
        scale_mask_softmax(xt, 0.5, &Mask::CAUSAL, yt, Some(&mut lse), par).unwrap();
        y.extend(lse);
        y
    });
    assert_bitwise("scale_mask_softmax", &runs);
    let runs = timed("scale_mask_softmax_inplace", |par| {
        let mut y = x.clone();
        scale_mask_softmax_inplace(TensorMut::new(&mut y, l), 0.5, &Mask::None, None, par).unwrap();
        y
    });
    assert_bitwise("scale_mask_softmax_inplace", &runs);
    let xm = MatRef::row_major(&x, 512, 256);
    let runs = timed("softmax", |par| {
        let mut y = vec![0.0; len];
        softmax(xm, MatMut::row_major(&mut y, 512, 256), par).unwrap();
        y
    });
    assert_bitwise("softmax", &runs);
    let runs = timed("log_softmax", |par| {
        let mut y = vec![0.0; len];
        log_softmax(xm, MatMut::row_major(&mut y, 512, 256), par).unwrap();
        y
    });
    assert_bitwise("log_softmax", &runs);
    let runs = timed("logsumexp", |par| logsumexp(xm, par).unwrap());
    assert_bitwise("logsumexp", &runs);
}

#[test]
fn attention_entry_points() {
    let (h, n, d, nk) = (4, 96, 64, 1024);
    let q = vals(h * n * d, 4);
    let k = vals(h * nk * d, 5);
    let v = vals(h * nk * d, 6);
    let (ql, kl, ol) = (
        Tensor4Layout::bhsd(1, h, n, d),
        Tensor4Layout::bhsd(1, h, nk, d),
        Tensor4Layout::bhsd(1, h, n, d),
    );
    let (qt, kt, vt) = (TensorRef::new(&q, ql), TensorRef::new(&k, kl), TensorRef::new(&v, kl));
    let isa = selected();
    let mut all = Vec::new();
    let paths = [
        ("attention", Path::Auto),
        ("flash", Path::Flash),
        ("decode", Path::Decode),
        ("unfused", Path::Unfused),
    ];
    for (name, path) in paths {
        let runs = timed(name, |par| {
            let (mut o, mut lse) = (vec![0.0; h * n * d], vec![0.0; h * n]);
            Attention::new(qt, kt, vt)
                .scale(0.125)
                .mask(Mask::CAUSAL)
                .lse(&mut lse)
                .parallelism(par)
                .isa(isa)
                .path(path)
                .run(TensorMut::new(&mut o, ol))
                .unwrap();
            o.extend(lse);
            o
        });
        all.push((name, runs));
    }
    // Every path is deterministic across thread counts (decode's key chunks are fixed by the
    // problem, unfused's threads split rows).
    for (name, runs) in &all {
        assert_bitwise(name, runs);
    }
    for (name, runs) in &all {
        assert!(runs.iter().flatten().all(|x| x.is_finite()), "{name}: non-finite output");
    }
}

#[test]
fn layer_entry_points() {
    let (d, n, ff) = (64, 96, 128);
    let cfg = MhaConfig::new(d, 16, 16, 4);
    let (wq, wk, wv, wo) = (vals(d * d, 7), vals(d * d, 8), vals(d * d, 9), vals(d * d, 10));
    let w = MhaWeights {
        wq: MatRef::row_major(&wq, d, d),
        wk: MatRef::row_major(&wk, d, d),
        wv: MatRef::row_major(&wv, d, d),
        wo: MatRef::row_major(&wo, d, d),
        bq: None,
        bk: None,
        bv: None,
        bo: None,
        variants: Variants::NONE,
    };
    let x = vals(n * d, 11);
    let x2 = vals(n / 2 * d, 12);
    let seq = |len| Tensor4Layout::batch_seq(1, len, d);
    timed("multi_head_attention", |par| {
        let mut y = vec![0.0; n * d];
        let (xt, yt) = (TensorRef::new(&x, seq(n)), TensorMut::new(&mut y, seq(n)));
        multi_head_attention(&cfg, &w, xt, &Mask::None, yt, par).unwrap();
        y
    });
    timed("cross_attention", |par| {
        let mut y = vec![0.0; n * d];
        let (x1, yt) = (TensorRef::new(&x, seq(n)), TensorMut::new(&mut y, seq(n)));
        cross_attention(&cfg, &w, x1, TensorRef::new(&x2, seq(n / 2)), &Mask::None, yt, par)
            .unwrap();
        y
    });
    let (g, b) = (vec![1.0; d], vec![0.0; d]);
    let (w1, w2) = (vals(d * ff, 13), vals(ff * d, 14));
    let fw = FeedForwardWeights {
        w1: MatRef::row_major(&w1, d, ff),
        b1: None,
        w2: MatRef::row_major(&w2, ff, d),
        b2: None,
    };
    timed("feed_forward", |par| {
        let mut y = vec![0.0; n * d];
        let (xm, ym) = (MatRef::row_major(&x, n, d), MatMut::row_major(&mut y, n, d));
        feed_forward(xm, &fw, Activation::Relu, ym, par).unwrap();
        y
    });
    let ecfg = EncoderConfig { attn: cfg, ff_dim: ff, activation: Activation::GeluTanh, eps: 1e-5 };
    let norm = LayerNormWeights { gamma: &g, beta: &b };
    let ew = EncoderWeights { attn: w, norm1: norm, ff: fw, norm2: norm };
    timed("encoder_block", |par| {
        let mut y = vec![0.0; n * d];
        let (xt, yt) = (TensorRef::new(&x, seq(n)), TensorMut::new(&mut y, seq(n)));
        encoder_block(&ecfg, &ew, xt, &Mask::None, yt, par).unwrap();
        y
    });
}
