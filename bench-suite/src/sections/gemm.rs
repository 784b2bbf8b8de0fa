//! SGEMM `C = A·B`: square sizes, and the four products of attention (`Q·Kᵀ` with B read
//! transposed, `P·V`) at two sequence lengths; every implementation at every shape and thread
//! count, the reference only where it finishes in reasonable time.

use attn_kernels::Parallelism;
use attn_reference::{MatMut, MatRef, Result};

use super::{Ctx, Work};
use crate::check::{compare, gemm_bound, mat, mat_mut, Rng};
use crate::peers;
use crate::record::Shape;

const OP: &str = "gemm";

/// The reference (f64, naive loops) is timed only up to this many multiply-adds (256³).
const REFERENCE_MAX_MACS: usize = 1 << 24;

/// One SGEMM implementation: `C ← A·B` on `threads` threads.
struct Impl {
    name: &'static str,
    /// False: single-threaded only (measured at 1 thread only).
    threaded: bool,
    call: fn(MatRef<'_>, MatRef<'_>, MatMut<'_>, usize) -> Result<()>,
}

/// The implementations, ours first; each row of the table is compared with the others.
const IMPLS: &[Impl] = &[
    Impl {
        name: "attn-kernels",
        threaded: true,
        call: |a, b, c, t| attn_kernels::gemm::sgemm(1.0, a, b, 0.0, c, Parallelism::threads(t)),
    },
    Impl { name: "gemm", threaded: true, call: |a, b, c, t| peers::gemm(1.0, a, b, 0.0, c, t) },
    Impl {
        name: "matrixmultiply",
        threaded: false,
        call: |a, b, c, _| peers::matrixmultiply(1.0, a, b, 0.0, c),
    },
    Impl {
        name: "reference",
        threaded: false,
        call: |a, b, c, _| attn_reference::matmul::matmul(1.0, a, b, 0.0, c),
    },
];

/// `(m, n, k, B transposed)`.
type Case = (usize, usize, usize, bool);

fn grid(quick: bool) -> (Vec<usize>, Vec<Case>) {
    if quick {
        (vec![64, 128, 256], vec![(256, 256, 64, true), (256, 64, 256, false)])
    } else {
        (
            vec![256, 512, 1024, 2048],
            vec![
                (1024, 1024, 64, true),
                (1024, 64, 1024, false),
                (256, 512, 64, true),
                (256, 64, 512, false),
            ],
        )
    }
}

/// Checks every implementation against the reference on odd sizes (not multiples of any
/// register tile), both B layouts, at each thread count.
fn checks(ctx: &mut Ctx) {
    for (case_idx, &(m, n, k, bt)) in
        [(131, 257, 67, false), (96, 200, 64, true)].iter().enumerate()
    {
        let mut rng = Rng::new(0x6e33 + case_idx as u64);
        let (a, b) = (rng.vec(m * k), rng.vec(k * n));
        let (am, bm) = (mat(&a, m, k, false), mat(&b, k, n, bt));
        let mut want = vec![0.0; m * n];
        if let Err(e) = attn_reference::matmul::matmul(1.0, am, bm, 0.0, mat_mut(&mut want, m, n)) {
            ctx.check(OP, "reference", Shape::Gemm { m, n, k, bt }, 1, Err(e.to_string()));
            continue;
        }
        let bound = gemm_bound(&am, &bm);
        for imp in IMPLS.iter().filter(|i| i.name != "reference") {
            for &t in ctx.threads.clone().iter().filter(|&&t| t == 1 || imp.threaded) {
                let mut got = vec![f32::NAN; m * n];
                let r = Parallelism::threads(t)
                    .install(|| (imp.call)(am, bm, mat_mut(&mut got, m, n), t));
                let v = r.map(|()| compare(&got, &want, &bound)).map_err(|e| e.to_string());
                ctx.check(OP, imp.name, Shape::Gemm { m, n, k, bt }, t, v);
            }
        }
    }
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    checks(ctx);
    let (square, attn) = grid(ctx.quick);
    let cases: Vec<(Case, Option<String>)> = square
        .iter()
        .map(|&n| ((n, n, n, false), Some("gemm-square".to_string())))
        .chain(attn.into_iter().map(|c| (c, None)))
        .collect();
    for ((m, n, k, bt), plot) in cases {
        let mut rng = Rng::new((m * 31 + n * 7 + k) as u64);
        let (a, b) = (rng.vec(m * k), rng.vec(k * n));
        let mut c = vec![0.0f32; m * n];
        let work = Work::Flops(2.0 * (m * n * k) as f64);
        for &t in &ctx.threads.clone() {
            for imp in IMPLS {
                if (t > 1 && !imp.threaded)
                    || (imp.name == "reference" && m * n * k > REFERENCE_MAX_MACS)
                {
                    continue;
                }
                let shape = Shape::Gemm { m, n, k, bt };
                let plot = plot.clone().map(|g| (g, n as f64));
                let par = Parallelism::threads(t);
                ctx.bench(OP, imp.name, shape, t, work, plot, || {
                    par.install(|| {
                        (imp.call)(
                            mat(&a, m, k, false),
                            mat(&b, k, n, bt),
                            mat_mut(&mut c, m, n),
                            t,
                        )
                    })
                });
            }
        }
    }
}
