//! The Goto/BLIS loop nest: split C into NC-column and A/B into KC-deep blocks, pack, split the
//! rows between threads, and hand each MC × NC block to the macro-kernel.
//!
//! ```text
//! LOOP 5  jc: n in NC-column blocks        B block (KC × NC) lives in half the L2
//!  LOOP 4  pc: k in KC-deep blocks         pack B block once per thread
//!   LOOP 3 ic: m in MC-row blocks          pack (or widen) A block (MC × KC), unless in place
//!    LOOP 2 (macro-kernel): ir over MR-row A micro-panels, each held in L1 (with A in place,
//!                           the last two may be shorter, see `macro_kernel`)
//!     LOOP 1 (macro-kernel): jr over NR-column B micro-panels, streamed from L2
//! ```
//!
//! β is applied by the first k-block only (later ones accumulate with β = 1), α by every one.
//! Threads each take a rectangle of C (rows when there are at least two micro-panel rows per
//! thread, else columns) and run the whole nest on it; every C element is computed by the same
//! micro-kernel operations in the same k order whatever the split, so threaded results are
//! bitwise equal to sequential ones.

use rayon::prelude::*;

use attn_core::MatRef;

use super::blocking::{Blocking, PAR_MIN_MNK};
use super::pack::{pack_a, pack_a_pairs, pack_b, pack_b_pairs, widen_a, with_buf, Slot};
use super::ukernel::{macro_kernel, ABlock, Kernel};
use super::PackedPanels;
use crate::arch::convert::SimdElement;
use crate::par::Parallelism;

