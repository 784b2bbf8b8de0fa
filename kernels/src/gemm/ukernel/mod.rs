//! Register-blocked SGEMM micro-kernels, one or two tile shapes per ISA, all instances of one
//! generic body, and the macro-kernel that sweeps them over a packed A block and a packed B
//! block.
//!
//! # Micro-kernel contract
//!
//! A micro-kernel `sgemm_{MR}x{NR}_{isa}` computes one `MR × NR` tile
//!
//! ```text
//! C[0..MR, 0..NR] ← α · Ã · B̃ + β · C        (β = 0: C is not read)
//! ```
//!
//! where `Ã` is an A micro-panel (`kc` steps of `MR` contiguous values, the column `p` of the
//! `MR` rows at `a[p·MR .. p·MR + MR]`), `B̃` a B micro-panel (`kc` steps of `NR` contiguous
//! values, row `p` at `b[p·NR ..]`, 64-byte aligned), and C a row-major tile: element `(i, j)`
//! at `c[i·rs_c + j]`. The vectors run along N (`NR = NV · lanes`) and A is broadcast, so a
//! row-major C is stored with plain vector stores; the loop nest transposes the whole problem
//! when C is column-major. Each kernel shape has three instances of the one body
//! ([`define_kernels`]): the packed-A kernel, a `_strided_a` kernel reading A in place through
//! its strides (used for a row-major A, and for a column-major one while C is at most
//! [`DIRECT_A_COL_MAJOR_MAX_PANELS`](crate::gemm::blocking::DIRECT_A_COL_MAJOR_MAX_PANELS)
//! micro-panels wide), and `R < MR`-row kernels for the last one or two, partial row panels
//! (no wasted FMAs, nothing read past A's last row; with A read in place, a short tail is
//! shared with the panel before it, see [`macro_kernel`]).
//! Partial column panels and C views whose column stride is not 1 go through a bounce tile in
//! [`macro_kernel`], never through special cases in the hot loop; packed B panels are
//! zero-padded, so the padding lanes compute harmless zeros that are never stored.
//!
//! The update is `c = fma(acc, α, β·c)` (`c = acc·α` when β = 0) whatever the path (direct or
//! bounce), which is what makes the result independent of how the work is tiled or split
//! between threads: every element sees the same operations in the same order.

use crate::arch::{Isa, Simd};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_bf16;
mod portable;

/// Largest `MR · NR` of any kernel: the size of the stack bounce tile used for edges.
pub(crate) const MAX_TILE: usize = 16 * 64;

/// The one micro-kernel body: an `MR × (NV·LANES)` tile held in `MR·NV` vector registers.
///
/// ```text
///            B̃ row p:  [ b0 .. b(L-1) | bL .. b(2L-1) | ... ]   NV vector loads
///  Ã[p, 0] bcast  ->   acc[0][0]        acc[0][1]   ...
///  Ã[p, 1] bcast  ->   acc[1][0]        acc[1][1]   ...
///  ...                 (MR rows)
/// ```
///
/// With `PACKED_A`, Ã is a packed micro-panel (row `i` of step `p` at `a[p·MR + i]`, the
/// strides arguments are ignored); without, it is read in place from the caller's matrix, row
/// `i` of step `p` at `a[i·a_rs + p·a_cs]` (used when A has a unit stride and packing would
/// cost more than it saves).
///
/// `prefetch_c`: start fetching the C tile's lines (2·MR of them) before the `k` loop, so they
/// are in L1 when it ends (GEMM, whose C comes from memory). The flash block products' C tiles
/// (the score block, the output accumulator) are in cache already; there the prefetches cost
/// 1.5–2 % of an h8 d 64 call, likely the load slots they take from the loop (perf journal,
/// 2026-12-08).
///
/// # Safety
///
/// `a` valid for the `MR × k` reads just described, `b` for `k·NV·LANES` reads, `c` for reads
/// (unless β = 0) and writes of `c[i·rs_c + j]`, `i < MR`, `j < NV·LANES`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_body<
    S: Simd,
    St: Step<S>,
    const MR: usize,
    const NV: usize,
    const PACKED_A: bool,
