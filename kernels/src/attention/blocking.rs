//! Block sizes and path thresholds of the attention kernels, in one place, each with the cache
//! it is sized for. Figures are for the target machine (Zen 4: 32 KiB L1d, 1 MiB L2 per core,
//! 32 MiB L3); the reasoning is written next to each constant so they can be re-derived.

/// Query vectors per tile: the flash tile is the column width `NR` of the ISA's GEMM
/// micro-kernel (`sgemm_6x16_avx2`, `sgemm_4x16_portable`: 2 × 8 = 16 queries;
/// `sgemm_12x32_avx512`: 2 × 16 = 32), so the packed query tile and the probability block are
/// each exactly one packed B micro-panel. The softmax steps of the flash loop work on these
/// `QV` vectors of queries at a time.
pub(crate) const QV: usize = 2;

/// Query tiles per flash task. A key/value block (`BC × (d_k + d_v) × 4 B` = 72–144 KiB) does
/// not fit in L1 and a head's whole K/V (`N × (d_k + d_v) × 4 B`, 512 KiB at N = 1024, d = 64)
/// does not fit in this machine's 512 KiB L2 next to everything else, so with one tile per task
/// every tile would fetch every block from L3. With `QT` tiles per task a block is fetched
/// from L3 once and then read from L2 by the other `QT − 1` tiles. Their accumulators and
/// packed queries (`QT × (d_k + d_v) × QR × 4 B` = 32–64 KiB with AVX2) stay in L2. Four
/// still leaves `batch·heads·N / (4·QR)` tasks (128 at 8 heads, N = 1024) for the threads.
pub(crate) const QT: usize = 4;

/// Keys per block of the streaming loop. Per query tile (`QR` = 16 queries with AVX2, 32 with
/// AVX-512) the working set of one block is the score/probability block (`BC × QR × 4 B` =
/// 9–18 KiB), the packed query tile (`d_k × QR × 4 B` = 4–16 KiB at d = 64–128) and the output
/// accumulator (`d_v × QR × 4 B`): together they stay in L1/L2 while the key and value rows of
/// the block (`BC × (d_k + d_v) × 4 B` = 72–144 KiB) stream through L2 once per query tile.
/// 144 keys amortise the per-block softmax bookkeeping (max, rescale of the accumulator) over
/// 144 rank-1 updates of the P·V tiles, and are a whole number of micro-kernel row panels of
/// both `sgemm_6x16_avx2` and `sgemm_12x32_avx512`, so full blocks never take the partial-row
/// kernels in `S = K·Q̃ᵀ`.
pub(crate) const BC: usize = 144;

/// Queries at or below which [`super::attention`] takes the decode path: with so few rows the
/// query tile of the flash path would be mostly padding, while the decode path vectorises
/// along the head dimension and splits the keys across threads instead.
pub(crate) const DECODE_MAX_Q: usize = 16;

/// Keys per block in the decode path: the score rows of one block (`rows × 256 × 4 B`) and the
/// output accumulators stay in L1 while each key/value row is read from memory exactly once.
pub(crate) const DECODE_BC: usize = 256;

/// Smallest key chunk a decode thread gets: below this, the merge and the task overhead cost
/// more than the parallel read saves.
pub(crate) const DECODE_MIN_CHUNK: usize = 512;

/// Chunks per thread in the decode split, so that uneven chunks (masks) still balance.
pub(crate) const DECODE_CHUNKS_PER_THREAD: usize = 2;
