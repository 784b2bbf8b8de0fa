//! Attention benchmarks: the flash path beside the unfused path and the reference, and the
//! decode path, over the shapes of issue 5.
//!
//! - `attention/d{64,128}/{full,causal}/{1t,2t}`: batch 1, 8 heads, `N ∈ {256 … 4096}`,
//!   `[b, h, s, d]` storage; throughput in FLOP/s with `4·Nq·Nk·d` per head (causal: only the
//!   visible pairs). The unfused path runs for `N ≤ 1024`, the f64 reference for `N = 256`.
//! - `attention_decode/hkv{32,8}/{1t,2t}`: 1 query × 32 heads × 4096 keys × d 128; throughput
//!   in bytes of K and V read.
//!
//! Quick run: `cargo bench -p attn-bench --bench attention -- --warm-up-time 1
//! --measurement-time 2` (add a filter such as `d64/full/1t`).

use std::hint::black_box;

use attn_kernels::attention::{Attention, Path};
use attn_kernels::{arch, Mask, Parallelism, Tensor4Layout};
use attn_reference::{TensorMut, TensorRef};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const HEADS: usize = 8;
const SEQS: [usize; 5] = [256, 512, 1024, 2048, 4096];

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// Useful FLOPs: `4·d` per visible (query, key) pair per head.
fn flops(n: usize, d: usize, causal: bool) -> u64 {
    let pairs = if causal { n * (n + 1) / 2 } else { n * n };
    (4 * pairs * d * HEADS) as u64
}

fn bench_attention(c: &mut Criterion) {
    let isa = arch::selected();
    for d in [64, 128] {
        for causal in [false, true] {
            for threads in [1, 2] {
                let name =
                    format!("attention/d{d}/{}/{threads}t", if causal { "causal" } else { "full" });
                let mut g = c.benchmark_group(name);
                g.sample_size(10);
                let par = Parallelism::threads(threads);
                let mask = if causal { Mask::Causal { offset: None } } else { Mask::None };
                for n in SEQS {
                    let l = Tensor4Layout::bhsd(1, HEADS, n, d);
                    let (q, k, v) = (data(l.len(), 1), data(l.len(), 2), data(l.len(), 3));
                    let mut o = vec![0.0f32; l.len()];
                    let scale = attn_reference::attention::default_scale(d);
                    g.throughput(Throughput::Elements(flops(n, d, causal)));
                    fn views<'a>(
                        q: &'a [f32],
                        k: &'a [f32],
                        v: &'a [f32],
                        o: &'a mut [f32],
                        l: Tensor4Layout,
                    ) -> (TensorRef<'a>, TensorRef<'a>, TensorRef<'a>, TensorMut<'a>)
                    {
                        (
                            TensorRef::new(q, l),
                            TensorRef::new(k, l),
                            TensorRef::new(v, l),
                            TensorMut::new(o, l),
                        )
                    }

                    g.bench_with_input(BenchmarkId::new("flash", n), &n, |b, _| {
                        b.iter(|| {
                            let (q, k, v, o) = views(&q, &k, &v, &mut o, l);
                            let a = Attention::new(q, k, v).scale(scale).mask(mask);
                            a.parallelism(par).run(o).unwrap();
                            black_box(());
                        })
                    });
                    if n <= 1024 {
                        g.bench_with_input(BenchmarkId::new("unfused", n), &n, |b, _| {
                            b.iter(|| {
                                let (q, k, v, o) = views(&q, &k, &v, &mut o, l);
                                Attention::new(q, k, v)
                                    .scale(scale)
                                    .mask(mask)
                                    .parallelism(par)
                                    .isa(isa)
                                    .path(Path::Unfused)
                                    .run(o)
                                    .unwrap();
                            })
                        });
                    }
                    if n <= 256 && threads == 1 {
                        g.bench_with_input(BenchmarkId::new("reference", n), &n, |b, _| {
                            b.iter(|| {
                                let (q, k, v, o) = views(&q, &k, &v, &mut o, l);
                                attn_reference::attention::attention(
                                    q, k, v, scale, &mask, o, None,
                                )
                                .unwrap();
                            })
                        });
                    }
                }
                g.finish();
            }
        }
    }
}

fn bench_decode(c: &mut Criterion) {
    let isa = arch::selected();
    const HQ: usize = 32;
    const NK: usize = 4096;
    const D: usize = 128;
    for hkv in [32, 8] {
        for threads in [1, 2] {
            let mut g = c.benchmark_group(format!("attention_decode/hkv{hkv}/{threads}t"));
            g.sample_size(20);
            let par = Parallelism::threads(threads);
            let ql = Tensor4Layout::bhsd(1, HQ, 1, D);
            let kl = Tensor4Layout::bhsd(1, hkv, NK, D);
            let (q, k, v) = (data(ql.len(), 1), data(kl.len(), 2), data(kl.len(), 3));
            let mut o = vec![0.0f32; ql.len()];
            let scale = attn_reference::attention::default_scale(D);
            g.throughput(Throughput::Bytes((2 * kl.len() * 4) as u64));
            g.bench_function("decode", |b| {
                b.iter(|| {
                    Attention::new(
                        TensorRef::new(&q, ql),
                        TensorRef::new(&k, kl),
                        TensorRef::new(&v, kl),
                    )
                    .scale(scale)
                    .parallelism(par)
                    .isa(isa)
                    .path(Path::Decode)
                    .run(TensorMut::new(&mut o, ql))
                    .unwrap()
                })
            });
            if threads == 1 {
                g.bench_function("unfused", |b| {
                    b.iter(|| {
                        Attention::new(
                            TensorRef::new(&q, ql),
                            TensorRef::new(&k, kl),
                            TensorRef::new(&v, kl),
                        )
                        .scale(scale)
                        .parallelism(par)
                        .isa(isa)
                        .path(Path::Unfused)
                        .run(TensorMut::new(&mut o, ql))
                        .unwrap()
                    })
                });
            }
            g.finish();
        }
    }
}

criterion_group!(benches, bench_attention, bench_decode);
criterion_main!(benches);
