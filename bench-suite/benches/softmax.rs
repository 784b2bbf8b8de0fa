//! Fused scale-mask-softmax against its peers, measured in the same run (criterion).
//!
//! Groups (throughput in elements of the score matrix, masked ones included):
//! - `softmax/64x1024_causal`: 64 rows × 1024 keys, causal (default offset), scale 1/8 — fits in
//!   L2. Ours per ISA, the f64 reference, an unfused chain of separate passes (scale, mask,
//!   softmax), and a plain iterator version (max, exp, sum).
//! - `softmax/8192x4096`: 128 MiB in, 128 MiB out — out of cache. Ours, the unfused chain, the
//!   iterator version, and a plain copy of the same size (`copy_from_slice`): our share of copy
//!   bandwidth is `t(copy) / t(ours)`, both moving the same bytes. The reference is left out
//!   (minutes per iteration).
//! - `softmax/attn_rows`: `8 heads × L × L`, `L ∈ {64, 128, 256, 512}`, no mask: the row lengths
//!   attention uses.
//!
//! Run: `cargo bench -p attn-bench --bench softmax -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;
use std::time::Duration;

use attn_kernels::softmax::{
    exp_slice_with_isa, scale_mask_softmax_with_isa, softmax_exp_slice_with_isa,
};
use attn_kernels::{Isa, Mask, Parallelism, Tensor4Layout};
use attn_reference::{TensorMut, TensorRef};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn data(n: usize) -> Vec<f32> {
    (0..n).map(|k| ((k.wrapping_mul(2_654_435_761) >> 7) % 2000) as f32 * 0.01 - 10.0).collect()
}

/// The unfused chain: three whole-matrix passes as separate functions, as a framework would
/// run them (scale, then mask, then a row softmax with its own max / exp-sum / divide passes).
fn unfused(x: &[f32], y: &mut [f32], rows: usize, cols: usize, scale: f32, causal: bool) {
    for (o, v) in y.iter_mut().zip(x) {
        *o = *v * scale;
    }
    if causal {
        let off = cols as isize - rows as isize;
        for (i, row) in y.chunks_exact_mut(cols).enumerate() {
            let first_masked = (i as isize + off + 1).clamp(0, cols as isize) as usize;
            row[first_masked..].fill(f32::NEG_INFINITY);
        }
    }
    for row in y.chunks_exact_mut(cols) {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut s = 0.0;
        for v in row.iter_mut() {
            *v = (*v - m).exp();
            s += *v;
        }
        for v in row.iter_mut() {
            *v /= s;
        }
    }
}

/// The plain iterator version: per row, max, then exp and sum, then divide.
fn iterator(x: &[f32], y: &mut [f32], rows: usize, cols: usize, scale: f32, causal: bool) {
    let off = cols as isize - rows as isize;
    for (i, (xr, yr)) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)).enumerate() {
        let vis =
            if causal { (i as isize + off + 1).clamp(0, cols as isize) as usize } else { cols };
        let m = xr[..vis].iter().map(|v| v * scale).fold(f32::NEG_INFINITY, f32::max);
        let s: f32 = xr[..vis].iter().map(|v| (v * scale - m).exp()).sum();
        for (o, v) in yr[..vis].iter_mut().zip(&xr[..vis]) {
            *o = (v * scale - m).exp() / s;
        }
        yr[vis..].fill(0.0);
    }
}

fn ours(
    isa: Isa,
    x: &[f32],
    y: &mut [f32],
    l: Tensor4Layout,
    scale: f32,
    mask: &Mask<'_>,
    par: Parallelism,
) {
    scale_mask_softmax_with_isa(
        isa,
        TensorRef::new(x, l),
        scale,
        mask,
        TensorMut::new(y, l),
        None,
        par,
    )
    .unwrap();
}

