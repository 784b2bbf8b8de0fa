//! Cache-blocked SGEMM: `C ← α·A·B + β·C` on strided views, Goto/BLIS style.
//!
//! Where things live:
//! - [`blocking`]: KC / MC / NC, derived from the detected cache sizes, and the path thresholds;
//! - `loops`: the five-loop nest and the split between threads;
//! - `pack`: packing A into MR-row and B into NR-column micro-panels, reusable aligned buffers;
//! - `ukernel`: the micro-kernel contract, one generic register-blocked body, its per-ISA
//!   instances (`sgemm_6x64_avx512`, `sgemm_6x16_avx2`, `sgemm_4x16_portable`, each with a
//!   strided-A and partial-row variants) and the macro-kernel with its bounce-tile edge path.
//!
//! The flash attention kernels run their block products on `ukernel`'s macro-kernel directly
//! (K and V as the in-place A operand, the query tile and probability block as one packed B
//! micro-panel each), not through the entry points below, with the ISA's kernel whose `NR` is
//! two vectors (on AVX-512 `sgemm_12x32_avx512`, the same body in a taller, narrower tile).
//!
//! A is packed into MR-row micro-panels, except when it is row-major (unit column stride), or
//! column-major and C is at most [`blocking::DIRECT_A_COL_MAJOR_MAX_PANELS`] micro-panels wide:
//! then packing (a full pass over A per NC block) would cost more than the micro-kernels save,
//! and they read A in place (a bf16 / f16 A is first widened, block by block, into an f32 copy
//! of the same orientation: vector runs, no transposition).
//!
//! # Public API
//!
//! - [`sgemm`] (ISA from [`arch::selected`]) and [`sgemm_with_isa`];
//! - [`gemm`] / [`gemm_with_isa`]: A and B of f32, bf16 or f16 (each its own), C of f32; the
//!   half-precision operands are widened while packed, the micro-kernels are the f32 ones;
//! - [`gemm_with_path`]: the same with an explicit [`HalfPath`]: bf16 × bf16 on the
//!   AVX512_BF16 `vdpbf16ps` micro-kernel ([`HalfPath::Dot`], where [`bf16_dot_available`]),
//!   or widened to f32 (every ISA);
//! - [`PackedB`] + [`sgemm_packed_b`]: pack B once, multiply by many A.
//!
//! Semantics (all entry points): `A: m×k`, `B: k×n`, `C: m×n`, any row / column strides and
//! offsets (a transposed or column-major operand is just another [`MatLayout`]; nothing is
//! copied except into the packing buffers). `β = 0` means C is not read: a NaN already in C does
//! not reach the result. `α = 0` or `k = 0` means `A·B` is not computed, as in BLAS: `C ← β·C`
//! (NaN or ∞ in A or B then do not matter). α and β must be finite. Nothing outside C's view
//! is written, nothing outside the three views is read. Errors are the reference's
//! (`attn_reference::matmul::matmul`): [`Error::ShapeMismatch`] naming `b` rows / `c`
//! rows / cols, [`Error::OutOfBounds`], [`Error::IndexOverflow`], [`Error::AliasedOutput`],
//! [`Error::NonFinite`] for α / β, and `InvalidParameter { arg: "isa" }` for an ISA this CPU
//! lacks.
//!
//! Accuracy: every `c_ij` is an f32 dot product accumulated in k order with one FMA per term
//! (two roundings per term for the portable kernel when built without FMA), so
//! `|ĉ − c| ≤ γ·k·u·(|α|·(|A||B|)_ij + |β|·|c_ij|)`, `u = 2⁻²⁴`, small γ (C is rounded once
//! more per KC-deep block when `k > KC`). Results do not depend on the [`Parallelism`]: threaded
//! runs are bitwise equal to sequential ones. They may differ in the last bits between machines
//! whose caches give another KC, as they do between ISAs.
//!
//! The `vdpbf16ps` path ([`HalfPath::Dot`]) forms each pair of bf16 products exactly and adds
//! them to the f32 accumulator one at a time, each addition rounded to nearest even: one
//! rounding per term, the bound above. But the instruction ignores MXCSR and flushes: bf16
//! inputs below [`BF16_DOT_FLUSH`] (`2⁻¹²⁶`) count as zero (a dropped term `|a·b| < 2⁻¹²⁶·|b|`)
//! and every accumulation whose result falls below it gives zero (off by less than `2⁻¹²⁶`,
//! at most `k + 1` of them), so its bound is
//! `γ·(k + 3)·u·(|α|·(|A||B|)_ij + |β c_ij|) + |α|·2⁻¹²⁶·(k + 1 + Σ_p (|a_ip| + |b_pj|))`
//! (derivation beside the kernel, `ukernel/avx512_bf16.rs`).

