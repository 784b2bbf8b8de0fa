//! SGEMM: ours (`attn_kernels::gemm::sgemm`, ISA from `ATTN_ISA` / detection) against `gemm`
//! (0.19, `x86-v4` feature) and `matrixmultiply` (0.3), plus the f64 reference at small sizes,
//! measured in the same run. Throughput is in FLOP (2·m·n·k per call), so criterion's
//! "elem/s" reads as FLOP/s.
//!
//! Groups: `sgemm_square/{seq,t2}` for n ∈ {64 … 2048}, `sgemm_attention/{seq,t2}` for the
//! attention shapes (`m×n×k`, `T` = B is the transpose of a row-major matrix, as in Q·Kᵀ).
//! Threads are pinned with `core_affinity`: the bench thread to core 0 for sequential runs, the
//! workers of each 2-thread pool to cores 0 and 1. `matrixmultiply` fixes its thread count per
//! process (feature `threading` + `MATMUL_NUM_THREADS`), so it appears in the sequential groups
//! only; the 2-thread groups compare with `gemm`'s `Rayon(2)`.
//!
//! Run: `cargo bench -p attn-bench --bench gemm -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;
use std::time::Duration;

use attn_kernels::gemm::sgemm;
use attn_kernels::{arch, Parallelism};
use attn_reference::matmul::matmul;
use attn_reference::{MatLayout, MatMut, MatRef};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// One benchmarked product: `m × n × k`, B stored transposed or not.
#[derive(Clone, Copy)]
struct Shape {
    m: usize,
    n: usize,
    k: usize,
    b_transposed: bool,
}

impl Shape {
    fn label(&self) -> String {
        format!("{}x{}x{}{}", self.m, self.n, self.k, if self.b_transposed { "T" } else { "" })
    }
}

/// Operands of one shape, filled with values in [-1, 1).
struct Operands {
    s: Shape,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    lb: MatLayout,
}

impl Operands {
    fn new(s: Shape) -> Self {
        let mut x = 0x2545_F491u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        };
        let a = (0..s.m * s.k).map(|_| next()).collect();
        let b = (0..s.k * s.n).map(|_| next()).collect();
        let lb = if s.b_transposed {
            MatLayout::row_major(s.n, s.k).transposed()
        } else {
            MatLayout::row_major(s.k, s.n)
        };
        Operands { s, a, b, c: vec![0.0; s.m * s.n], lb }
    }

    fn ours(&mut self, par: Parallelism) {
        let s = self.s;
        sgemm(
            1.0,
            MatRef::row_major(&self.a, s.m, s.k),
            MatRef::new(&self.b, self.lb),
            0.0,
            MatMut::row_major(&mut self.c, s.m, s.n),
            par,
        )
        .expect("valid operands");
    }

    fn gemm(&mut self, threads: usize) {
        let s = self.s;
        let par =
            if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
        // SAFETY: all three buffers hold the strided m×k, k×n and m×n views passed here.
        unsafe {
            gemm::gemm(
                s.m,
                s.n,
                s.k,
                self.c.as_mut_ptr(),
                1,
                s.n as isize,
                false,
                self.a.as_ptr(),
                1,
                s.k as isize,
                self.b.as_ptr(),
                self.lb.col_stride as isize,
                self.lb.row_stride as isize,
                0.0, // gemm computes dst ← alpha·dst + beta·lhs·rhs
                1.0,
                false,
                false,
                false,
                par,
            )
        }
    }

    fn matrixmultiply(&mut self) {
        let s = self.s;
        // SAFETY: as above.
        unsafe {
            matrixmultiply::sgemm(
                s.m,
                s.k,
                s.n,
                1.0,
                self.a.as_ptr(),
                s.k as isize,
                1,
                self.b.as_ptr(),
                self.lb.row_stride as isize,
                self.lb.col_stride as isize,
                0.0,
                self.c.as_mut_ptr(),
                s.n as isize,
                1,
            )
        }
    }

    fn reference(&mut self) {
        let s = self.s;
        matmul(
            1.0,
            MatRef::row_major(&self.a, s.m, s.k),
            MatRef::new(&self.b, self.lb),
            0.0,
            MatMut::row_major(&mut self.c, s.m, s.n),
        )
        .expect("valid operands");
    }
}

/// Pins the workers of the pool `par` runs in (and, for sequential runs, this thread) to
/// distinct cores, so runs do not migrate.
fn pin(par: Parallelism) {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    if cores.is_empty() {
        return;
    }
    match par {
        Parallelism::Sequential => {
            core_affinity::set_for_current(cores[0]);
        }
        Parallelism::Threads(_) => {
            // Our pool (entered through `install`) and the global pool `gemm` uses.
            let pin_pool = |ctx: rayon::BroadcastContext<'_>| {
                core_affinity::set_for_current(cores[ctx.index() % cores.len()]);
            };
            par.install(|| rayon::broadcast(pin_pool));
            rayon::broadcast(pin_pool);
        }
    }
}

fn bench_shapes(c: &mut Criterion, group: &str, shapes: &[Shape], reference_up_to: usize) {
    for threads in [1, 2] {
        let par = Parallelism::threads(threads);
        pin(par);
        let mode = if threads == 1 { "seq" } else { "t2" };
        let mut g = c.benchmark_group(format!("{group}/{mode}"));
        for &s in shapes {
            let mut ops = Operands::new(s);
            g.throughput(Throughput::Elements(2 * (s.m * s.n * s.k) as u64));
            let label = s.label();
            let ours = format!("ours-{}", arch::selected());
            g.bench_function(BenchmarkId::new(ours, &label), |bch| {
                bch.iter(|| black_box(&mut ops).ours(par))
            });
            g.bench_function(BenchmarkId::new("gemm", &label), |bch| {
                bch.iter(|| black_box(&mut ops).gemm(threads))
            });
            if threads == 1 {
                g.bench_function(BenchmarkId::new("matrixmultiply", &label), |bch| {
                    bch.iter(|| black_box(&mut ops).matrixmultiply())
                });
                if s.m.max(s.n).max(s.k) <= reference_up_to {
                    g.bench_function(BenchmarkId::new("reference", &label), |bch| {
                        bch.iter(|| black_box(&mut ops).reference())
                    });
                }
            }
        }
        g.finish();
    }
}

fn square(c: &mut Criterion) {
    let shapes: Vec<Shape> = [64, 128, 256, 512, 1024, 2048]
        .into_iter()
        .map(|n| Shape { m: n, n, k: n, b_transposed: false })
        .collect();
    bench_shapes(c, "sgemm_square", &shapes, 128);
}

fn attention(c: &mut Criterion) {
    let shape = |m, n, k, b_transposed| Shape { m, n, k, b_transposed };
    let shapes = [
        shape(1024, 1024, 64, true),  // S = Q·Kᵀ
        shape(1024, 64, 1024, false), // O = P·V
        shape(256, 512, 64, true),
        shape(256, 64, 512, false),
        shape(4096, 4096, 128, true),
    ];
    bench_shapes(c, "sgemm_attention", &shapes, 0);
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = square, attention }
criterion_main!(benches);
