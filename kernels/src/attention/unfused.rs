//! The unfused path: per `(batch, query head)`, materialise the scores `S = scale·Q·Kᵀ`
//! (`Nq × Nk`), apply the mask and a row softmax in place, then `O = P·V`. It needs `Nq·Nk`
//! floats per thread, which is the point of comparison with the flash path; it is kept for
//! equivalence tests and benchmarks, not for production use.

use rayon::prelude::*;

use super::simd::{axpy, dot, exp2_row, vectorize, Kernel, Simd};
use super::sink::Sink;
use super::{row_of, Problem};
use crate::arch::Isa;
use crate::par::Parallelism;

/// Runs the unfused path over all heads, writing through `sink`.
pub(super) fn run(isa: Isa, p: &Problem<'_>, sink: &Sink<'_>, par: Parallelism) {
    let tasks = p.batch * p.hq;
    if p.nq == 0 || tasks == 0 {
        return;
    }
    let task = |t: usize| vectorize(isa, Head { p, sink, b: t / p.hq, h: t % p.hq });
    if par.count() == 1 || tasks == 1 {
        (0..tasks).for_each(task);
    } else {
        par.install(|| (0..tasks).into_par_iter().with_min_len(1).for_each(task));
    }
}

/// One task: head `h` of batch `b`.
struct Head<'r, 'p, 'a> {
    p: &'r Problem<'a>,
    sink: &'r Sink<'p>,
    b: usize,
    h: usize,
}

impl Kernel for Head<'_, '_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let Head { p, sink, b, h } = self;
        let (nq, nk, dk, dv) = (p.nq, p.nk, p.dk, p.dv);
        let kh = h / p.group;
        let (keys, values) = (p.keys(b, kh), p.values(b, kh));
        let (mut qrow, mut ktmp, mut vtmp) = (vec![0.0; dk], vec![0.0; dk], vec![0.0; dv]);
        // 1. Scores, in the log2 domain (pre-scaled by scale·log₂e).
        let mut sc = vec![0.0f32; nq * nk];
        for i in 0..nq {
            p.scaled_query(b, h, i, &mut qrow);
            for j in 0..nk {
                sc[i * nk + j] = dot(s, &qrow, row_of(&keys, j, dk, &mut ktmp));
            }
        }
        // 2. Mask and softmax (unnormalised; each row keeps its sum).
        let mut sums = vec![0.0f32; nq];
        let mut maxes = vec![f32::MIN; nq];
        for i in 0..nq {
            let row = &mut sc[i * nk..(i + 1) * nk];
            p.apply_mask(b, h, i, 1, 0, nk, 1, row);
            let m = row.iter().fold(f32::MIN, |a, &x| if x > a { x } else { a });
            sums[i] = exp2_row(s, row, m);
            maxes[i] = m;
        }
        // 3. O = P·V, normalised once per row.
        let mut acc = vec![0.0f32; dv];
        for i in 0..nq {
            acc.fill(0.0);
            for j in 0..nk {
                let w = sc[i * nk + j];
                if w != 0.0 {
                    axpy(s, w, row_of(&values, j, dv, &mut vtmp), &mut acc);
                }
            }
            let l = sums[i];
            let (inv, lse) = if l == 0.0 {
                (0.0, f32::NEG_INFINITY)
            } else {
                (1.0 / l, (maxes[i] + l.log2()) * std::f32::consts::LN_2)
            };
            // SAFETY: this task alone owns the rows of head (b, h).
            unsafe { sink.write_row(b, h, i, lse, |d| acc[d] * inv) };
        }
    }
}
