//! Block sizes and path thresholds of the attention kernels, in one place, each with the cache
//! it is sized for. Figures are for the target machine (Zen 4: 32 KiB L1d, 1 MiB L2 per core,
//! 32 MiB L3); the reasoning is written next to each constant so they can be re-derived.

/// Query vectors per register tile (the tile is `QV · LANES` queries tall: 32 with AVX-512,
/// 16 with AVX2/portable). Two vectors give `2·NR` independent FMA chains, enough to cover the
/// 4-cycle FMA latency at one 512-bit FMA per cycle, and leave registers for the broadcasts.
pub(crate) const QV: usize = 2;

/// Register-tile width (keys in `S = Q·Kᵀ`, value columns in `O += P·V`) for AVX-512: 2 × 8 = 16
/// accumulators of 32 zmm registers, 2 query loads + 8 broadcasts per 16 FMAs. 8 divides every
/// common head width (64, 80, 128, 256), so the P·V tile rarely has an edge.
pub(crate) const NR_AVX512: usize = 8;

/// Register-tile width for AVX2 and the portable path (16 ymm registers: 2 × 4 accumulators,
/// 2 query vectors, 1 broadcast).
pub(crate) const NR_AVX2: usize = 4;

/// Keys per block of the streaming loop. Per query tile the working set of one block is the
/// score/probability block `BC × 32 × 4 B` = 16 KiB, the packed query tile `d_k × 32 × 4 B`
/// (8–16 KiB at d = 64–128) and the output accumulator `d_v × 32 × 4 B`: together they stay in
/// L1/L2 while the key and value rows of the block (`BC × (d_k + d_v) × 4 B` = 64–128 KiB)
/// stream through L2 once per query tile. 128 keys amortise the per-block softmax bookkeeping
/// (max, rescale of the accumulator) over 128 FMAs per accumulator.
pub(crate) const BC: usize = 128;

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
