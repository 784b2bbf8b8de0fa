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
use crate::arch::{vectorize, Isa, Kernel, Simd, MAX_LANES};

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
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pack_a<T: SimdElement>(
    isa: Isa,
    mr: usize,
    a: &MatRef<'_, T>,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    dst: &mut [f32],
) {
    vectorize(isa, PackA { mr, a, i0, mc, p0, kc, dst });
}

/// [`pack_a`]'s arguments, run as a [`Kernel`] so the widening compiles for the ISA. Built only
/// by `pack_a`, whose caller guarantees its contract.
struct PackA<'a, 'b, T> {
    mr: usize,
    a: &'a MatRef<'b, T>,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    dst: &'a mut [f32],
}

impl<T: SimdElement> Kernel for PackA<'_, '_, T> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        // SAFETY: `pack_a`'s contract, which its caller guarantees.
        unsafe { pack_a_body(s, self.mr, self.a, self.i0, self.mc, self.p0, self.kc, self.dst) }
    }
}

/// The body of [`pack_a`] for the vector ISA `S`.
///
/// # Safety
///
/// As [`pack_a`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_a_body<S: Simd, T: SimdElement>(
    s: S,
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
    debug_assert!(l.col_stride != 1, "a row-major A is read in place, never packed");
    debug_assert!(dst.len() >= mc.div_ceil(mr) * mr * kc);
    let src = a.data.as_ptr();
    let (rs, cs) = (l.row_stride, l.col_stride);
    for (r, panel) in dst.chunks_exact_mut(mr * kc).take(mc.div_ceil(mr)).enumerate() {
        let rows = mr.min(mc - r * mr);
        let base = l.index(i0 + r * mr, p0);
        // SAFETY (all reads): (i, p) with i < rows, p < kc is inside the checked view.
        if rs == 1 && rows == mr && !is_f32::<T>() {
            // Column-major half A: each step is MR contiguous values, widened as vectors.
            for (p, out) in panel.chunks_exact_mut(mr).enumerate() {
                unsafe { widen_run(s, src.add(base + p * cs), out) };
            }
        } else if rs == 1 && rows == mr {
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
            // General A, full panel: gather MR rows per step with the panel height known at
            // compile time, so each step is MR loads and one fixed-size store.
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
            // A partial panel, or a general A: walk each row and scatter into the panel with
            // stride MR.
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
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pack_b<T: SimdElement>(
    isa: Isa,
    nr: usize,
    b: &MatRef<'_, T>,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    dst: &mut [f32],
) {
    vectorize(isa, PackB { nr, b, p0, kc, j0, nc, dst });
}

/// [`pack_b`]'s arguments, run as a [`Kernel`]. Built only by `pack_b`, whose caller
/// guarantees its contract.
struct PackB<'a, 'b, T> {
    nr: usize,
    b: &'a MatRef<'b, T>,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    dst: &'a mut [f32],
}

impl<T: SimdElement> Kernel for PackB<'_, '_, T> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (nr, b, p0, kc, j0, nc) = (self.nr, self.b, self.p0, self.kc, self.j0, self.nc);
        let l = b.layout;
        debug_assert!(b.check("b").is_ok() && p0 + kc <= l.rows && j0 + nc <= l.cols);
        debug_assert!(self.dst.len() >= nc.div_ceil(nr) * nr * kc);
        for (q, panel) in self.dst.chunks_exact_mut(nr * kc).take(nc.div_ceil(nr)).enumerate() {
            // SAFETY: `pack_b`'s contract; panel q covers columns j0 + q·nr .. + cols of the
            // checked view.
            unsafe { pack_b_panel(s, nr, b, p0, kc, j0 + q * nr, nr.min(nc - q * nr), panel) };
        }
    }
}

