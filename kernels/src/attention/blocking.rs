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

/// Queries at or below which [`Attention::run`](super::Attention::run) takes the decode path:
/// with so few rows the query tile of the flash path would be mostly padding, while the decode
/// path vectorises along the head dimension and splits the keys across threads instead.
pub(crate) const DECODE_MAX_Q: usize = 16;

/// Most keys per block in the decode path ([`decode_block_keys`]). Each block pays a fixed
/// cost besides its keys' arithmetic: the per-row softmax bookkeeping (max, exp, sum, rescale
/// of the `rows × d_v` accumulator when the max grows), the tiles' set-up and reductions, the
/// accumulator's loads and stores. With K/V in L1 that cost was a third of a one-row key's
/// cycles at 16 keys a block; 64 keys a block ran 0.77–0.82× the time in cache and
/// 0.75–0.95× from DRAM for f32, int8 and the GQA tiles on Zen 4 (perf journal, 2026-12-06
/// 08:17). The score pass prefetches the next block's key rows and this block's value rows
/// (32 KiB of f32 value rows at d = 128, more than an L1: the P·V pass finds the first ones
/// in L2).
pub(crate) const DECODE_BC: usize = 64;

/// Fewest keys per decode block: a block's tiles and softmax are set up for this many keys
/// at least, and a page (16 slots at least) is then one run of a block.
pub(crate) const DECODE_BC_MIN: usize = 16;

/// Keys per decode block, for keys whose rows, of every head of the task together, span
/// `key_bytes` (K and V, the heads' rows and what lies between them: where K/V heads
/// interleave, `[seq, kv_heads, d]`, all of them), on caches `c`.
///
/// - `streamed` (the one-row tiles that keep the query in registers and leave dense K and V
///   to the hardware prefetcher, [`KvMat::QUERY_IN_REGISTERS`](super::blocks::KvMat)):
///   [`DECODE_BC_MIN`]. The score pass and the P·V pass each read one stream, taking turns,
///   and a pass of 64 rows outran the prefetcher's stream at each turn (1.08–1.24× the time
///   of 16 from DRAM on Zen 4, perf journal 2026-12-06 08:17).
/// - Otherwise [`DECODE_BC`], fewer where the block's rows of all the task's heads would
///   take more than half the L2 (a task prefetches the next block's into L2 beside them: 64
///   keys of 32 interleaved f32 heads at d = 128 are 2 MiB, and ran 1.07× the time of 16),
///   a multiple of [`DECODE_BC_MIN`], at least that.
pub(crate) fn decode_block_keys(c: &CacheSizes, key_bytes: usize, streamed: bool) -> usize {
    if streamed {
        return DECODE_BC_MIN;
    }
    let fit = (c.l2 / 2).checked_div(key_bytes).unwrap_or(DECODE_BC);
    (fit / DECODE_BC_MIN * DECODE_BC_MIN).clamp(DECODE_BC_MIN, DECODE_BC)
}

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
    fn decode_blocks_are_valid_and_fit_half_the_l2() {
        for (name, c) in cache::examples() {
            for key_bytes in [0usize, 1, 512, 2048, 32 << 10, 1 << 20, usize::MAX] {
                for streamed in [false, true] {
                    let bc = decode_block_keys(&c, key_bytes, streamed);
                    let what = format!("{name} {key_bytes} B a key, streamed {streamed}: {bc}");
                    assert!((DECODE_BC_MIN..=DECODE_BC).contains(&bc), "{what}");
                    assert!(bc.is_multiple_of(DECODE_BC_MIN), "{what}");
                    if streamed {
                        assert_eq!(bc, DECODE_BC_MIN, "{what}");
                    } else if bc > DECODE_BC_MIN {
                        assert!(bc * key_bytes <= c.l2 / 2, "{what}");
                    }
                }
            }
        }
        // Zen 4 (1 MiB L2), d = 128: head-major f32 and two interleaved heads take 64 keys,
        // 32 interleaved f32 heads (32 KiB a key of K and V) 16.
        let zen4 = CacheSizes::DEFAULT;
        assert_eq!(decode_block_keys(&zen4, 2 * 512, false), 64);
        assert_eq!(decode_block_keys(&zen4, 2 * 2 * 512, false), 64);
        assert_eq!(decode_block_keys(&zen4, 2 * 32 * 512, false), 16);
        assert_eq!(decode_block_keys(&zen4, 2 * 8 * 512, false), 64);
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
