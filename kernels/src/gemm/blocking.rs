//! Block sizes of the Goto/BLIS loop nest and the path thresholds: the one place where they are
//! chosen. KC / MC / NC are derived at run time from the detected cache sizes
//! ([`crate::arch::cache`]) by a pure function of a [`CacheSizes`], so one binary sizes its
//! blocks for the machine it runs on and every configuration can be checked on any machine.

use crate::arch::cache::{self, CacheSizes};

/// Bytes per element.
const F32: usize = 4;

/// KC is a multiple of this: every packed micro-panel (`MR·KC` or `KC·NR` floats) is then a
/// whole number of 64-byte lines, and KC a multiple of the micro-kernels' unroll of 4.
const KC_ALIGN: usize = 16;
/// Smallest KC: below it the C tile's load and store (once per micro-kernel call) stop being
/// small next to the `KC` rank-1 updates.
pub const KC_MIN: usize = 64;
/// Largest KC: past it the C tile's traffic (once per k-block) is already under 0.5 % of the
/// FMAs; it also bounds the packing buffers (`MC·KC`, `KC·NC`) whatever the caches claim.
pub const KC_MAX: usize = 512;
/// Largest MC, in rows (bounds the A block buffer).
pub const MC_MAX: usize = 4096;
/// Largest NC, in columns (bounds the B block buffer).
pub const NC_MAX: usize = 16384;

/// Below this many multiply-adds (`m·n·k`) a call stays on the calling thread whatever its
/// [`Parallelism`](crate::par::Parallelism): about 30 µs of work at 100 GFLOP/s, an order of
/// magnitude above the cost of waking a rayon worker.
pub const PAR_MIN_MNK: usize = 128 * 128 * 96;

/// A column-major A (unit row stride) is read in place by the micro-kernels instead of being
/// packed when C is at most this many micro-panels wide (`n ≤ DIRECT_A_COL_MAJOR_MAX_PANELS·NR`).
/// A row-major A (unit column stride) is always read in place: each micro-panel of it is `MR`
/// contiguous streams, read from memory once per B block and from L1 for the rest of the sweep
/// over that block's micro-panels, which costs no more than packing it and saves the pass.
///
/// In a column-major A every step of a micro-panel is its own cache line, `KC` lines for `MR`
/// values each; a column stride of a multiple of 4 KiB puts them all in one L1 set, and the
/// panel no longer stays in L1 for its sweep. Measured on an Emerald-Rapids-class Xeon (perf
/// journal, 2026-12-07 19:27), one thread, m = k = 1024 (stride 4 KiB) against m = k = 1000,
/// in place against packed: one panel (64 columns, m = 1024) 1.2–1.4× faster in place, two
/// panels 0.95× and 1.15×, four 0.83× and 1.08×, sixteen (1024³) 0.69–0.75× at 4 KiB.
pub const DIRECT_A_COL_MAJOR_MAX_PANELS: usize = 2;

/// Block sizes for one micro-kernel shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Depth of a k-block, a multiple of 16 in `KC_MIN ..= KC_MAX`.
    pub kc: usize,
    /// Rows of an A block, a positive multiple of MR.
    pub mc: usize,
    /// Columns of a B block, a positive multiple of NR.
    pub nc: usize,
}

impl Blocking {
    /// The blocking of an `mr × nr` micro-kernel on a machine with caches `c`; any sizes give
    /// valid blocks (zero or absurd ones are clamped).
    ///
    /// The macro-kernel sweeps every B micro-panel of a block (`KC × NC`, in L2) past one A
    /// micro-panel (`MR·KC`, in L1) before it moves to the next A micro-panel; the B micro-panels
    /// (`KC·NR`, 128 KiB at 512 × 64) are too large for L1 at the KC below, so they stream
    /// from L2 with `NV` vector loads per `MR·NV` FMAs.
    ///
    /// - **KC**: as deep as the B block allows, for the C tile is loaded and stored once per
    ///   k-block, and a k-block shallower than `k` adds a pass over C: `KC = L2 / (8 · 4·NR)`,
    ///   rounded down to a multiple of 16, at most [`KC_MAX`], so that an NC block of at least
    ///   four micro-panels fits in half the L2. The A micro-panel (`MR·KC`, 12 KiB at 6 × 512)
    ///   stays in L1. Sizing the B micro-panel to the L1 instead (KC = 128 for the 6 × 64 tile
    ///   on Zen 4) measured 2–7 % slower there (perf journal, 2026-12-05 08:43).
    /// - **NC** (L2): the packed B block (`KC·NC`) is reread once per A micro-panel, so it
    ///   stays in half the L2 (the rest holds the A micro-panels and C tiles that stream
    ///   through, and on AMD the L1's contents, the L2 being inclusive):
    ///   `NC = L2 / (2 · 4·KC)`, rounded down to a multiple of NR. A is packed (when it is)
    ///   once per NC block.
    /// - **MC**: the rows of A packed at a time (the packing buffer), a quarter of the L2 so
    ///   that packing does not evict the B block: `MC = L2 / (4 · 4·KC)`, rounded down to a
    ///   multiple of MR.
    ///
    /// On Zen 4 and Zen 5 (1 MiB L2) that is KC = 512, MC = 126, NC = 256 for
    /// `sgemm_6x64_avx512`; with AVX2's 6 × 16 tile and a 512 KiB L2, KC = 512, MC = 60,
    /// NC = 128. Before 2026-12-07 the loop order was the other way round (B micro-panels
    /// outer) with NC from the L3. The present order with a row-major A read in place ran
    /// 1.03–1.07× faster at 1024³ and 2048³; with A packed it was no faster (perf journal,
    /// 2026-12-07 19:27).
    pub const fn derive(c: &CacheSizes, mr: usize, nr: usize) -> Blocking {
        let mr = if mr == 0 { 1 } else { mr };
        let nr = if nr == 0 { 1 } else { nr };
        let kc = clamp(c.l2 / 8 / (F32 * nr) / KC_ALIGN * KC_ALIGN, KC_MIN, KC_MAX);
        let mc = clamp(c.l2 / 4 / (F32 * kc) / mr * mr, mr, MC_MAX / mr * mr);
        let nc = clamp(c.l2 / 2 / (F32 * kc) / nr * nr, nr, NC_MAX / nr * nr);
        Blocking { kc, mc, nc }
    }
}