>(
    s: S,
    k: usize,
    alpha: f32,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    prefetch_c: bool,
) {
    let nr = NV * S::LANES;
    let (a_rs, a_cs) = if PACKED_A { (1, MR) } else { (a_rs, a_cs) };
    // SAFETY (whole body): the caller guarantees the panel and tile extents stated above; every
    // offset below stays inside them.
    unsafe {
        // The first and last line of each row of C (all of a 32-column row; every line of a
        // 64-column row measured the same, perf journal 2026-12-04 11:30).
        if prefetch_c {
            for i in 0..MR {
                s.prefetch(c.add(i * rs_c));
                s.prefetch(c.add(i * rs_c + nr - 1));
            }
        }
        let mut acc = [[s.splat(0.0); NV]; MR];
        let mut a = a;
        let mut b = b;
        // Unrolled by 4 so the loop counter and pointer bumps are a small share of the
        // front-end bandwidth next to the MR·NV FMAs. The A pointer is bumped with
        // `wrapping_add`: after the last step it may point past the caller's slice (in-place A
        // with a large column stride) and is never dereferenced there.
        for _ in 0..k / 4 {
            for u in 0..4 {
                St::step::<MR, NV>(s, &mut acc, a.add(u * a_cs), a_rs, b.add(u * nr));
            }
            a = a.wrapping_add(4 * a_cs);
            b = b.add(4 * nr);
        }
        for _ in 0..k % 4 {
            St::step::<MR, NV>(s, &mut acc, a, a_rs, b);
            a = a.wrapping_add(a_cs);
            b = b.add(nr);
        }
        let alpha_v = s.splat(alpha);
        if beta == 0.0 {
            for (i, row) in acc.iter().enumerate() {
                for (v, &x) in row.iter().enumerate() {
                    s.store(c.add(i * rs_c + v * S::LANES), s.mul(x, alpha_v));
                }
            }
        } else {
            let beta_v = s.splat(beta);
            for (i, row) in acc.iter().enumerate() {
                for (v, &x) in row.iter().enumerate() {
                    let cp = c.add(i * rs_c + v * S::LANES);
                    s.store(cp, s.fma(x, alpha_v, s.mul(s.load(cp), beta_v)));
                }
            }
        }
    }
}

/// One k-step of [`sgemm_body`]'s register tile: what one step of Ã and B̃ adds to the
/// accumulators. [`Fma`] is the f32 rank-1 update; the `vdpbf16ps` kernel's step
/// (`avx512_bf16`) adds a rank-2 update from one packed pair of bf16 steps. A type rather than a
/// closure: a closure would not inherit the caller's `#[target_feature]`s and could not be
/// inlined into the micro-kernel.
pub(crate) trait Step<S: Simd> {
    /// Adds step `p` of the panels to `acc`: Ã's `MR` values at `a[i·a_rs]`, B̃'s row at `b`
    /// (`NV·LANES` 32-bit values).
    ///
    /// # Safety
    ///
    /// `a[i·a_rs]` valid for `i < MR`, `b` for `NV·LANES` reads; the CPU supports the features
    /// the step's instructions need.
    unsafe fn step<const MR: usize, const NV: usize>(
        s: S,
        acc: &mut [[S::V; NV]; MR],
        a: *const f32,
        a_rs: usize,
        b: *const f32,
    );
}

/// The f32 step: one rank-1 update, `acc[i] += Ã[p, i] · B̃[p, ..]` with one FMA per vector.
pub(crate) struct Fma;

impl<S: Simd> Step<S> for Fma {
    #[inline(always)]
    unsafe fn step<const MR: usize, const NV: usize>(
        s: S,
        acc: &mut [[S::V; NV]; MR],
        a: *const f32,
        a_rs: usize,
        b: *const f32,
    ) {
        // SAFETY: forwarded contract.
        unsafe { rank1::<S, MR, NV>(s, acc, a, a_rs, b) }
    }
}

/// One rank-1 update of the register tile: `NV` vector loads of B̃ row `p`, `MR` broadcasts of
/// Ã column `p` (`a[i·a_rs]`).
///
/// # Safety
///
/// `a[i·a_rs]` valid for `i < MR`, `b` for `NV·LANES` reads.
#[inline(always)]
unsafe fn rank1<S: Simd, const MR: usize, const NV: usize>(
    s: S,
    acc: &mut [[S::V; NV]; MR],
    a: *const f32,
    a_rs: usize,
    b: *const f32,
) {
    // SAFETY: forwarded contract.
    unsafe {
        let bv: [S::V; NV] = core::array::from_fn(|v| s.load(b.add(v * S::LANES)));
        for (i, row) in acc.iter_mut().enumerate() {
            let av = s.splat(*a.add(i * a_rs));
            for (acc_v, &b_v) in row.iter_mut().zip(bv.iter()) {
                *acc_v = s.fma(av, b_v, *acc_v);
            }
        }
    }
}

