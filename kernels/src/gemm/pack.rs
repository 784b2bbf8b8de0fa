//! Packing: copies blocks of the caller's strided operands into the contiguous, zero-padded
//! micro-panel layout the micro-kernels read (see `ukernel`), plus the 64-byte aligned,
//! reusable buffers that hold them.
//!
//! Layouts, for a block of depth `kc`:
//! - A: `MR`-row micro-panels; panel `r`, step `p`, row `i` at `(r·kc + p)·MR + i`;
//! - B: `NR`-column micro-panels; panel `s`, step `p`, column `j` at `(s·kc + p)·NR + j`.
//!
//! Rows / columns past the edge of the operand are written as zeros, so a micro-kernel can
//! always run a full tile and the padding only produces zeros in the bounce tile.
//!
//! The operands may be f32, bf16 or f16 ([`SimdElement`]): packing widens each element to its
//! exact f32 value, so the micro-kernels only ever see f32.

use std::cell::Cell;

use attn_core::MatRef;

use crate::arch::convert::SimdElement;

/// A growable f32 buffer whose slices start on a 64-byte boundary (one cache line, one zmm), so
/// B panels are read with aligned vector loads. Grows only; reused across calls.
#[derive(Default)]
pub(crate) struct AlignedBuf {
    v: Vec<f32>,
}

/// Alignment of [`AlignedBuf`] slices in f32 elements (64 bytes).
const ALIGN_F32: usize = 16;

impl AlignedBuf {
    /// Grows the buffer, fallibly, so that [`get`](Self::get) with `len` will not allocate:
    /// false (and the buffer unchanged) when the size overflows or cannot be allocated.
    pub(crate) fn try_grow(&mut self, len: usize) -> bool {
        let Some(need) = len.checked_add(ALIGN_F32) else { return false };
        if self.v.len() >= need {
            return true;
        }
        let mut v = Vec::new();
        if v.try_reserve_exact(need).is_err() {
            return false;
        }
        v.resize(need, 0.0);
        self.v = v;
        true
    }

    /// The first `len` elements of the aligned region, growing the buffer if needed. Contents
    /// are unspecified (whatever the last user left).
    pub(crate) fn get(&mut self, len: usize) -> &mut [f32] {
        if self.v.len() < len + ALIGN_F32 {
            self.v = vec![0.0; len + ALIGN_F32];
        }
        let misalign = (self.v.as_ptr() as usize / 4) % ALIGN_F32;
        let off = (ALIGN_F32 - misalign) % ALIGN_F32;
        &mut self.v[off..off + len]
    }

    /// The first `len` elements of the aligned region, as last written through
    /// [`get`](Self::get) with at least `len` (an empty slice if the buffer never grew).
    pub(crate) fn view(&self, len: usize) -> &[f32] {
        if self.v.len() < len + 16 {
            return &[];
        }
        let off = (16 - (self.v.as_ptr() as usize / 4) % 16) % 16;
        &self.v[off..off + len]
    }
}

thread_local! {
    static A_BUF: Cell<AlignedBuf> = Cell::new(AlignedBuf::default());
    static B_BUF: Cell<AlignedBuf> = Cell::new(AlignedBuf::default());
}

/// Which thread-local packing buffer to borrow.
#[derive(Clone, Copy)]
pub(crate) enum Slot {
    /// Per-thread A blocks.
    A,
    /// The B block of the calling thread.
    B,
}

/// Runs `f` with this thread's reusable buffer for `slot`. The buffer is taken out of the
/// thread-local for the duration, so a re-entrant call (e.g. a rayon worker stealing another
/// GEMM while waiting) simply gets a fresh one instead of aliasing it.
pub(crate) fn with_buf<R>(slot: Slot, f: impl FnOnce(&mut AlignedBuf) -> R) -> R {
    let key = match slot {
        Slot::A => &A_BUF,
        Slot::B => &B_BUF,
    };
    let mut buf = key.with(|c| c.take());
    let r = f(&mut buf);
    key.with(|c| c.set(buf));
    r
}

