//! Encoder-layer forward (batch 1; N = 512, d = 512, 8 heads; N = 2048, d = 1024, 16 heads;
//! feed-forward width 4d, ReLU, no mask), sequential and 2 threads: criterion groups for the
//! whole layer (fused and separate QKV weights), then a table of the layer beside the sum of
//! its parts (each part timed alone on the same buffers: QKV projection as one GEMM and as
//! three, attention kernel, output projection, feed-forward GEMMs, residuals + norms).
//!
//! `cargo bench -p attn-bench --bench layers -- --warm-up-time 1 --measurement-time 2`
//! (`ATTN_BENCH_QUICK=1` skips the N = 2048 shape).

use std::hint::black_box;
use std::time::{Duration, Instant};

use attn_kernels::gemm::sgemm;
use attn_kernels::layers::{self, EncoderConfig, EncoderLayer, MhaConfig};
use attn_kernels::Parallelism;
use attn_reference::{
    Activation, EncoderWeights, FeedForwardWeights, LayerNormWeights, Mask, MatLayout, MatMut,
    MatRef, MhaWeights, Tensor4Layout, TensorMut, TensorRef,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// One benchmarked shape.
#[derive(Clone, Copy)]
struct Shape {
    n: usize,
    d: usize,
    heads: usize,
}

impl Shape {
    fn ff(&self) -> usize {
        4 * self.d
    }
    fn name(&self) -> String {
        format!("N{}_d{}_h{}", self.n, self.d, self.heads)
    }
    fn cfg(&self) -> EncoderConfig {
        EncoderConfig {
            attn: MhaConfig::from_embed_dim(self.d, self.heads).unwrap(),
            ff_dim: self.ff(),
            activation: Activation::Relu,
            eps: 1e-5,
        }
    }
    /// FLOPs of the parts (2 per multiply-add; attention 4·n²·d over all heads).
    fn flops(&self) -> [(&'static str, f64); 5] {
        let (n, d, ff) = (self.n as f64, self.d as f64, self.ff() as f64);
        [
            ("qkv projection", 2.0 * n * d * 3.0 * d),
            ("attention", 4.0 * n * n * d),
            ("output projection", 2.0 * n * d * d),
            ("feed-forward", 2.0 * 2.0 * n * d * ff),
            ("residuals + norms", 0.0),
        ]
    }
    fn total_flops(&self) -> f64 {
        self.flops().iter().map(|f| f.1).sum()
    }
}

fn shapes() -> Vec<Shape> {
    let mut s = vec![Shape { n: 512, d: 512, heads: 8 }];
    if std::env::var_os("ATTN_BENCH_QUICK").is_none() {
        s.push(Shape { n: 2048, d: 1024, heads: 16 });
    }
    s
}

fn data(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale
        })
        .collect()
}

/// Owned weights of one encoder layer; `wqkv` is `[d, 3d]` (Q | K | V columns) and `wq`,
/// `wk`, `wv` the same values in three separate buffers.
struct Params {
    cfg: EncoderConfig,
    wqkv: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    bqkv: Vec<f32>,
    bo: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
}

impl Params {
    fn new(s: Shape) -> Self {
        let (d, ff) = (s.d, s.ff());
        let sc = 1.0 / (d as f32).sqrt();
        let wqkv = data(d * 3 * d, 1, sc);
        let split = |c: usize| -> Vec<f32> {
            (0..d).flat_map(|r| wqkv[r * 3 * d + c * d..][..d].to_vec()).collect()
        };
        let (wq, wk, wv) = (split(0), split(1), split(2));
        Params {
            cfg: s.cfg(),
            wq,
            wk,
            wv,
            wqkv,
            wo: data(d * d, 2, sc),
            bqkv: data(3 * d, 3, 0.1),
            bo: data(d, 4, 0.1),
            gamma: vec![1.0; d],
            beta: vec![0.0; d],
            w1: data(d * ff, 5, sc),
            b1: data(ff, 6, 0.1),
            w2: data(ff * d, 7, 1.0 / (ff as f32).sqrt()),
            b2: data(d, 8, 0.1),
        }
    }