/// Signature of every micro-kernel (see the module docs and [`sgemm_body`] for the contract).
pub(crate) type UkrFn = unsafe fn(
    k: usize,
    alpha: f32,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    prefetch_c: bool,
);

/// Defines one kernel shape of an ISA in the invoking module: its micro-kernels (packed A, A
/// read in place, and partial row panels) as thin wrappers around [`sgemm_body`] carrying the
/// ISA's `#[target_feature]`, and its [`Kernel`] table entry `KERNEL`. One shape per module.
macro_rules! define_kernels {
    (
        isa: $isa:expr, simd: $simd:ty, step: $step:ty, pairs: $pairs:expr,
        mr: $mr:expr, nv: $nv:expr,
        packed: $packed:ident, strided: $strided:ident, rows: [$($r:literal),*],
        name: $name:expr,
        $(#[$attr:meta])*
    ) => {
        /// The micro-kernel for a partial row panel: `R < MR` rows of A read through
        /// strides (a packed panel is `a_rs = 1, a_cs = MR`), an `R × NR` tile of C.
        ///
        /// # Safety
        ///
        /// The CPU supports this ISA; as
        /// [`sgemm_body`](crate::gemm::ukernel::sgemm_body) with `MR = R`, without `PACKED_A`.
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        unsafe fn partial_rows<const R: usize>(
            k: usize, alpha: f32, a: *const f32, a_rs: usize, a_cs: usize,
            b: *const f32, beta: f32, c: *mut f32, rs_c: usize, prefetch_c: bool,
        ) {
            // SAFETY: forwarded contract (the CPU supports the ISA: the token may exist).
            unsafe {
                let s = <$simd as crate::arch::Simd>::new_unchecked();
                $crate::gemm::ukernel::sgemm_body::<$simd, $step, R, { $nv }, false>(
                    s, k, alpha, a, a_rs, a_cs, b, beta, c, rs_c, prefetch_c,
                )
            }
        }

        /// The packed-A micro-kernel (see the `ukernel` module docs for the contract).
        ///
        /// # Safety
        ///
        /// The CPU supports this ISA; as
        /// [`sgemm_body`](crate::gemm::ukernel::sgemm_body) with `PACKED_A`.
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $packed(
            k: usize, alpha: f32, a: *const f32, a_rs: usize, a_cs: usize,
            b: *const f32, beta: f32, c: *mut f32, rs_c: usize, prefetch_c: bool,
        ) {
            // SAFETY: forwarded contract (the CPU supports the ISA: the token may exist).
            unsafe {
                let s = <$simd as crate::arch::Simd>::new_unchecked();
                $crate::gemm::ukernel::sgemm_body::<$simd, $step, { $mr }, { $nv }, true>(
                    s, k, alpha, a, a_rs, a_cs, b, beta, c, rs_c, prefetch_c,
                )
            }
        }

        /// The micro-kernel reading A in place through its strides.
        ///
        /// # Safety
        ///
        /// The CPU supports this ISA; as
        /// [`sgemm_body`](crate::gemm::ukernel::sgemm_body) without `PACKED_A`.
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $strided(
            k: usize, alpha: f32, a: *const f32, a_rs: usize, a_cs: usize,
            b: *const f32, beta: f32, c: *mut f32, rs_c: usize, prefetch_c: bool,
        ) {
            // SAFETY: forwarded contract (the CPU supports the ISA: the token may exist).
            unsafe {
                let s = <$simd as crate::arch::Simd>::new_unchecked();
                $crate::gemm::ukernel::sgemm_body::<$simd, $step, { $mr }, { $nv }, false>(
                    s, k, alpha, a, a_rs, a_cs, b, beta, c, rs_c, prefetch_c,
                )
            }
        }

        /// This kernel shape's entry of the kernel table.
        pub(crate) static KERNEL: $crate::gemm::ukernel::Kernel = $crate::gemm::ukernel::Kernel {
            isa: $isa,
            name: $name,
            mr: $mr,
            nr: $nv * <$simd as crate::arch::Simd>::LANES,
            pairs: $pairs,
            ukr: $packed,
            ukr_strided_a: $strided,
            ukr_rows: &[$(partial_rows::<$r>),*],
        };
    };
}
pub(crate) use define_kernels;

/// A micro-kernel with its shape: everything the loop nest needs to know about a kernel (the
/// block sizes come from `blocking::for_kernel`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kernel {
    /// The ISA it runs on.
    pub isa: Isa,
    /// Name, e.g. `sgemm_6x64_avx512`.
    pub name: &'static str,
    /// Rows of the register tile (A micro-panel height).
    pub mr: usize,
    /// Columns of the register tile (B micro-panel width).
    pub nr: usize,
    /// True for the `vdpbf16ps` kernel: its panels hold pairs of bf16 steps, one per 32-bit
    /// word (`pack::pack_a_pairs` / `pack_b_pairs`), and its depth counts pairs.
    pub pairs: bool,
    /// The micro-kernel on a packed A micro-panel.
    pub ukr: UkrFn,
    /// The micro-kernel reading A in place through its strides.
    pub ukr_strided_a: UkrFn,
    /// `ukr_rows[r - 1]`: the kernel for a partial panel of `r < MR` rows (A through strides).
    pub ukr_rows: &'static [UkrFn],
}