/// Packs one B micro-panel: `B[p0 .. p0+kc, j .. j+cols]`, zero-padded to `nr` columns.
///
/// # Safety
///
/// As [`pack_b`], for columns `j .. j + cols` with `cols ≤ nr`, and `panel.len() == nr·kc`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_b_panel<S: Simd, T: SimdElement>(
    s: S,
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
    if cs == 1 && cols == nr && !is_f32::<T>() {
        // Row-major half B: each step is NR contiguous values, widened as vectors.
        for (p, out) in panel.chunks_exact_mut(nr).enumerate() {
            unsafe { widen_run(s, src.add(base + p * rs), out) };
        }
    } else if rs == 1 && cols == nr && !is_f32::<T>() && matches!(nr, 16 | 32) {
        // Column-major / transposed half B: each column widened as vectors, then transposed.
        unsafe {
            match nr {
                16 => widen_lines::<S, T, 16>(s, panel, src, base, cs),
                _ => widen_lines::<S, T, 32>(s, panel, src, base, cs),
            }
        }
    } else if cs == 1 && cols == nr {
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
    } else if is_f32::<T>() && rs == 1 && cols == nr && nr.is_multiple_of(S::LANES) {
        // Transposed f32 B (e.g. Kᵀ from a row-major K), full panel: `LANES × LANES` blocks
        // transposed in registers. On Zen 4 at 256 × 512 × 64 Bᵀ the 6 × 64 tile's panels
        // had taken the element-wise scatter below (0.90× the time with this), the AVX2 6 × 16
        // tile's the line gather (0.96×; perf journal, 2026-12-06 05:34).
        unsafe { transpose_panel(s, panel, src.cast(), base, cs, kc) };
    } else if cols == nr && matches!(nr, 16 | 32) {
        // General-stride B (neither stride 1; a transposed half B is widened above), full
        // panel: NR column streams, one fixed-size store per step.
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

/// `panel[p·nr + j] = src[base + j·line + p]` for `p < kc`, `j < nr` (`nr = panel.len() / kc`,
/// a multiple of `LANES`): the transposing copy of `nr` contiguous lines (B's columns), in
/// `LANES × LANES` blocks, the last `kc mod LANES` steps element by element.
///
/// # Safety
///
/// Every `src + base + j·line + p` above is readable.
#[inline(always)]
unsafe fn transpose_panel<S: Simd>(
    s: S,
    panel: &mut [f32],
    src: *const f32,
    base: usize,
    line: usize,
    kc: usize,
) {
    let (l, nr) = (S::LANES, panel.len() / kc.max(1));
    debug_assert!(nr.is_multiple_of(l) && panel.len() == nr * kc);
    let full = kc / l * l;
    for g in (0..nr).step_by(l) {
        for p0 in (0..full).step_by(l) {
            // SAFETY: lines g..g + l, steps p0..p0 + l are readable (the caller); the rows
            // p0..p0 + l, columns g..g + l of the panel are inside it (p0 + l ≤ kc, g + l ≤ nr).
            unsafe {
                s.transpose(
                    src.add(base + g * line + p0),
                    line,
                    panel[p0 * nr + g..].as_mut_ptr(),
                    nr,
                )
            };
        }
        for p in full..kc {
            for (j, x) in panel[p * nr + g..][..l].iter_mut().enumerate() {
                // SAFETY: as above.
                *x = unsafe { *src.add(base + (g + j) * line + p) };
            }
        }
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

/// True when `T` is f32 (the only 4-byte element type): its packing is a plain copy, which the
/// scalar paths do as well as vectors; the half types take the vector widening paths.
#[inline(always)]
const fn is_f32<T: SimdElement>() -> bool {
    core::mem::size_of::<T>() == 4
}

/// `dst[q] = src[q]` widened to f32 for `q < dst.len()`: whole vectors, then one tail.
///
/// # Safety
///
/// `src .. src + dst.len()` is readable.
#[inline(always)]
pub(crate) unsafe fn widen_run<S: Simd, T: SimdElement>(s: S, src: *const T, dst: &mut [f32]) {
    let (n, l) = (dst.len(), S::LANES);
    let mut q = 0;
    // SAFETY (all reads): q + LANES ≤ n, or the tail's n − q elements, are inside the run.
    while q + l <= n {
        crate::arch::store(s, &mut dst[q..], unsafe { T::load(s, src.add(q)) });
        q += l;
    }
    if q < n {
        crate::arch::store_tail(s, &mut dst[q..], unsafe { T::load_tail(s, src.add(q), n - q) });
    }
}

/// The widening transposing gather of `N` contiguous lines: `dst[p·N + i] = src[base + i·line +
/// p]` for `p < dst.len() / N`, `i < N`. Each line is widened `LANES` steps at a time with
/// vector loads into a stack tile, which is then transposed into the panel with f32 moves (the
/// same moves an f32 gather makes), so the conversion costs vector instructions only. Packs the
/// column-major half-precision B panels (`N = NR`).
///
/// # Safety
///
/// `src + base + i·line .. + dst.len() / N` is readable for every `i < N`.
#[inline(always)]
unsafe fn widen_lines<S: Simd, T: SimdElement, const N: usize>(
    s: S,
    dst: &mut [f32],
    src: *const T,
    base: usize,
    line: usize,
) {
    let (kc, l) = (dst.len() / N, S::LANES);
    debug_assert!(l <= MAX_LANES);
    let mut tile = [[0.0f32; MAX_LANES]; N];
    let mut p = 0;
    while p < kc {
        let w = l.min(kc - p);
        for (i, t) in tile.iter_mut().enumerate() {
            // SAFETY: steps p .. p + w of line i are readable (the caller).
            unsafe { widen_run(s, src.add(base + i * line + p), &mut t[..w]) };
        }
        for q in 0..w {
            let out = &mut dst[(p + q) * N..(p + q + 1) * N];
            for (o, t) in out.iter_mut().zip(tile.iter()) {
                *o = t[q];
            }
        }
        p += w;
    }
}

/// Widens `A[i0 .. i0+mc, p0 .. p0+kc]` into `dst` in A's own orientation, for the micro-kernels
/// to read in place like an f32 A (no transposition: every row, or every column, is one vector
/// run). Returns the strides `(rs, cs)` of the block in `dst`: `(kc, 1)` when A's column stride
/// is 1, else `(1, mc)`.
///
/// # Safety
///
/// `a`'s view fits its slice, `i0 + mc ≤ rows`, `p0 + kc ≤ cols`, A has a unit row or column
/// stride, and `dst.len() ≥ mc·kc`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn widen_a<T: SimdElement>(
    isa: Isa,
    a: &MatRef<'_, T>,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    dst: &mut [f32],
) -> (usize, usize) {
    vectorize(isa, WidenA { a, i0, mc, p0, kc, dst })
}

/// [`widen_a`]'s arguments as a [`Kernel`]; built only by `widen_a`.
struct WidenA<'a, 'b, T> {
    a: &'a MatRef<'b, T>,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    dst: &'a mut [f32],
}

impl<T: SimdElement> Kernel for WidenA<'_, '_, T> {
    type Output = (usize, usize);
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> (usize, usize) {
        let (a, i0, mc, p0, kc) = (self.a, self.i0, self.mc, self.p0, self.kc);
        let l = a.layout;
        debug_assert!(a.check("a").is_ok() && i0 + mc <= l.rows && p0 + kc <= l.cols);
        debug_assert!(l.col_stride == 1 || l.row_stride == 1);
        let src = a.data.as_ptr();
        let (lines, len, step, strides) = if l.col_stride == 1 {
            (mc, kc, l.row_stride, (kc, 1))
        } else {
            (kc, mc, l.col_stride, (1, mc))
        };
        let base = l.index(i0, p0);
        for (x, out) in self.dst.chunks_exact_mut(len).take(lines).enumerate() {
            // SAFETY (`widen_a`'s contract): line x (a row or a column of the block) is `len`
            // contiguous elements of the checked view.
            unsafe { widen_run(s, src.add(base + x * step), out) };
        }
        strides
    }
}

/// Packs `A[i0 .. i0+mc, p0 .. p0+kc]` for the `vdpbf16ps` kernel: `MR`-row micro-panels of
/// bf16 pairs, `kp = ceil(kc/2)` pairs deep; panel `r`, pair `q`, row `i` at word
/// `(r·kp + q)·MR + i`, holding `A[i, 2q]` in its low half and `A[i, 2q+1]` in its high half
/// ([`SimdElement::bf16_bits`]). Rows past `mc` and the high half of an odd depth's last pair
/// are +0.
///
/// # Safety
///
/// As [`pack_a`], with `dst.len() ≥ ceil(mc/mr)·mr·kp`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pack_a_pairs<T: SimdElement>(
    mr: usize,
    a: &MatRef<'_, T>,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    dst: &mut [f32],
) {
    let l = a.layout;
    let kp = kc.div_ceil(2);
    debug_assert!(a.check("a").is_ok() && i0 + mc <= l.rows && p0 + kc <= l.cols);
    debug_assert!(dst.len() >= mc.div_ceil(mr) * mr * kp);
    let (src, rs, cs) = (a.data.as_ptr(), l.row_stride, l.col_stride);
    for (r, panel) in dst.chunks_exact_mut(mr * kp).take(mc.div_ceil(mr)).enumerate() {
        let rows = mr.min(mc - r * mr);
        let base = l.index(i0 + r * mr, p0);
        // SAFETY: rows i < rows, steps p < kc of the panel are inside the checked view.
        unsafe {
            match mr {
                12 if rows == 12 => pack_pairs(panel, 12, 12, src, base, rs, cs, kc),
                _ => pack_pairs(panel, mr, rows, src, base, rs, cs, kc),
            }
        }
    }
}

/// Packs `B[p0 .. p0+kc, j0 .. j0+nc]` for the `vdpbf16ps` kernel: `NR`-column micro-panels
/// of bf16 pairs; panel `s`, pair `q`, column `j` at word `(s·kp + q)·NR + j`, holding
/// `B[2q, j]` low and `B[2q+1, j]` high. Columns past `nc` and an odd depth's last high half
/// are +0.
///
/// # Safety
///
/// As [`pack_b`], with `dst.len() ≥ ceil(nc/nr)·nr·kp`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pack_b_pairs<T: SimdElement>(
    nr: usize,
    b: &MatRef<'_, T>,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    dst: &mut [f32],
) {
    let l = b.layout;
    let kp = kc.div_ceil(2);
    debug_assert!(b.check("b").is_ok() && p0 + kc <= l.rows && j0 + nc <= l.cols);
    debug_assert!(dst.len() >= nc.div_ceil(nr) * nr * kp);
    let (src, rs, cs) = (b.data.as_ptr(), l.row_stride, l.col_stride);
    for (q, panel) in dst.chunks_exact_mut(nr * kp).take(nc.div_ceil(nr)).enumerate() {
        let cols = nr.min(nc - q * nr);
        let base = l.index(p0, j0 + q * nr);
        // SAFETY: columns j < cols, steps p < kc of the panel are inside the checked view.
        unsafe {
            match nr {
                32 if cols == 32 => pack_pairs(panel, 32, 32, src, base, cs, rs, kc),
                _ => pack_pairs(panel, nr, cols, src, base, cs, rs, kc),
            }
        }
    }
}