/// Where the A operand (of element type `T`) comes from: a strided view, packed (and widened)
/// block by block, or an f32 view read in place.
#[derive(Clone, Copy)]
pub(crate) enum ASrc<'a, T = f32> {
    /// A checked `m × k` view, packed block by block.
    View(MatRef<'a, T>),
    /// A checked `m × k` f32 view read in place by the micro-kernels (no packing).
    Direct(MatRef<'a>),
    /// A checked `m × k` view with a unit row or column stride, widened block by block into
    /// the same orientation (vector runs, no transposition) and then read in place like
    /// `Direct`: for half-precision A where packing would not pay.
    Widen(MatRef<'a, T>),
}

/// Where the B operand comes from: a strided view packed block by block, or already packed.
#[derive(Clone, Copy)]
pub(crate) enum BSrc<'a, T = f32> {
    /// A checked `k × n` view.
    View(MatRef<'a, T>),
    /// Packed with the same kernel and blocking, `k × n`.
    Packed(&'a PackedPanels),
}

/// The output view as a raw base pointer and strides, shared by the threads that write
/// disjoint tiles of it.
#[derive(Clone, Copy)]
pub(crate) struct CPtr {
    /// Element `(0, 0)`.
    pub ptr: *mut f32,
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

// SAFETY: the nest hands each thread a disjoint set of C tiles (distinct rows or columns of an
// injective view), so concurrent writes never touch the same element.
unsafe impl Send for CPtr {}
// SAFETY: as above.
unsafe impl Sync for CPtr {}

/// One GEMM problem after validation: `C[m×n] ← α·A·B + β·C` with `m, n, k > 0`, `α ≠ 0`.
/// With a pair kernel (`kern.pairs`, the `vdpbf16ps` one) A is an `ASrc::View` and B a
/// `BSrc::View`, both bf16: they are packed into pairs block by block.
#[derive(Clone, Copy)]
pub(crate) struct Problem<'a, TA = f32, TB = f32> {
    pub kern: &'static Kernel,
    /// KC / MC / NC (a packed B's own, which it was packed with).
    pub bl: Blocking,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub beta: f32,
    pub a: ASrc<'a, TA>,
    pub b: BSrc<'a, TB>,
    pub c: CPtr,
}

/// Runs the whole nest: on the calling thread below [`PAR_MIN_MNK`], else split into one
/// rectangle of C per thread (rows or columns, see [`split_rows`]), each running the complete
/// nest with its own packing buffers. There is one fork-join per call and no barrier per block,
/// which keeps a loaded machine (a worker descheduled for a while) from stalling the others;
/// the price is that each thread packs the B blocks of its columns and the A blocks of its rows
/// itself (with a row split every thread packs the whole B), which [`split_rows`] keeps down.
///
/// # Safety
///
/// The views in `a` / `b` passed their checks and have the problem's shapes; a packed B was
/// packed by `kern` with this shape and `bl`; `c` addresses an injective `m × n` view valid for
/// reads and writes that nobody else touches during the call.
pub(crate) unsafe fn run<TA: SimdElement, TB: SimdElement>(
    pb: &Problem<'_, TA, TB>,
    par: Parallelism,
) {
    let work = pb.m.saturating_mul(pb.n).saturating_mul(pb.k);
    // `count()` is at most the machine's cores; the products below saturate all the same.
    let threads = if work >= PAR_MIN_MNK { par.count() } else { 1 };
    let (mr, nr) = (pb.kern.mr, pb.kern.nr);
    if threads == 1 {
        // SAFETY: forwarded.
        unsafe { run_blocks(pb, 0, pb.m, 0, pb.n) };
    } else if split_rows(pb.m, pb.n, mr, nr, threads) {
        let chunk = pb.m.div_ceil(mr).div_ceil(threads) * mr;
        par.install(|| {
            (0..threads).into_par_iter().for_each(|t| {
                let lo = t.saturating_mul(chunk).min(pb.m);
                // SAFETY: forwarded; threads get disjoint row ranges.
                unsafe { run_blocks(pb, lo, lo.saturating_add(chunk).min(pb.m), 0, pb.n) };
            })
        });
    } else {
        let chunk = pb.n.div_ceil(nr).div_ceil(threads) * nr;
        par.install(|| {
            (0..threads).into_par_iter().for_each(|t| {
                let lo = t.saturating_mul(chunk).min(pb.n);
                // SAFETY: forwarded; threads get disjoint column ranges.
                unsafe { run_blocks(pb, 0, pb.m, lo, lo.saturating_add(chunk).min(pb.n)) };
            })
        });
    }
}

/// Whether [`run`] splits C by rows (else by columns) between `threads ≥ 2` threads. Each
/// thread packs the B blocks of its columns and the A blocks of its rows, so per unit of depth
/// a row split packs `n + ⌈m/t⌉` elements per thread and a column split `⌈n/t⌉ + m`. Rows, when
/// each thread gets at least two micro-panel rows, unless a column split (with two micro-panel
/// columns per thread) packs at most 3/4 of that. Measured on two threads (perf journal,
/// 2026-12-04 14:00): at 64 × 1024 × 1024 (columns pack 0.55 of rows) the call went from 0.74×
/// to 0.96× of `gemm`'s speed; at 256 × 512 × 64 (0.8) the two splits were within the noise.
/// The count keeps A's term when A is read in place (not packed): leaving it out split 512³
/// by columns 1.03–1.05× faster but 256³ 0.96× slower (perf journal, 2026-12-07 16:37).
fn split_rows(m: usize, n: usize, mr: usize, nr: usize, threads: usize) -> bool {
    let rows_ok = m.div_ceil(mr) >= threads.saturating_mul(2);
    let cols_ok = n.div_ceil(nr) >= threads.saturating_mul(2);
    let packs_rows = n.saturating_add(m.div_ceil(threads));
    let packs_cols = n.div_ceil(threads).saturating_add(m);
    rows_ok && !(cols_ok && packs_cols.saturating_mul(4) <= packs_rows.saturating_mul(3))
}

/// The depth of a packed block of `kc` steps, in the kernel's steps: `kc`, or `ceil(kc/2)` pairs
/// for the `vdpbf16ps` kernel.
fn depth<TA, TB>(pb: &Problem<'_, TA, TB>, kc: usize) -> usize {
    if pb.kern.pairs {
        kc.div_ceil(2)
    } else {
        kc
    }
}

/// Loops 5 and 4 over the rectangle `C[i_lo .. i_hi, j_lo .. j_hi]` (`i_lo` a multiple of MR,
/// `j_lo` of NR).
///
/// # Safety
///
/// As [`run`]; no other thread touches this rectangle of C during the call.
unsafe fn run_blocks<TA: SimdElement, TB: SimdElement>(
    pb: &Problem<'_, TA, TB>,
    i_lo: usize,
    i_hi: usize,
    j_lo: usize,
    j_hi: usize,
) {
    let nr = pb.kern.nr;
    let bl = pb.bl;
    // LOOP 5: n in NC-column blocks.
    for jc in (j_lo..j_hi).step_by(bl.nc) {
        let nc = bl.nc.min(j_hi - jc);
        // LOOP 4: k in KC-deep blocks.
        for pc in (0..pb.k).step_by(bl.kc) {
            let kc = bl.kc.min(pb.k - pc);
            let beta = if pc == 0 { pb.beta } else { 1.0 };
            // SAFETY (both arms): forwarded; the packed block matches (pc, kc, jc, nc).
            match pb.b {
                BSrc::Packed(p) => unsafe {
                    row_range(pb, pc, kc, jc, p.block(pc, kc, jc, nc), beta, i_lo, i_hi, 0, nc)
                },
                BSrc::View(b) => with_buf(Slot::B, |buf| {
                    let dst = buf.get(nc.div_ceil(nr) * nr * depth(pb, kc));
                    // SAFETY: the view was checked; the block is inside it; dst is sized.
                    unsafe {
                        if pb.kern.pairs {
                            pack_b_pairs(nr, &b, pc, kc, jc, nc, dst);
                        } else {
                            pack_b(pb.kern.isa, nr, &b, pc, kc, jc, nc, dst);
                        }
                        row_range(pb, pc, kc, jc, dst, beta, i_lo, i_hi, 0, nc)
                    }
                }),
            }
        }
    }
}

/// Loop 3 for rows `i_lo .. i_hi` and block columns `j_lo .. j_hi` (relative to `jc`, `j_lo` a
/// multiple of NR): MC-row blocks, balanced so the last one is not a sliver.
///
/// # Safety
///
/// As [`run`]; `bpack` is the packed B block `(pc, kc, jc, nc)`; no other thread touches these
/// C rows × columns.
#[allow(clippy::too_many_arguments)]
unsafe fn row_range<TA: SimdElement, TB: SimdElement>(
    pb: &Problem<'_, TA, TB>,
    pc: usize,
    kc: usize,
    jc: usize,
    bpack: &[f32],
    beta: f32,
    i_lo: usize,
    i_hi: usize,
    j_lo: usize,
    j_hi: usize,
) {
    if i_lo >= i_hi || j_lo >= j_hi {
        return;
    }
    let kern = pb.kern;
    let mr = kern.mr;
    let kd = depth(pb, kc);
    let blocks = (i_hi - i_lo).div_ceil(pb.bl.mc);
    let mc_step = (i_hi - i_lo).div_ceil(blocks).div_ceil(mr) * mr;
    let c = pb.c;
    for ic in (i_lo..i_hi).step_by(mc_step) {
        let mc = mc_step.min(i_hi - ic);
        let go = |ablock: ABlock| {
            // SAFETY: A block (ic, mc, pc, kc) and B panels from j_lo are packed and sized;
            // the C sub-view rows ic.., columns jc + j_lo.. lies inside the caller's view.
            unsafe {
                macro_kernel(
                    kern,
                    mc,
                    j_hi - j_lo,
                    kd,
                    pb.alpha,
                    ablock,
                    bpack.as_ptr().add(j_lo * kd),
                    beta,
                    c.ptr.add(ic * c.rs + (jc + j_lo) * c.cs),
                    c.rs,
                    c.cs,
                    true, // prefetch_c: GEMM's C comes from memory
                )
            }
        };
        match pb.a {
            ASrc::Direct(a) => go(ABlock::Strided {
                // SAFETY: (ic, pc) is an element of the checked view.
                ptr: unsafe { a.data.as_ptr().add(a.layout.index(ic, pc)) },
                rs: a.layout.row_stride,
                cs: a.layout.col_stride,
            }),
            ASrc::View(a) => with_buf(Slot::A, |buf| {
                let dst = buf.get(mc.div_ceil(mr) * mr * kd);
                // SAFETY: the view was checked and the block is inside it; dst is sized.
                unsafe {
                    if kern.pairs {
                        pack_a_pairs(mr, &a, ic, mc, pc, kc, dst);
                    } else {
                        pack_a(kern.isa, mr, &a, ic, mc, pc, kc, dst);
                    }
                }
                go(ABlock::Packed(dst.as_ptr()))
            }),
            ASrc::Widen(a) => with_buf(Slot::A, |buf| {
                let dst = buf.get(mc * kc);
                // SAFETY: the view was checked, has a unit stride (`ASrc::Widen`), and the
                // block is inside it; dst is sized.
                let (rs, cs) = unsafe { widen_a(kern.isa, &a, ic, mc, pc, kc, dst) };
                go(ABlock::Strided { ptr: dst.as_ptr(), rs, cs })
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_rows;

    #[test]
    fn columns_only_where_they_pack_much_less() {
        // Square: the same packing either way, rows.
        assert!(split_rows(512, 512, 6, 64, 2));
        // Wide: a column split packs B once per column half, not whole per thread.
        assert!(!split_rows(64, 1024, 6, 64, 2));
        // Wide, but a column split would save too little packing to pay.
        assert!(split_rows(256, 512, 6, 64, 2));
        // Tall: rows.
        assert!(split_rows(1024, 64, 12, 32, 2));
        // Too few rows for two micro-panels per thread: columns, whatever the packing.
        assert!(!split_rows(11, 100, 6, 64, 2));
        // Wide but too few column panels: rows.
        assert!(split_rows(64, 120, 6, 64, 2));
    }
}
