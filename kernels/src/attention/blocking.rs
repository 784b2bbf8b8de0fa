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
/// beside them (1 × 8: 9 loads per 8 FMAs; 4 × 2: 6 loads per 8 FMAs). `R·C` is a multiple of
/// four so the transposed reduction has no padding.
pub(crate) const DECODE_QK_KEYS: [usize; 4] = [8, 4, 4, 2];

/// Value vectors per decode P·V tile for `R = 1..=4` rows (index `R − 1`): `R × CT`
/// accumulators plus `CT` value vectors and one broadcast weight within 16 registers.
pub(crate) const DECODE_PV_VECS: [usize; 4] = [8, 4, 2, 2];