/// One micro-panel of bf16 pairs: `lines ≤ n` lines (A's rows or B's columns) starting at
/// `src + base`, `line` apart, each `kc` steps of `step`; word `q·n + i` is
/// `x_i[2q] | x_i[2q+1] << 16`, +0 where the line or the step does not exist. Inlined with
/// constant `n`, `lines` for full panels, so the line loop unrolls.
///
/// # Safety
///
/// `src + base + i·line + p·step` is readable for `i < lines`, `p < kc`;
/// `panel.len() == n·ceil(kc/2)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_pairs<T: SimdElement>(
    panel: &mut [f32],
    n: usize,
    lines: usize,
    src: *const T,
    base: usize,
    line: usize,
    step: usize,
    kc: usize,
) {
    debug_assert!(lines <= n && panel.len() == n * kc.div_ceil(2));
    // SAFETY: u32 and f32 have the same size and alignment and every bit pattern is valid for
    // both; the words are plain bits here (no f32 arithmetic ever touches them).
    let words: &mut [u32] =
        unsafe { core::slice::from_raw_parts_mut(panel.as_mut_ptr().cast(), panel.len()) };
    if lines < n {
        words.fill(0);
    }
    for (q, out) in words.chunks_exact_mut(n).enumerate() {
        let p = base + 2 * q * step;
        let has_hi = 2 * q + 1 < kc;
        for (i, o) in out[..lines].iter_mut().enumerate() {
            // SAFETY: steps 2q and (if it exists) 2q + 1 of line i are readable (the caller).
            let (lo, hi) = unsafe {
                let e = src.add(p + i * line);
                let lo = u32::from((*e).bf16_bits());
                let hi = if has_hi { u32::from((*e.add(step)).bf16_bits()) } else { 0 };
                (lo, hi)
            };
            *o = lo | hi << 16;
        }
    }
}