/// Packs `A[i0 .. i0+mc, p0 .. p0+kc]` into `MR`-row micro-panels in `dst`, widened to f32.
///
/// # Safety
///
/// `a`'s view fits its slice (`a.check` succeeded), `i0 + mc ≤ rows`, `p0 + kc ≤ cols`, and
/// `dst.len() ≥ ceil(mc/mr)·mr·kc`.
pub(crate) unsafe fn pack_a<T: SimdElement>(
    mr: usize,
    a: &MatRef<'_, T>,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    dst: &mut [f32],
) {
    let l = a.layout;
    debug_assert!(a.check("a").is_ok() && i0 + mc <= l.rows && p0 + kc <= l.cols);
    debug_assert!(dst.len() >= mc.div_ceil(mr) * mr * kc);
    let src = a.data.as_ptr();
    let (rs, cs) = (l.row_stride, l.col_stride);
    for (r, panel) in dst.chunks_exact_mut(mr * kc).take(mc.div_ceil(mr)).enumerate() {
        let rows = mr.min(mc - r * mr);
        let base = l.index(i0 + r * mr, p0);
        // SAFETY (all reads): (i, p) with i < rows, p < kc is inside the checked view.
        if rs == 1 && rows == mr {
            // Column-major A: each step is MR contiguous values.
            match mr {
                4 => unsafe { copy_rows::<T, 4>(panel, src, base, cs) },
                6 => unsafe { copy_rows::<T, 6>(panel, src, base, cs) },
                12 => unsafe { copy_rows::<T, 12>(panel, src, base, cs) },
                _ => {
                    for (p, out) in panel.chunks_exact_mut(mr).enumerate() {
                        let s = unsafe { core::slice::from_raw_parts(src.add(base + p * cs), mr) };
                        for (o, x) in out.iter_mut().zip(s) {
                            *o = x.widen();
                        }
                    }
                }
            }
        } else if rows == mr && matches!(mr, 4 | 6 | 12) {
            // Row-major (or general) A, full panel: gather MR rows per step with the panel
            // height known at compile time, so each step is MR loads and one fixed-size store.
            unsafe {
                match mr {
                    4 => gather_lines::<T, 4>(panel, src, base, rs, cs),
                    6 => gather_lines::<T, 6>(panel, src, base, rs, cs),
                    _ => gather_lines::<T, 12>(panel, src, base, rs, cs),
                }
            }
        } else {
            if rows < mr {
                panel.fill(0.0);
            }
            // Row-major or general A: walk each row contiguously (cs is usually 1) and scatter
            // into the panel with stride MR.
            for i in 0..rows {
                let row = base + i * rs;
                for p in 0..kc {
                    panel[p * mr + i] = unsafe { *src.add(row + p * cs) }.widen();
                }
            }
        }
    }
}

/// Packs `B[p0 .. p0+kc, j0 .. j0+nc]` into `NR`-column micro-panels in `dst`, widened to f32.
///
/// # Safety
///
/// `b`'s view fits its slice (`b.check` succeeded), `p0 + kc ≤ rows`, `j0 + nc ≤ cols`, and
/// `dst.len() ≥ ceil(nc/nr)·nr·kc`.
pub(crate) unsafe fn pack_b<T: SimdElement>(
    nr: usize,
    b: &MatRef<'_, T>,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    dst: &mut [f32],
) {
    let l = b.layout;
    debug_assert!(b.check("b").is_ok() && p0 + kc <= l.rows && j0 + nc <= l.cols);
    debug_assert!(dst.len() >= nc.div_ceil(nr) * nr * kc);
    for (s, panel) in dst.chunks_exact_mut(nr * kc).take(nc.div_ceil(nr)).enumerate() {
        // SAFETY: panel s covers columns j0 + s·nr .. + cols of the checked view.
        unsafe { pack_b_panel(nr, b, p0, kc, j0 + s * nr, nr.min(nc - s * nr), panel) };
    }
}