/// `x` clamped to `lo ..= hi` (`lo` wins if `hi < lo`).
const fn clamp(x: usize, lo: usize, hi: usize) -> usize {
    let x = if x > hi { hi } else { x };
    if x < lo {
        lo
    } else {
        x
    }
}

/// The blocking of an `mr × nr` kernel on this machine's caches ([`cache::detected`], read
/// once); a few divisions, so derived per call.
pub(crate) fn for_kernel(mr: usize, nr: usize) -> Blocking {
    Blocking::derive(&cache::detected(), mr, nr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel shapes (MR, NR) of the three ISAs, and a few others.
    const TILES: [(usize, usize); 8] =
        [(6, 64), (12, 32), (6, 16), (4, 16), (1, 1), (14, 64), (0, 0), (5000, 20000)];

    #[test]
    fn derived_blocks_are_valid_for_any_caches() {
        for (name, c) in cache::examples() {
            for (mr, nr) in TILES {
                let b = Blocking::derive(&c, mr, nr);
                let (mr, nr) = (mr.max(1), nr.max(1));
                let what = format!("{name} {mr}x{nr}: {b:?}");
                assert!(
                    (KC_MIN..=KC_MAX).contains(&b.kc) && b.kc.is_multiple_of(KC_ALIGN),
                    "{what}"
                );
                assert!(b.mc >= mr && b.mc.is_multiple_of(mr) && b.mc <= MC_MAX.max(mr), "{what}");
                assert!(b.nc >= nr && b.nc.is_multiple_of(nr) && b.nc <= NC_MAX.max(nr), "{what}");
            }
        }
    }

    #[test]
    fn derived_blocks_fit_their_caches() {
        for (l1, l2, l3) in [(32, 1024, 32 << 10), (48, 1024, 32 << 10), (48, 1280, 48 << 10)] {
            let c = CacheSizes::new(l1 << 10, l2 << 10, l3 << 10);
            for (mr, nr) in [(6, 64), (12, 32), (6, 16), (4, 16)] {
                let b = Blocking::derive(&c, mr, nr);
                assert!(F32 * b.kc * nr <= c.l2 / 8, "{c:?} {mr}x{nr}: {b:?}");
                assert!(F32 * b.kc * mr <= c.l1d, "{c:?} {mr}x{nr}: {b:?}");
                assert!(F32 * b.kc * b.mc <= c.l2 / 4, "{c:?} {mr}x{nr}: {b:?}");
                assert!(F32 * b.kc * b.nc <= c.l2 / 2, "{c:?} {mr}x{nr}: {b:?}");
                // Deep enough that the C tile traffic is small, and at least four B micro-panels
                // per block: a packed A block is packed once per B block of NC columns.
                assert!(b.kc >= 128 && b.mc >= 8 * mr && b.nc >= 4 * nr, "{c:?}: {b:?}");
            }
        }
    }

    #[test]
    fn zen4_and_zen5_values() {
        let b = Blocking::derive(&CacheSizes::DEFAULT, 6, 64);
        assert_eq!(b, Blocking { kc: 512, mc: 126, nc: 256 });
        let zen5 = CacheSizes::new(48 << 10, 1 << 20, 32 << 20);
        assert_eq!(Blocking::derive(&zen5, 6, 64), b);
        assert_eq!(Blocking::derive(&CacheSizes::DEFAULT, 12, 32).kc, 512);
        // The AVX2 EPYC of 2026-11-30 (32 KiB L1d, 512 KiB L2): the same KC as under the old
        // L1 rule.
        let avx2 = CacheSizes::new(32 << 10, 512 << 10, 16 << 20);
        assert_eq!(Blocking::derive(&avx2, 6, 16), Blocking { kc: 512, mc: 60, nc: 128 });
        // This Emerald-Rapids-class Xeon (2 MiB L2): NC = 512.
        let emr = CacheSizes::new(48 << 10, 2 << 20, 260 << 20);
        assert_eq!(Blocking::derive(&emr, 6, 64), Blocking { kc: 512, mc: 252, nc: 512 });
    }
}