    fn weights(&self, fused: bool) -> EncoderWeights<'_> {
        let d = self.cfg.attn.in_dim;
        let ff = self.cfg.ff_dim;
        let (wq, wk, wv) = if fused {
            let blk = |c: usize| MatRef::new(&self.wqkv, MatLayout::strided(d, d, 3 * d, 1, c * d));
            (blk(0), blk(1), blk(2))
        } else {
            (
                MatRef::row_major(&self.wq, d, d),
                MatRef::row_major(&self.wk, d, d),
                MatRef::row_major(&self.wv, d, d),
            )
        };
        let norm = LayerNormWeights { gamma: &self.gamma, beta: &self.beta };
        EncoderWeights {
            attn: MhaWeights {
                wq,
                wk,
                wv,
                wo: MatRef::row_major(&self.wo, d, d),
                bq: Some(&self.bqkv[..d]),
                bk: Some(&self.bqkv[d..2 * d]),
                bv: Some(&self.bqkv[2 * d..]),
                bo: Some(&self.bo),
            },
            norm1: norm,
            ff: FeedForwardWeights {
                w1: MatRef::row_major(&self.w1, d, ff),
                b1: Some(&self.b1),
                w2: MatRef::row_major(&self.w2, ff, d),
                b2: Some(&self.b2),
            },
            norm2: norm,
        }
    }
}

const PARS: [(&str, usize); 2] = [("seq", 1), ("2t", 2)];

fn bench_layers(c: &mut Criterion) {
    for s in shapes() {
        let p = Params::new(s);
        let x = data(s.n * s.d, 9, 1.0);
        let mut y = vec![0.0; s.n * s.d];
        let l = Tensor4Layout::batch_seq(1, s.n, s.d);
        let mut g = c.benchmark_group(format!("layers/encoder/{}", s.name()));
        g.sample_size(10);
        g.throughput(Throughput::Elements(s.total_flops() as u64));
        for fused in [true, false] {
            let w = p.weights(fused);
            let layer = EncoderLayer::new(p.cfg, w).unwrap();
            let mut ws = vec![0.0; layer.workspace_len(1, s.n)];
            for (pname, t) in PARS {
                let par = Parallelism::threads(t);
                let id = if fused { "fused_qkv" } else { "separate_qkv" };
                g.bench_function(BenchmarkId::new(id, pname), |b| {
                    b.iter(|| {
                        layer
                            .forward_in(
                                TensorRef::new(black_box(&x), l),
                                &Mask::None,
                                TensorMut::new(&mut y, l),
                                &mut ws,
                                par,
                            )
                            .unwrap()
                    })
                });
            }
        }
        g.finish();
    }
    parts_table();
}

/// Median wall time of `reps` runs of `f` (after one warm-up run).
fn median(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut t: Vec<Duration> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[reps / 2]
}