/// The GEMM kernel of `isa` (`sgemm_6x64_avx512`, `sgemm_6x16_avx2`, `sgemm_4x16_portable`).
/// The caller must have checked `isa.is_supported()` before running it.
pub(crate) fn kernel_for(isa: Isa) -> &'static Kernel {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => &avx512::wide::KERNEL,
        _ => tile_kernel_for(isa),
    }
}

/// The kernel of `isa` whose `NR` is two vectors (`sgemm_12x32_avx512`, `sgemm_6x16_avx2`,
/// `sgemm_4x16_portable`): the flash block products run on it, its `NR` being their query
/// tile. The caller must have checked `isa.is_supported()` before running it.
pub(crate) fn tile_kernel_for(isa: Isa) -> &'static Kernel {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => &avx512::tile::KERNEL,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => &avx2::KERNEL,
        _ => &portable::KERNEL,
    }
}

/// The `vdpbf16ps` kernel for bf16 × bf16 (`bf16dot_12x32_avx512bf16`) when this CPU has
/// AVX-512F and AVX512_BF16, else `None`.
pub(crate) fn bf16_dot_kernel() -> Option<&'static Kernel> {
    #[cfg(target_arch = "x86_64")]
    if avx512_bf16::supported() {
        return Some(&avx512_bf16::KERNEL);
    }
    None
}

/// How the macro-kernel reads A.
#[derive(Clone, Copy)]
pub(crate) enum ABlock {
    /// A packed block: `MR`-row micro-panels of `kc` steps, panel `r` at `ptr + r·MR·kc`.
    Packed(*const f32),
    /// The caller's matrix in place: element `(i, p)` of the block at `ptr + i·rs + p·cs`.
    Strided {
        /// Element `(0, 0)` of the block.
        ptr: *const f32,
        /// Row stride.
        rs: usize,
        /// Column stride.
        cs: usize,
    },
}