/// Packs one B micro-panel: `B[p0 .. p0+kc, j .. j+cols]`, zero-padded to `nr` columns.
///
/// # Safety
///
/// As [`pack_b`], for columns `j .. j + cols` with `cols ≤ nr`, and `panel.len() == nr·kc`.
unsafe fn pack_b_panel<T: SimdElement>(
    nr: usize,
    b: &MatRef<'_, T>,
    p0: usize,
    kc: usize,
    j: usize,
    cols: usize,
    panel: &mut [f32],
) {
    let l = b.layout;
    debug_assert!(cols <= nr && j + cols <= l.cols && p0 + kc <= l.rows);
    debug_assert_eq!(panel.len(), nr * kc);
    let src = b.data.as_ptr();
    let (rs, cs) = (l.row_stride, l.col_stride);
    let base = l.index(p0, j);
    // SAFETY (all reads): (p, jj) with p < kc, jj < cols is inside the checked view.
    if cs == 1 && cols == nr {
        // Row-major B: each step is NR contiguous values.
        match nr {
            16 => unsafe { copy_rows::<T, 16>(panel, src, base, rs) },
            32 => unsafe { copy_rows::<T, 32>(panel, src, base, rs) },
            _ => {
                for (p, out) in panel.chunks_exact_mut(nr).enumerate() {
                    let s = unsafe { core::slice::from_raw_parts(src.add(base + p * rs), nr) };
                    for (o, x) in out.iter_mut().zip(s) {
                        *o = x.widen();
                    }
                }
            }
        }
    } else if cols == nr && matches!(nr, 16 | 32) {
        // Column-major / transposed B (e.g. Kᵀ from a row-major K), full panel: NR column
        // streams, one fixed-size store per step.
        unsafe {
            match nr {
                16 => gather_lines::<T, 16>(panel, src, base, cs, rs),
                _ => gather_lines::<T, 32>(panel, src, base, cs, rs),
            }
        }
    } else {
        if cols < nr {
            panel.fill(0.0);
        }
        // Column-major / transposed B (e.g. Kᵀ from a row-major K): walk each column
        // contiguously and scatter with stride NR.
        for jj in 0..cols {
            let col = base + jj * cs;
            for p in 0..kc {
                panel[p * nr + jj] = unsafe { *src.add(col + p * rs) }.widen();
            }
        }
    }
}

/// Copies `N` contiguous values from `src + base + p·stride` to `dst[p·N ..]` for every `p`,
/// widened to f32, as fixed-size moves (a runtime-length `copy_from_slice` would call `memcpy`
/// per row; for f32 the widening is the identity).
///
/// # Safety
///
/// `src + base + p·stride .. + N` is readable for every `p < dst.len() / N`.
#[inline(always)]
unsafe fn copy_rows<T: SimdElement, const N: usize>(
    dst: &mut [f32],
    src: *const T,
    base: usize,
    stride: usize,
) {
    for (p, out) in dst.chunks_exact_mut(N).enumerate() {
        // SAFETY: the caller guarantees the N values are readable.
        let row = unsafe { src.add(base + p * stride).cast::<[T; N]>().read_unaligned() };
        out.copy_from_slice(&row.map(T::widen));
    }
}

/// Interleaves `N` strided lines, widened: `dst[p·N + i] = src[base + i·line + p·step]` for every
/// `p < dst.len() / N`, `i < N` (a transposing gather: lines are A's rows or B's columns).
///
/// # Safety
///
/// Every `src + base + i·line + p·step` above is readable.
#[inline(always)]
unsafe fn gather_lines<T: SimdElement, const N: usize>(
    dst: &mut [f32],
    src: *const T,
    base: usize,
    line: usize,
    step: usize,
) {
    // SAFETY: the caller guarantees the line starts and all their steps are readable.
    let lines: [*const T; N] = core::array::from_fn(|i| unsafe { src.add(base + i * line) });
    for (p, out) in dst.chunks_exact_mut(N).enumerate() {
        // SAFETY: as above.
        let v: [f32; N] = core::array::from_fn(|i| unsafe { *lines[i].add(p * step) }.widen());
        out.copy_from_slice(&v);
    }
}
