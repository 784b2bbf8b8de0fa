//! Block sizes and path thresholds of the attention kernels, in one place, each with the cache
//! it is sized for. The flash blocks ([`FlashBlocking`]) are a pure function of the cache sizes
//! and the GEMM micro-kernel's tile, so they can be derived for any machine; the decode sizes
//! are constants (register tiles, and a key block sized for a 32 KiB L1).

use crate::arch::cache::{self, CacheSizes};
use crate::arch::Isa;
use crate::gemm::ukernel::tile_kernel_for;

/// Query vectors per tile: the flash tile is the column width `NR` of the ISA's tile
/// micro-kernel (`tile_kernel_for`: `sgemm_6x16_avx2`, `sgemm_4x16_portable`: 2 × 8 = 16
/// queries; `sgemm_12x32_avx512`: 2 × 16 = 32), so the packed query tile and the probability block are
/// each exactly one packed B micro-panel. The softmax steps of the flash loop work on these
/// `QV` vectors of queries at a time.
pub(crate) const QV: usize = 2;

/// Head dimension the flash blocks are sized for (`d_k = d_v = 128`, the largest common one;
/// smaller heads only leave more room).
const DESIGN_D: usize = 128;

/// Most query tiles per flash task. Each tile beyond the first reads the task's key/value
/// blocks from L2 instead of L3, but fewer, larger tasks leave the threads less to share:
/// four still gives `batch·heads·N / (4·QR)` tasks (64 with AVX-512 at 8 heads, N = 1024).
const QT_MAX: usize = 4;

/// Block sizes of the flash loop for one GEMM micro-kernel tile (`MR` rows, `QR` queries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FlashBlocking {
    /// Keys per block of the streaming loop, a positive multiple of MR.
    pub bc: usize,
    /// Query tiles per task, `1 ..= QT_MAX`.
    pub qt: usize,
}

impl FlashBlocking {
    /// The flash blocks for a micro-kernel with `mr` rows and `qr` query lanes on caches `c`;
    /// any sizes give valid blocks (zero or absurd ones are clamped).
    ///
    /// - **BC** (L1): the `O += P·V` product rereads the probability block (`BC·QR` floats, its
    ///   packed B micro-panel) once per MR columns of V, and each pass also touches about one
    ///   line of every value row (MR consecutive floats of it). Both stay in L1, with an eighth
    ///   left for the accumulator tile and the stack: `BC·(4·QR + 64) ≤ 7/8 · L1d`, rounded
    ///   down to a multiple of MR so full blocks never take the partial-row kernels. More keys
    ///   per block amortise the per-block softmax bookkeeping (max, rescale of the accumulator).
    /// - **QT** (L2): the K/V block (`BC·(d_k + d_v)` floats) is read by every tile of the task,
    ///   so it stays in L2 together with each tile's packed queries and accumulator
    ///   (`(d_k + d_v)·QR` floats), within three quarters of L2 (the rest for the lines the
    ///   other operands pass through it) at `d_k = d_v = 128`; at most [`QT_MAX`].
    ///
    /// On Zen 4 (32 KiB L1d, 1 MiB L2) with `sgemm_12x32_avx512` that is BC = 144, QT = 4.
    pub(crate) const fn derive(c: &CacheSizes, mr: usize, qr: usize) -> FlashBlocking {
        let mr = if mr == 0 { 1 } else { mr };
        let per_key = 4 * qr + 64;
        let bc = c.l1d / 8 * 7 / per_key / mr * mr;
        // At most 1024 keys, at least one row panel (which wins for an absurd MR).
        let bc = if bc > 1024 / mr * mr { 1024 / mr * mr } else { bc };
        let bc = if bc < mr { mr } else { bc };
        let kv_block = bc * 2 * DESIGN_D * 4;
        let per_tile = 2 * DESIGN_D * qr * 4;
        let room = c.l2 / 4 * 3;
        let qt = if room > kv_block && per_tile > 0 { (room - kv_block) / per_tile } else { 1 };
        let qt = if qt < 1 {
            1
        } else if qt > QT_MAX {
            QT_MAX
        } else {
            qt
        };
        FlashBlocking { bc, qt }
    }
}

impl FlashBlocking {
    /// The flash blocks of `isa`'s tile micro-kernel on this machine's detected caches
    /// ([`crate::arch::cache::detected`]); a few divisions, so computed per call.
    pub(crate) fn for_isa(isa: Isa) -> FlashBlocking {
        let k = tile_kernel_for(isa);
        FlashBlocking::derive(&cache::detected(), k.mr, k.nr)
    }
}

/// Queries at or below which [`super::attention`] takes the decode path: with so few rows the
/// query tile of the flash path would be mostly padding, while the decode path vectorises
/// along the head dimension and splits the keys across threads instead.
pub(crate) const DECODE_MAX_Q: usize = 16;

