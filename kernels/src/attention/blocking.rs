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

/// Keys per block in the decode path. Small, so the block's key and value rows stay in L1
/// between the passes over it: 16 × (d_k + d_v) × 4 B = 16 KiB at d = 128 of 32 KiB L1d, with the
/// value rows prefetched during the score pass and read by the P·V pass right after, and the
/// `rows × 16` scores beside them. The per-block softmax bookkeeping (max, exp, rescale of the
/// `rows × d_v` accumulator when the max grows) is a few vector operations per key. Measured on
/// the target's decode benchmark (32 heads × 4096 keys × d = 128, 8 K/V heads), 16 ran 10–25 %
/// faster than 64 and 256.
pub(crate) const DECODE_BC: usize = 16;

/// How far ahead (in keys) the decode score pass prefetches key rows: 32 rows = 16 KiB at
/// d = 128, two blocks ahead, enough to cover DRAM latency at one key per ~40 ns without
/// evicting the current block from L1.
pub(crate) const DECODE_PREFETCH_KEYS: usize = 32;

/// Smallest key chunk a decode thread gets: below this, the merge and the task overhead cost
/// more than the parallel read saves.
pub(crate) const DECODE_MIN_CHUNK: usize = 512;

/// Chunks per thread in the decode split, so that uneven chunks (masks) still balance.
pub(crate) const DECODE_CHUNKS_PER_THREAD: usize = 2;

/// Keys per decode score tile for a tile of `R = 1..=4` rows (index `R − 1`): `R × C`
/// accumulators of 16 vector registers, with the `C` key vectors and a query vector live
/// beside them (1 × 8: 9 loads per 8 FMAs; 4 × 2: 6 loads per 8 FMAs). `R·C` is a multiple of
/// four so the transposed reduction has no padding.
pub(crate) const DECODE_QK_KEYS: [usize; 4] = [8, 4, 4, 2];

/// Value vectors per decode P·V tile for `R = 1..=4` rows (index `R − 1`): `R × CT`
/// accumulators plus `CT` value vectors and one broadcast weight within 16 registers.
pub(crate) const DECODE_PV_VECS: [usize; 4] = [8, 4, 2, 2];