fn causal_64x1024(c: &mut Criterion) {
    let (rows, cols) = (64, 1024);
    let x = data(rows * cols);
    let mut y = vec![0.0f32; rows * cols];
    let l = Tensor4Layout::bhsd(1, 1, rows, cols);
    let mask = Mask::Causal { offset: None };
    let mut g = c.benchmark_group("softmax/64x1024_causal");
    g.throughput(Throughput::Elements((rows * cols) as u64));
    for isa in Isa::supported() {
        g.bench_function(BenchmarkId::new("ours", isa.name()), |b| {
            b.iter(|| ours(isa, black_box(&x), &mut y, l, 0.125, &mask, Parallelism::Sequential))
        });
    }
    // The same shape without the mask: what the causal mask's ragged rows (961–1024 visible
    // columns, tails that are not a multiple of the unroll) cost over full rows.
    let best = Isa::best();
    g.bench_function(BenchmarkId::new("ours_no_mask", best.name()), |b| {
        b.iter(|| ours(best, black_box(&x), &mut y, l, 0.125, &Mask::None, Parallelism::Sequential))
    });
    g.bench_function("unfused_chain", |b| {
        b.iter(|| unfused(black_box(&x), &mut y, rows, cols, 0.125, true))
    });
    g.bench_function("iterator", |b| {
        b.iter(|| iterator(black_box(&x), &mut y, rows, cols, 0.125, true))
    });
    g.bench_function("reference_f64", |b| {
        b.iter(|| {
            attn_reference::softmax::scale_mask_softmax(
                TensorRef::new(black_box(&x), l),
                0.125,
                &mask,
                TensorMut::new(&mut y, l),
                None,
            )
            .unwrap()
        })
    });
    g.finish();
}

fn out_of_cache(c: &mut Criterion) {
    let (rows, cols) = (8192, 4096);
    let x = data(rows * cols);
    let mut y = vec![0.0f32; rows * cols];
    let l = Tensor4Layout::bhsd(1, 1, rows, cols);
    let mut g = c.benchmark_group("softmax/8192x4096");
    g.throughput(Throughput::Elements((rows * cols) as u64));
    g.sample_size(10);
    g.bench_function("copy", |b| b.iter(|| y.copy_from_slice(black_box(&x))));
    let best = Isa::best();
    g.bench_function(BenchmarkId::new("ours", best.name()), |b| {
        b.iter(|| ours(best, black_box(&x), &mut y, l, 0.125, &Mask::None, Parallelism::Sequential))
    });
    g.bench_function(BenchmarkId::new("ours_2threads", best.name()), |b| {
        b.iter(|| ours(best, black_box(&x), &mut y, l, 0.125, &Mask::None, Parallelism::threads(2)))
    });
    g.bench_function("unfused_chain", |b| {
        b.iter(|| unfused(black_box(&x), &mut y, rows, cols, 0.125, false))
    });
    g.bench_function("iterator", |b| {
        b.iter(|| iterator(black_box(&x), &mut y, rows, cols, 0.125, false))
    });
    g.finish();
}

fn attention_rows(c: &mut Criterion) {
    let mut g = c.benchmark_group("softmax/attn_rows");
    let best = Isa::best();
    for len in [64usize, 128, 256, 512] {
        let (heads, n) = (8, 8 * len * len);
        let x = data(n);
        let mut y = vec![0.0f32; n];
        let l = Tensor4Layout::bhsd(1, heads, len, len);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new(format!("ours_{}", best.name()), len), &len, |b, _| {
            b.iter(|| {
                ours(best, black_box(&x), &mut y, l, 0.125, &Mask::None, Parallelism::Sequential)
            })
        });
        g.bench_with_input(BenchmarkId::new("unfused_chain", len), &len, |b, _| {
            b.iter(|| unfused(black_box(&x), &mut y, heads * len, len, 0.125, false))
        });
        g.bench_with_input(BenchmarkId::new("iterator", len), &len, |b, _| {
            b.iter(|| iterator(black_box(&x), &mut y, heads * len, len, 0.125, false))
        });
    }
    g.finish();
}

/// The two vector exps alone on 1024 values in L1 (`x ∈ [−20, 0]`): the general one (1 ULP, any
/// `x`) and the softmax's (`x ≤ 0`), the cost floor of the exp pass.
fn exp_l1(c: &mut Criterion) {
    let n = 1024;
    let x: Vec<f32> = data(n).iter().map(|v| v - 10.0).collect();
    let mut y = vec![0.0f32; n];
    let mut g = c.benchmark_group("softmax/exp_1024");
    g.throughput(Throughput::Elements(n as u64));
    for isa in Isa::supported() {
        g.bench_function(BenchmarkId::new("exp", isa.name()), |b| {
            b.iter(|| exp_slice_with_isa(isa, black_box(&x), &mut y).unwrap())
        });
        g.bench_function(BenchmarkId::new("softmax_exp", isa.name()), |b| {
            b.iter(|| softmax_exp_slice_with_isa(isa, black_box(&x), &mut y).unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2));
    targets = exp_l1, causal_64x1024, out_of_cache, attention_rows
}
criterion_main!(benches);