/// Keys per block in the decode path. Small, so the block's key and value rows stay in L1
/// between the passes over it: 16 × (d_k + d_v) × 4 B = 16 KiB at d = 128 of 32 KiB L1d, with the
/// value rows prefetched during the score pass and read by the P·V pass right after, and the
/// `rows × 16` scores beside them. The per-block softmax bookkeeping (max, exp, rescale of the
/// `rows × d_v` accumulator when the max grows) is a few vector operations per key; larger
/// blocks measured slower (see `docs/perf-journal.md`, 2026-11-30).
pub(crate) const DECODE_BC: usize = 16;

/// How far ahead (in keys) the decode score pass prefetches key rows: the next block, 8 KiB
/// at d = 128 in f32. With the hardware prefetchers streaming the rows too, one block ahead
/// measured 1.02–1.10× two blocks ahead and 0.7× none, in and out of cache (perf journal,
/// 2026-12-04 08:10). One-row score tiles over dense f32/bf16/f16 K read their rows in address
/// order and leave the next block to the hardware prefetcher (2026-12-04 21:30).
pub(crate) const DECODE_PREFETCH_KEYS: usize = 16;

/// Smallest key chunk of the decode split: below this, the merge and the task overhead cost
/// more than the parallel read saves. A multiple of [`DECODE_BC`], so chunks hold whole blocks.
pub(crate) const DECODE_MIN_CHUNK: usize = 512;

/// Most chunks per `(batch, K/V head)` in the decode split: chunks are `DECODE_MIN_CHUNK` keys
/// until a head has this many, then longer, so the partial states (`rows × d_v` floats per
/// chunk) stay a small fraction of the K/V bytes (64 chunks of a 4-row, d = 128 head: 128 KiB
/// against ≥ 32 MiB of K/V at that length). The split depends on the problem only (never on
/// the thread count), so decode is bitwise identical across thread counts; threads take whole
/// chunks, and 64 chunks keep up to 64 threads busy on a single head.
pub(crate) const DECODE_MAX_CHUNKS: usize = 64;

/// Keys per decode score tile for a tile of `R = 1..=4` rows (index `R − 1`): `R × C`
/// accumulators of 16 vector registers, with the `C` key vectors and a query vector live
/// beside them (1 × 4: 5 loads per 4 FMAs; 4 × 2: 6 loads per 8 FMAs). `R·C` is a multiple of
/// four so the transposed reduction has no padding. A tile reads its `C` key rows side by
/// side, and the memory system streams 4 such rows from DRAM better than 8: one row at
/// 1 × 8 ran 0.75–0.85× of 1 × 4 with int8 K/V, in and out of cache, and 1.00–1.04× with f32
/// (perf journal, 2026-12-04 16:15).
pub(crate) const DECODE_QK_KEYS: [usize; 4] = [4, 4, 4, 2];

/// Value vectors per decode P·V tile for `R = 1..=4` rows (index `R − 1`): `R × CT`
/// accumulators plus `CT` value vectors and one broadcast weight within 16 registers.
pub(crate) const DECODE_PV_VECS: [usize; 4] = [8, 4, 2, 2];

/// [`DECODE_PV_VECS`] for ISAs with 32 vector registers (AVX-512): twice the columns per tile
/// from two rows on, so each broadcast weight feeds twice the FMAs (4 × 4: 16 accumulators,
/// 4 value vectors); measured in `docs/perf-journal.md`, 2026-12-04.
pub(crate) const DECODE_PV_VECS_32: [usize; 4] = [8, 8, 4, 4];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_blocks_are_valid_for_any_caches() {
        for (name, c) in cache::examples() {
            for (mr, qr) in [(12, 32), (6, 16), (4, 16), (1, 1), (0, 0), (2000, 64)] {
                let f = FlashBlocking::derive(&c, mr, qr);
                let mr = mr.max(1);
                let what = format!("{name} {mr}x{qr}: {f:?}");
                assert!(f.bc >= mr && f.bc.is_multiple_of(mr) && f.bc <= 1024.max(mr), "{what}");
                assert!((1..=QT_MAX).contains(&f.qt), "{what}");
            }
        }
    }

    #[test]
    fn flash_blocks_fit_their_caches() {
        for (l1, l2) in [(32, 1024), (48, 1024), (48, 1280), (32, 512)] {
            let c = CacheSizes::new(l1 << 10, l2 << 10, 32 << 20);
            for (mr, qr) in [(12, 32), (6, 16)] {
                let f = FlashBlocking::derive(&c, mr, qr);
                assert!(f.bc * (4 * qr + 64) <= c.l1d * 7 / 8, "{c:?}: {f:?}");
                let d2 = 2 * DESIGN_D * 4;
                assert!(f.bc * d2 + f.qt * d2 * qr <= c.l2 / 4 * 3, "{c:?}: {f:?}");
                assert!(f.bc >= 96 && f.qt == QT_MAX, "{c:?}: {f:?}");
            }
        }
    }

    #[test]
    fn zen4_values() {
        let f = FlashBlocking::derive(&CacheSizes::DEFAULT, 12, 32);
        assert_eq!((f.bc, f.qt), (144, 4));
    }
}