pub mod blocking;
mod loops;
pub(crate) mod pack;
pub(crate) mod ukernel;

use attn_core::error::{expect_dim, expect_finite};
use attn_core::{DType, Error, MatLayout, MatMut, MatRef, Result};

use crate::arch::convert::Convertible;
use crate::arch::{self, Isa};
use crate::par::Parallelism;

use blocking::Blocking;
use loops::{ASrc, BSrc, CPtr, Problem};
use pack::AlignedBuf;
use ukernel::{kernel_for, Kernel};

/// `C ← α·A·B + β·C` with the ISA from [`arch::selected`]; see the
/// [module docs](self) for the semantics, accuracy and errors.
///
/// ```
/// use attn_kernels::{gemm::sgemm, MatLayout, Parallelism};
/// use attn_kernels::{MatMut, MatRef};
/// let a = [1.0, 2.0, 3.0, 4.0]; // 2×2 row-major
/// let b = [5.0, 6.0, 7.0, 8.0];
/// let mut c = [0.0; 4];
/// sgemm(1.0, MatRef::row_major(&a, 2, 2), MatRef::row_major(&b, 2, 2), 0.0,
///       MatMut::new(&mut c, MatLayout::row_major(2, 2)), Parallelism::Sequential).unwrap();
/// assert_eq!(c, [19.0, 22.0, 43.0, 50.0]);
/// ```
pub fn sgemm(
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: MatMut<'_>,
    par: Parallelism,
) -> Result<()> {
    sgemm_with_isa(arch::selected(), alpha, a, b, beta, c, par)
}

/// [`sgemm`] with an explicit ISA (an error if this CPU lacks it), so every kernel can be
/// tested and benchmarked on one machine.
pub fn sgemm_with_isa(
    isa: Isa,
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: MatMut<'_>,
    par: Parallelism,
) -> Result<()> {
    gemm_with_isa(isa, alpha, a, b, beta, c, par)
}

/// `C ← α·A·B + β·C` with A and B each of f32, bf16 or f16 and C of f32, with the ISA from
/// [`arch::selected`]. Half-precision operands are widened to their exact f32 values while
/// they are packed and the f32 micro-kernels run on them, so the semantics, errors and the
/// accuracy bound are [`sgemm`]'s, with A and B the exact values the operands represent.
pub fn gemm<TA: Convertible, TB: Convertible>(
    alpha: f32,
    a: MatRef<'_, TA>,
    b: MatRef<'_, TB>,
    beta: f32,
    c: MatMut<'_>,
    par: Parallelism,
) -> Result<()> {
    gemm_with_isa(arch::selected(), alpha, a, b, beta, c, par)
}

/// [`gemm`] with an explicit ISA (an error if this CPU lacks it), on the [`HalfPath::Auto`]
/// path.
pub fn gemm_with_isa<TA: Convertible, TB: Convertible>(
    isa: Isa,
    alpha: f32,
    a: MatRef<'_, TA>,
    b: MatRef<'_, TB>,
    beta: f32,
    c: MatMut<'_>,
    par: Parallelism,
) -> Result<()> {
    gemm_with_path(isa, HalfPath::Auto, alpha, a, b, beta, c, par)
}