/// The macro-kernel: `C[0..mc, 0..nc] ← α · Ã · B̃ + β · C` over an A block (packed or in place,
/// see [`ABlock`]) and a packed B block (`nc` columns in `NR`-column micro-panels, panel `s`
/// at `b + s·NR·kc`).
///
/// Loop order: A micro-panels outer (each one stays in L1 while every B micro-panel of the
/// L2-resident B block streams past it), B micro-panels inner; see
/// [`Blocking::derive`](crate::gemm::blocking::Blocking::derive). Full tiles of a C with unit
/// column stride go straight to the micro-kernel, and so do partial row panels, through a
/// kernel instance with fewer rows (`ukr_rows`: no wasted FMAs, nothing read past A's last
/// row; with A in place, a tail under `MR/2` rows and the panel before it become two
/// near-equal panels, see `panel_rows`); partial column panels and non-unit column strides go
/// through a bounce tile that is filled from C only when β ≠ 0, so nothing outside
/// `C[0..mc, 0..nc]` is read or written. `prefetch_c` goes to the micro-kernels (see
/// [`sgemm_body`]); the bounce tile, on the stack, is never prefetched.
///
/// # Safety
///
/// `kern` runs on this CPU; `a` is valid for `mc × kc` reads (packed: the padded
/// panels); `b` for `ceil(nc/NR)·NR·kc` reads (64-byte aligned panels);
/// `c + i·rs_c + j·cs_c` is valid for reads and writes for `i < mc`, `j < nc`, distinct for
/// distinct `(i, j)`, and not accessed by anyone else during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn macro_kernel(
    kern: &Kernel,
    mc: usize,
    nc: usize,
    kc: usize,
    alpha: f32,
    a: ABlock,
    b: *const f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    cs_c: usize,
    prefetch_c: bool,
) {
    let (mr, nr) = (kern.mr, kern.nr);
    debug_assert!(mr * nr <= MAX_TILE && kern.ukr_rows.len() == mr - 1);
    debug_assert!((b as usize).is_multiple_of(64) || kc == 0, "B panels must be 64-byte aligned");
    // The bounce tile, zeroed on first use (its padding lanes are computed but never stored).
    // Calls without edges (the flash block products, interior blocks) never pay for zeroing it.
    let mut bounce: Option<[f32; MAX_TILE]> = None;
    debug_assert!(mr >= 1);
    let split_tail = matches!(a, ABlock::Strided { .. });
    let mut ir = 0;
    while ir < mc {
        let mr_eff = panel_rows(mc - ir, mr, split_tail);
        for jr in (0..nc).step_by(nr) {
            let nr_eff = nr.min(nc - jr);
            // SAFETY: panel jr/nr of the packed B block, inside the extent the caller
            // guarantees; the A offsets address rows ir.. of the block; the C offset addresses
            // element (ir, jr) of the view.
            let (bp, ukr, ap, a_rs, a_cs, cp) = unsafe {
                let (ukr, ap, a_rs, a_cs) = match a {
                    ABlock::Packed(p) if mr_eff == mr => (kern.ukr, p.add(ir * kc), 1, mr),
                    ABlock::Packed(p) => (kern.ukr_rows[mr_eff - 1], p.add(ir * kc), 1, mr),
                    ABlock::Strided { ptr, rs, cs } if mr_eff == mr => {
                        (kern.ukr_strided_a, ptr.add(ir * rs), rs, cs)
                    }
                    ABlock::Strided { ptr, rs, cs } => {
                        (kern.ukr_rows[mr_eff - 1], ptr.add(ir * rs), rs, cs)
                    }
                };
                (b.add(jr * kc), ukr, ap, a_rs, a_cs, c.add(ir * rs_c + jr * cs_c))
            };
            if nr_eff == nr && cs_c == 1 {
                // SAFETY: `mr_eff` full-width rows with unit column stride lie inside the
                // caller's view, and the kernel chosen above writes exactly `mr_eff` rows.
                unsafe { ukr(kc, alpha, ap, a_rs, a_cs, bp, beta, cp, rs_c, prefetch_c) };
            } else {
                let tile = bounce.get_or_insert([0.0; MAX_TILE]);
                // SAFETY: only the `mr_eff × nr_eff` valid part of C is touched; the kernel
                // works on the local tile (row stride nr), which holds MR × NR elements.
                unsafe {
                    if beta != 0.0 {
                        for i in 0..mr_eff {
                            for j in 0..nr_eff {
                                tile[i * nr + j] = *cp.add(i * rs_c + j * cs_c);
                            }
                        }
                    }
                    ukr(kc, alpha, ap, a_rs, a_cs, bp, beta, tile.as_mut_ptr(), nr, false);
                    for i in 0..mr_eff {
                        for j in 0..nr_eff {
                            *cp.add(i * rs_c + j * cs_c) = tile[i * nr + j];
                        }
                    }
                }
            }
        }
        ir += mr_eff;
    }
}

/// Rows of the next row panel when `left ≥ 1` rows of the block remain: `mr`, or all that is
/// left. With `split_tail` (A read in place, so a panel may start at any row: the flash block
/// products, and GEMM's in-place and widened A), the last `mr + t` rows with a tail
/// `0 < t < mr/2` are split into two near-equal panels instead. A panel of few rows has few
/// accumulators: the 4-row tail of `sgemm_12x32` (d 64's `P·V`) ran at 75 % of peak on its 8,
/// where two 8-row panels have 16 each. The number of panels, so of sweeps over the B block,
/// is the same, and every element of C sees the same operations either way.
fn panel_rows(left: usize, mr: usize, split_tail: bool) -> usize {
    if split_tail && left > mr && 2 * (left - mr) < mr {
        left.div_ceil(2)
    } else {
        mr.min(left)
    }
}