/// The layer beside the sum of its parts, each part run alone on the layer's own buffers.
fn parts_table() {
    eprintln!("\nencoder layer vs the sum of its parts (median of 5; GFLOP/s of useful FLOPs)");
    for s in shapes() {
        let p = Params::new(s);
        let (n, d, ff, h) = (s.n, s.d, s.ff(), s.heads);
        let x = data(n * d, 9, 1.0);
        let mut y = vec![0.0; n * d];
        let l = Tensor4Layout::batch_seq(1, n, d);
        let w = p.weights(true);
        let layer = EncoderLayer::new(p.cfg, w).unwrap();
        let mut ws = vec![0.0; layer.workspace_len(1, n)];
        let mut qkv = vec![0.0; n * 3 * d];
        let mut heads = vec![0.0; n * d];
        let mut a = vec![0.0; n * d];
        let mut hid = vec![0.0; n * ff];
        let dk = d / h;
        for (pname, t) in PARS {
            let par = Parallelism::threads(t);
            let whole = median(5, || {
                let (xt, yt) = (TensorRef::new(&x, l), TensorMut::new(&mut y, l));
                layer.forward_in(xt, &Mask::None, yt, &mut ws, par).unwrap()
            });
            let xm = MatRef::row_major(&x, n, d);
            let fused = median(5, || {
                let wm = MatRef::row_major(&p.wqkv, d, 3 * d);
                let out = MatMut::row_major(&mut qkv, n, 3 * d);
                layers::linear(xm, wm, Some(&p.bqkv), out, par).unwrap()
            });
            let separate = median(5, || {
                for (i, wsep) in [&p.wq, &p.wk, &p.wv].into_iter().enumerate() {
                    let out = MatMut::new(&mut qkv, MatLayout::strided(n, d, 3 * d, 1, i * d));
                    let b = Some(&p.bqkv[i * d..(i + 1) * d]);
                    layers::linear(xm, MatRef::row_major(wsep, d, d), b, out, par).unwrap();
                }
            });
            let split =
                |off: usize| Tensor4Layout::strided([1, h, n, dk], [n * 3 * d, dk, 3 * d, 1], off);
            let attn = median(5, || {
                attn_kernels::attention::Attention::new(
                    TensorRef::new(&qkv, split(0)),
                    TensorRef::new(&qkv, split(d)),
                    TensorRef::new(&qkv, split(2 * d)),
                )
                .scale(1.0 / (dk as f32).sqrt())
                .parallelism(par)
                .run(TensorMut::new(&mut heads, Tensor4Layout::bshd(1, n, h, dk)))
                .unwrap()
            });
            let out_proj = median(5, || {
                let hm = MatRef::row_major(&heads, n, d);
                let out = MatMut::row_major(&mut a, n, d);
                layers::linear(hm, MatRef::row_major(&p.wo, d, d), Some(&p.bo), out, par).unwrap()
            });
            let ffn = median(5, || {
                let w1 = MatRef::row_major(&p.w1, d, ff);
                let hm = MatMut::row_major(&mut hid, n, ff);
                layers::linear(MatRef::row_major(&heads, n, d), w1, Some(&p.b1), hm, par).unwrap();
                let w2 = MatRef::row_major(&p.w2, ff, d);
                let out = MatMut::row_major(&mut a, n, d);
                sgemm(1.0, MatRef::row_major(&hid, n, ff), w2, 1.0, out, par).unwrap()
            });
            let norm = LayerNormWeights { gamma: &p.gamma, beta: &p.beta };
            let norms = median(5, || {
                for _ in 0..2 {
                    a.iter_mut().zip(&x).for_each(|(a, x)| *a += x);
                    let (am, ym) = (MatRef::row_major(&a, n, d), MatMut::row_major(&mut y, n, d));
                    layers::layer_norm(am, &norm, 1e-5, ym).unwrap();
                }
            });
            let parts = [fused, attn, out_proj, ffn, norms];
            let sum: Duration = parts.iter().sum();
            let gf = |fl: f64, t: Duration| fl / t.as_secs_f64() / 1e9;
            eprintln!(
                "{} {pname}: layer {:.2} ms ({:.1} GFLOP/s), sum of parts {:.2} ms ({:.1} GFLOP/s), \
                 layer/sum {:.3}",
                s.name(),
                whole.as_secs_f64() * 1e3,
                gf(s.total_flops(), whole),
                sum.as_secs_f64() * 1e3,
                gf(s.total_flops(), sum),
                whole.as_secs_f64() / sum.as_secs_f64()
            );
            for ((name, fl), t) in s.flops().iter().zip(parts) {
                eprintln!(
                    "    {name:<18} {:>9.3} ms {:>7.1} GFLOP/s",
                    t.as_secs_f64() * 1e3,
                    gf(*fl, t)
                );
            }
            eprintln!(
                "    qkv as 3 GEMMs     {:>9.3} ms {:>7.1} GFLOP/s (fused/separate {:.3})",
                separate.as_secs_f64() * 1e3,
                gf(s.flops()[0].1, separate),
                fused.as_secs_f64() / separate.as_secs_f64()
            );
        }
    }
}

criterion_group!(benches, bench_layers);
criterion_main!(benches);