/// Which micro-kernel a GEMM with half-precision operands runs on; also how the flash
/// attention path multiplies bf16 operands ([`Attention::half_path`](crate::attention::Attention::half_path)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HalfPath {
    /// [`Widen`](Self::Widen), today: on the AVX512_BF16 machine this was measured on (a
    /// Sapphire-Rapids-class Xeon VM), `vdpbf16ps` issued about one per 1 ns against two
    /// FMAs per 0.3 ns, so its two multiply-adds per lane lost about 3.5× to widening plus
    /// FMA (see the README). On an AMD Zen 4 it ran 1.7× our f32 GEMM at 512³ and 1024³
    /// (2026-12-03): [`Dot`](Self::Dot) stays available by name for CPUs where it pays, and
    /// choosing it here by CPU is open (its error bound has a flush term the widening lacks).
    Auto,
    /// Widen every operand to f32 while packing and run the ISA's f32 micro-kernel: any ISA,
    /// any element types, the accuracy of [`sgemm`] on the exact values.
    Widen,
    /// The `vdpbf16ps` micro-kernel (AVX512_BF16; bf16 A and B only): two multiply-adds per
    /// f32 lane and instruction, f32 accumulation; the f32 bound plus a flush term for
    /// subnormals (see the [module docs](self)). An `InvalidParameter { arg: "path" }` error
    /// where it is not available.
    Dot,
}

/// The flush threshold of the [`HalfPath::Dot`] kernel, `2⁻¹²⁶` (the smallest normal f32):
/// `vdpbf16ps` treats bf16 inputs below it as zero and flushes results below it to zero, which
/// adds `|α|·F·(k + 1 + Σ_p (|a_ip| + |b_pj|))` to the error bound of element `(i, j)` (see the
/// [module docs](self)).
pub const BF16_DOT_FLUSH: f32 = f32::MIN_POSITIVE;

/// True when this CPU has the `vdpbf16ps` GEMM kernel (AVX-512F and AVX512_BF16): the
/// condition, with the `avx512` ISA and bf16 operands, for [`HalfPath::Dot`].
pub fn bf16_dot_available() -> bool {
    ukernel::bf16_dot_kernel().is_some()
}

/// [`gemm_with_isa`] with an explicit [`HalfPath`], so each path can be tested and benchmarked
/// on one machine. Errors: those of [`sgemm`], then `InvalidParameter { arg: "path" }` for
/// [`HalfPath::Dot`] unless `isa` is [`Isa::Avx512`], this CPU has AVX512_BF16 and A and B
/// are both bf16.
#[allow(clippy::too_many_arguments)]
pub fn gemm_with_path<TA: Convertible, TB: Convertible>(
    isa: Isa,
    path: HalfPath,
    alpha: f32,
    a: MatRef<'_, TA>,
    b: MatRef<'_, TB>,
    beta: f32,
    c: MatMut<'_>,
    par: Parallelism,
) -> Result<()> {
    let k = a.layout.cols;
    check_args(alpha, &a, k, b.layout.rows, Some(&b), beta, &c, b.layout.cols)?;
    let isa = isa.require()?;
    let dot = match ukernel::bf16_dot_kernel() {
        Some(kern)
            if isa == Isa::Avx512 && TA::DTYPE == DType::BF16 && TB::DTYPE == DType::BF16 =>
        {
            Some(kern)
        }
        _ => None,
    };
    let kern = match (path, dot) {
        (HalfPath::Dot, Some(kern)) => kern,
        (HalfPath::Dot, None) => {
            return Err(Error::InvalidParameter {
                arg: "path",
                requirement: "the vdpbf16ps path needs the avx512 ISA, a CPU with AVX512_BF16, \
                              and bf16 A and B",
            })
        }
        _ => kernel_for(isa),
    };
    let (m, n) = (c.layout.rows, c.layout.cols);
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 || alpha == 0.0 {
        scale(beta, c);
        return Ok(());
    }
    // SAFETY: the view was checked against the slice; `offset` is in bounds (m, n > 0).
    let ptr = unsafe { c.data.as_mut_ptr().add(c.layout.offset) };
    // The micro-kernels store rows of C with vector stores: a column-major C is handled as
    // Cᵀ = Bᵀ·Aᵀ, which is the same problem with every view transposed.
    let transpose = c.layout.col_stride != 1 && c.layout.row_stride == 1;
    // SAFETY (both arms): views checked above, shapes consistent, C injective and exclusively
    // borrowed, `ptr` its element (0, 0).
    unsafe {
        if transpose {
            let (at, bt) = (b.layout.transposed(), a.layout.transposed());
            launch(
                kern,
                alpha,
                MatRef::new(b.data, at),
                MatRef::new(a.data, bt),
                beta,
                c.layout.transposed(),
                ptr,
                k,
                par,
            )
        } else {
            launch(kern, alpha, a, b, beta, c.layout, ptr, k, par)
        }
    }
    Ok(())
}