/// The safe form of [`macro_kernel`] for one packed B micro-panel and an A read in place:
/// `c[i·NR + j] ← α·Σ_p a[a0 + i·a_rs + p·a_cs] · b[p·NR + j] + β·c[i·NR + j]` for `i < mc`,
/// `j < NR`, `p < kc` (`C` with row stride `NR`, unit column stride; for the `vdpbf16ps`
/// kernel, `p` counts 32-bit words of bf16 pairs in A and B). The flash block products run
/// on it. Panics (never UB) unless `kern` is the kernel of `S`'s ISA (the token proves the
/// CPU runs it), every A element lies inside `a`, `b` holds `kc·NR` floats from a 64-byte
/// boundary and `c` holds `mc·NR`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn panel_product<S: Simd>(
    _s: S,
    kern: &Kernel,
    mc: usize,
    kc: usize,
    (a, a0, a_rs, a_cs): (&[f32], usize, usize, usize),
    alpha: f32,
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) {
    let nr = kern.nr;
    assert!(kern.isa == S::ISA);
    let c = &mut c[..mc * nr];
    if mc == 0 {
        return;
    }
    if kc == 0 {
        // No A element is read (nor its address formed).
        for x in c.iter_mut() {
            *x = if beta == 0.0 { 0.0 } else { beta * *x };
        }
        return;
    }
    let last = (mc - 1)
        .checked_mul(a_rs)
        .and_then(|x| x.checked_add((kc - 1).checked_mul(a_cs)?))
        .and_then(|x| x.checked_add(a0));
    assert!(matches!(last, Some(i) if i < a.len()));
    let b = &b[..kc * nr];
    assert!((b.as_ptr() as usize).is_multiple_of(64), "B panels must be 64-byte aligned");
    // SAFETY: `kern` is the kernel of S's ISA, which the token proves supported. Checked above:
    // A rows `0..mc` × columns `0..kc` through the strides, the one packed panel of `kc·NR`
    // floats (aligned), and the `mc × NR` output tile (row stride NR, unit column stride:
    // distinct elements), which nothing else touches during the call (`&mut`).
    unsafe {
        let a = ABlock::Strided { ptr: a.as_ptr().add(a0), rs: a_rs, cs: a_cs };
        // C is the caller's block tile, already in cache: no C prefetch (see `sgemm_body`).
        let c = c.as_mut_ptr();
        macro_kernel(kern, mc, nr, kc, alpha, a, b.as_ptr(), beta, c, nr, 1, false);
    }
}

#[cfg(test)]
mod tests {
    use super::panel_rows;

    /// The panel heights `panel_rows` gives an `mc`-row block, in order.
    fn panels(mc: usize, mr: usize, split: bool) -> Vec<usize> {
        let (mut left, mut v) = (mc, Vec::new());
        while left > 0 {
            let r = panel_rows(left, mr, split);
            assert!((1..=mr.min(left)).contains(&r), "mr {mr} mc {mc}, {left} left: {r}");
            v.push(r);
            left -= r;
        }
        v
    }

    /// The panels are `mr` rows each and then the tail `t = mc mod mr`; with `split`, a tail
    /// `0 < t < mr/2` after at least one full panel turns the last `mr + t` rows into two
    /// panels of `⌈(mr + t)/2⌉` and `⌊(mr + t)/2⌋`. Either way the panel count (the sweeps over
    /// B) is `⌈mc/mr⌉`.
    #[test]
    fn row_panels_cover_the_block_and_split_short_tails() {
        for mr in 1..=16 {
            for mc in 0..5 * mr {
                for split in [false, true] {
                    let (q, t) = (mc / mr, mc % mr);
                    let mut want = vec![mr; q];
                    if split && q >= 1 && t > 0 && 2 * t < mr {
                        want[q - 1] = (mr + t).div_ceil(2);
                        want.push((mr + t) / 2);
                    } else if t > 0 {
                        want.push(t);
                    }
                    let got = panels(mc, mr, split);
                    assert_eq!(got, want, "mr {mr} mc {mc} split {split}");
                    assert_eq!(got.len(), mc.div_ceil(mr), "mr {mr} mc {mc} split {split}");
                }
            }
        }
        assert_eq!(panels(64, 12, true), [12, 12, 12, 12, 8, 8]);
        assert_eq!(panels(64, 12, false), [12, 12, 12, 12, 12, 4]);
        assert_eq!(panels(128, 12, true), [12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 8]);
        assert_eq!(panels(13, 12, true), [7, 6]);
    }
}
