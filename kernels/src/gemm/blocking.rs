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

/// A (with a unit stride) is read in place by the micro-kernels instead of being packed when C
/// is at most this many micro-panels wide (`n ≤ DIRECT_A_MAX_PANELS·NR`): 1024 columns for the
/// AVX-512 6 × 64 tile, 256 for the 6 × 16 (AVX2) and 4 × 16 (portable) tiles.
///
/// Packing costs a pass over A (a read and a write) per NC block, about `2/n` of a memory
/// access per multiply-add; reading A in place costs each of the `n/NR` passes of the
/// micro-kernels over A its MR strided streams instead of one, about `1/NR` per multiply-add
/// (MR broadcasts per MR·NR multiply-adds). So the crossover grows with NR. Measured on an
/// Emerald-Rapids-class Xeon (perf journal, 2026-12-07 16:37): in place, the AVX-512 tile ran
/// 1.05× (best times) to 1.11× (medians) faster at 256³, 1.03× at 512³ and 1.02–1.04× at
/// 1024³ (best times); AVX2's ran the same at 256³ and 0.95–0.99× at 512³ and 1024³, which
/// this width keeps packed.
pub const DIRECT_A_MAX_PANELS: usize = 16;

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
    /// - **KC** (L2): the macro-kernel rereads one B micro-panel (`KC·NR`) for every A
    ///   micro-panel of the block. From L2 it feeds the micro-kernel easily (`NV` vector loads
    ///   per `MR·NV` FMAs), so it is sized to an eighth of the L2 (beside the A block's
    ///   quarter): `KC = L2 / (8 · 4·NR)`, rounded down to a multiple of 16, at most
    ///   [`KC_MAX`]. Deeper is better up to there: the C tile is loaded and stored once per
    ///   k-block, and a k-block shallower than `k` adds a pass over C. The A micro-panel
    ///   (`MR·KC`, 12 KiB at 6 × 512) stays in L1. Sizing the B micro-panel to the L1 instead
    ///   (KC = 128 for the 6 × 64 tile on Zen 4) measured 2–7 % slower there (perf journal,
    ///   2026-12-05 08:43).
    /// - **MC** (L2): the packed A block (`MC·KC`) is reread once per B micro-panel, so it
    ///   stays in L2, in a quarter of it: the rest holds the B micro-panels and C tiles that
    ///   stream through, and on AMD the L1's contents (the L2 is inclusive).
    ///   `MC = L2 / (4 · 4·KC)`, rounded down to a multiple of MR.
    /// - **NC** (L3): the packed B block (`KC·NC`) is reread once per A block; an eighth of the
    ///   L3, which is shared by the cores and by other processes. `NC = L3 / (8 · 4·KC)`,
    ///   rounded down to a multiple of NR.
    ///
    /// On Zen 4 and Zen 5 (1 MiB L2, 32 MiB L3) that is KC = 512, MC = 126, NC = 2048 for
    /// `sgemm_6x64_avx512`; with AVX2's 6 × 16 tile and a 512 KiB L2, KC = 512, MC = 60.
    pub const fn derive(c: &CacheSizes, mr: usize, nr: usize) -> Blocking {
        let mr = if mr == 0 { 1 } else { mr };
        let nr = if nr == 0 { 1 } else { nr };
        let kc = clamp(c.l2 / 8 / (F32 * nr) / KC_ALIGN * KC_ALIGN, KC_MIN, KC_MAX);
        let mc = clamp(c.l2 / 4 / (F32 * kc) / mr * mr, mr, MC_MAX / mr * mr);
        let nc = clamp(c.l3 / 8 / (F32 * kc) / nr * nr, nr, NC_MAX / nr * nr);
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
                assert!(F32 * b.kc * b.nc <= c.l3 / 8, "{c:?} {mr}x{nr}: {b:?}");
                // Deep enough that the C tile traffic is small, wide enough to amortise packing
                // (an A block is packed once per B block of NC columns).
                assert!(b.kc >= 128 && b.mc >= 8 * mr && b.nc >= 32 * nr, "{c:?}: {b:?}");
            }
        }
    }

    #[test]
    fn zen4_and_zen5_values() {
        let b = Blocking::derive(&CacheSizes::DEFAULT, 6, 64);
        assert_eq!(b, Blocking { kc: 512, mc: 126, nc: 2048 });
        let zen5 = CacheSizes::new(48 << 10, 1 << 20, 32 << 20);
        assert_eq!(Blocking::derive(&zen5, 6, 64), b);
        assert_eq!(Blocking::derive(&CacheSizes::DEFAULT, 12, 32).kc, 512);
        // The AVX2 EPYC of 2026-11-30 (32 KiB L1d, 512 KiB L2): the same KC as under the old
        // L1 rule.
        let avx2 = CacheSizes::new(32 << 10, 512 << 10, 16 << 20);
        assert_eq!(Blocking::derive(&avx2, 6, 16), Blocking { kc: 512, mc: 60, nc: 1024 });
    }
}