/// Runs the loop nest on checked operands, C given by its layout `cl` and the address `ptr` of
/// its element (0, 0).
///
/// # Safety
///
/// `a` (`m × k`) and `b` (`k × n`) passed their checks; `ptr` addresses an injective `m × n`
/// view with `cl`'s strides, valid for reads and writes that nobody else touches; `m, n, k > 0`.
#[allow(clippy::too_many_arguments)]
unsafe fn launch<TA: Convertible, TB: Convertible>(
    kern: &'static Kernel,
    alpha: f32,
    a: MatRef<'_, TA>,
    b: MatRef<'_, TB>,
    beta: f32,
    cl: MatLayout,
    ptr: *mut f32,
    k: usize,
    par: Parallelism,
) {
    let pb = Problem {
        kern,
        bl: blocking::for_kernel(kern.mr, kern.nr),
        m: cl.rows,
        n: cl.cols,
        k,
        alpha,
        beta,
        // The pair kernel packs A into pairs; it never reads A in place.
        a: if kern.pairs { ASrc::View(a) } else { a_source(a, cl.cols, kern.nr) },
        b: BSrc::View(b),
        c: CPtr { ptr, rs: cl.row_stride, cs: cl.col_stride },
    };
    // SAFETY: forwarded.
    unsafe { loops::run(&pb, par) };
}

/// `C ← α·A·B + β·C` with B pre-packed (see [`PackedB`]); same semantics and errors as
/// [`sgemm`] (B's shape is checked against A and C; `b` errors name its rows). Runs the kernel
/// B was packed with. A column-major C works but goes through the bounce-tile path (the
/// transposition trick of [`sgemm`] is not available with B fixed on the right).
pub fn sgemm_packed_b(
    alpha: f32,
    a: MatRef<'_>,
    b: &PackedB,
    beta: f32,
    c: MatMut<'_>,
    par: Parallelism,
) -> Result<()> {
    let k = a.layout.cols;
    check_args::<f32, f32>(alpha, &a, k, b.p.k, None, beta, &c, b.p.n)?;
    let (m, n) = (c.layout.rows, c.layout.cols);
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 || alpha == 0.0 {
        scale(beta, c);
        return Ok(());
    }
    let cl = c.layout;
    let pb = Problem {
        kern: b.p.kern,
        bl: b.p.bl,
        m,
        n,
        k,
        alpha,
        beta,
        a: a_source(a, n, b.p.kern.nr),
        b: BSrc::<f32>::Packed(&b.p),
        // SAFETY: as in `sgemm_with_isa`.
        c: CPtr {
            ptr: unsafe { c.data.as_mut_ptr().add(cl.offset) },
            rs: cl.row_stride,
            cs: cl.col_stride,
        },
    };
    // SAFETY: A and C checked; B packed by `b.p.kern` with shape k × n.
    unsafe { loops::run(&pb, par) };
    Ok(())
}

/// A `k × n` B operand packed once into the NR-column micro-panels of one ISA's kernel, to be
/// multiplied by many A operands with [`sgemm_packed_b`] (e.g. a weight matrix reused across
/// calls). [`pack`](Self::pack) repacks into the same storage.
pub struct PackedB {
    p: PackedPanels,
}

impl PackedB {
    /// Packs `b` (f32, bf16 or f16, widened to f32) for the ISA of [`arch::selected`].
    pub fn new<T: Convertible>(b: MatRef<'_, T>) -> Result<Self> {
        Self::with_isa(arch::selected(), b)
    }

    /// Packs `b` for `isa` (an error if this CPU lacks it, or if `b`'s view overruns its slice).
    pub fn with_isa<T: Convertible>(isa: Isa, b: MatRef<'_, T>) -> Result<Self> {
        let mut p = Self::empty(isa)?;
        p.pack(b)?;
        Ok(p)
    }

    /// An empty (`0 × 0`) packed operand for `isa` (an error if this CPU lacks it), to be
    /// filled by [`pack`](Self::pack).
    pub fn empty(isa: Isa) -> Result<Self> {
        let kern = kernel_for(isa.require()?);
        Ok(Self { p: PackedPanels::empty(kern) })
    }

    /// Repacks from `b` (any shape and strides; f32, bf16 or f16), reusing the storage.
    pub fn pack<T: Convertible>(&mut self, b: MatRef<'_, T>) -> Result<()> {
        b.check("b")?;
        self.p.pack(b, "b")
    }

    /// Rows (k).
    pub fn rows(&self) -> usize {
        self.p.k
    }

    /// Columns (n).
    pub fn cols(&self) -> usize {
        self.p.n
    }

    /// The ISA whose kernel it was packed for.
    pub fn isa(&self) -> Isa {
        self.p.kern.isa
    }
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedB")
            .field("rows", &self.p.k)
            .field("cols", &self.p.n)
            .field("kernel", &self.p.kern.name)
            .finish()
    }
}

/// A whole B operand packed block by block: for the k-block starting at `p0` (depth `kc`), the
/// NR-column micro-panels of all `n` columns start at `p0 · n_padded`, panel `s` at
/// `+ s · NR · kc`, exactly the layout `pack_b` produces for one block.
pub(crate) struct PackedPanels {
    kern: &'static Kernel,
    /// The blocking it was packed with: the loop nest must use the same KC (and NC, a multiple
    /// of NR, so its column blocks start on panel boundaries).
    bl: Blocking,
    /// Rows (depth).
    k: usize,
    /// Columns.
    n: usize,
    buf: AlignedBuf,
}

impl PackedPanels {
    fn empty(kern: &'static Kernel) -> Self {
        let bl = blocking::for_kernel(kern.mr, kern.nr);
        PackedPanels { kern, bl, k: 0, n: 0, buf: AlignedBuf::default() }
    }

    /// `n` rounded up to whole panels (fits: `pack` checked `padded · k` for the stored shape,
    /// and an empty shape has `padded · k = 0` with both factors from a `usize`).
    fn padded(&self) -> usize {
        self.n.div_ceil(self.kern.nr) * self.kern.nr
    }

    /// Packs a checked `k × n` view. A view may have any dimensions (zero strides repeat
    /// elements), so the packed size is computed with checked arithmetic and allocated
    /// fallibly: a size that overflows or cannot be allocated is `InvalidParameter` naming
    /// `arg`, and leaves the operand as it was.
    fn pack<T: Convertible>(&mut self, x: MatRef<'_, T>, arg: &'static str) -> Result<()> {
        let (k, n) = (x.layout.rows, x.layout.cols);
        let (nr, kc_max) = (self.kern.nr, self.bl.kc);
        let too_big = Error::InvalidParameter {
            arg,
            requirement: "the sizes imply a scratch buffer that cannot be allocated",
        };
        let padded = n.div_ceil(nr).checked_mul(nr).ok_or(too_big.clone())?;
        let len = padded.checked_mul(k).ok_or(too_big.clone())?;
        if !self.buf.try_grow(len) {
            return Err(too_big);
        }
        self.k = k;
        self.n = n;
        if len == 0 {
            // No column (or no row): nothing to pack, however many k-blocks `k` would make.
            return Ok(());
        }
        let dst = self.buf.get(len);
        for p0 in (0..k).step_by(kc_max) {
            let kc = kc_max.min(k - p0);
            let block = &mut dst[p0 * padded..(p0 + kc) * padded];
            // SAFETY: the caller checked the view; the block is inside it; `block` holds
            // `padded · kc` elements.
            unsafe { pack::pack_b(self.kern.isa, nr, &x, p0, kc, 0, n, block) };
        }
        Ok(())
    }

    /// The packed panels of k-block `(p0, kc)` from column `j0` (a multiple of NR) on, `len`
    /// of them.
    fn block(&self, p0: usize, kc: usize, j0: usize, len: usize) -> &[f32] {
        let nr = self.kern.nr;
        debug_assert!(j0.is_multiple_of(nr) && j0 + len <= self.n && p0 + kc <= self.k);
        let padded = self.padded();
        let all = self.buf.view(padded * self.k);
        let start = p0 * padded + j0 * kc;
        &all[start..start + len.div_ceil(nr) * nr * kc]
    }
}

/// Packs A unless reading it in place is cheaper. A row-major A (unit column stride) is read in
/// place: each micro-panel is `MR` contiguous streams that stay in L1 while the macro-kernel
/// sweeps a B block past them. A column-major A (unit row stride) is read in place only while
/// C is at most [`blocking::DIRECT_A_COL_MAJOR_MAX_PANELS`] micro-panels wide: each of its
/// steps is a cache line of its own, which need not stay in L1 for a longer sweep. Any other A
/// is packed.
/// A half-precision A read in place is widened block by block into an f32 copy of the same
/// orientation (vector runs, no transposition), which the micro-kernels then read in place.
fn a_source<T: Convertible>(a: MatRef<'_, T>, n: usize, nr: usize) -> ASrc<'_, T> {
    let rows = a.layout.col_stride == 1;
    let narrow_cols =
        a.layout.row_stride == 1 && n.div_ceil(nr) <= blocking::DIRECT_A_COL_MAJOR_MAX_PANELS;
    if !rows && !narrow_cols {
        return ASrc::View(a);
    }
    match T::as_f32(a.data) {
        Some(data) => ASrc::Direct(MatRef::new(data, a.layout)),
        None => ASrc::Widen(a),
    }
}

/// Argument checks shared by the entry points, in the reference's order (`b` is `None` when
/// it is pre-packed, hence already checked).
#[allow(clippy::too_many_arguments)]
fn check_args<TA: Copy, TB: Copy>(
    alpha: f32,
    a: &MatRef<'_, TA>,
    k: usize,
    b_rows: usize,
    b: Option<&MatRef<'_, TB>>,
    beta: f32,
    c: &MatMut<'_>,
    n: usize,
) -> Result<()> {
    expect_finite("alpha", alpha)?;
    expect_finite("beta", beta)?;
    expect_dim("b", "rows", k, b_rows)?;
    c.layout.expect_shape("c", a.layout.rows, n)?;
    a.check("a")?;
    if let Some(b) = b {
        b.check("b")?;
    }
    c.check("c")
}

/// `C ← β·C`, writing zeros without reading C when β = 0.
fn scale(beta: f32, c: MatMut<'_>) {
    let l: MatLayout = c.layout;
    for i in 0..l.rows {
        for j in 0..l.cols {
            let x = &mut c.data[l.index(i, j)];
            *x = if beta == 0.0 { 0.0 } else { beta * *x };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16;

    /// The rule of [`a_source`] for every tile width: a row-major A in place at any width; a
    /// column-major one in place up to its edge, `DIRECT_A_COL_MAJOR_MAX_PANELS·NR` columns,
    /// and packed one column past it; an A with neither stride 1 always packed. f32 A is read
    /// `Direct`, half-precision A `Widen`ed.
    #[test]
    fn a_is_read_in_place_by_its_layout_and_width() {
        fn kind<T>(a: ASrc<'_, T>) -> &'static str {
            match a {
                ASrc::View(_) => "packed",
                ASrc::Direct(_) => "direct",
                ASrc::Widen(_) => "widened",
            }
        }
        let (f, h) = (vec![0.0f32; 12], vec![bf16::ZERO; 12]);
        let rows = MatLayout::row_major(3, 4);
        let cols = MatLayout { rows: 3, cols: 4, row_stride: 1, col_stride: 3, offset: 0 };
        let general = MatLayout { rows: 2, cols: 2, row_stride: 6, col_stride: 2, offset: 0 };
        for nr in [16, 32, 64] {
            // Two micro-panels, as measured (blocking.rs), written out so that the test fails
            // if the constant changes without it.
            let edge = 2 * nr;
            for n in [1, edge, edge + 1, 64 * nr] {
                assert_eq!(kind(a_source(MatRef::new(&f, rows), n, nr)), "direct", "{nr} {n}");
                assert_eq!(kind(a_source(MatRef::new(&h, rows), n, nr)), "widened", "{nr} {n}");
                assert_eq!(kind(a_source(MatRef::new(&f, general), n, nr)), "packed");
                assert_eq!(kind(a_source(MatRef::new(&h, general), n, nr)), "packed");
            }
            assert_eq!(kind(a_source(MatRef::new(&f, cols), edge, nr)), "direct", "{nr}");
            assert_eq!(kind(a_source(MatRef::new(&f, cols), edge + 1, nr)), "packed");
            assert_eq!(kind(a_source(MatRef::new(&h, cols), edge, nr)), "widened", "{nr}");
            assert_eq!(kind(a_source(MatRef::new(&h, cols), edge + 1, nr)), "packed");
        }
    }
}
