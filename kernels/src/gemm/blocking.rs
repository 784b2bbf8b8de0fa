//! Block sizes of the Goto/BLIS loop nest and the threading threshold: the one place where they
//! are chosen, with the cache each block is sized for. Tuned on this machine's EPYC (32 KiB L1d
//! and 512 KiB L2 per core, 32 MiB shared L3, AVX2+FMA) and sound on any x86-64 with ≥ 256 KiB
//! L2 (Zen 4's 1 MiB L2 only leaves more headroom).

/// Depth of a k-block (rows of a packed B block, columns of a packed A block).
///
/// A micro-kernel call streams one A micro-panel (`KC·MR·4` B) and one B micro-panel
/// (`KC·NR·4` B); with KC = 256 the 6×16 AVX2 pair is 6 KiB + 16 KiB, so the B micro-panel
/// that is reused across the whole A block stays in the 32 KiB L1 with room for the A panel
/// streaming past it, and the C tile is loaded and stored once per 256 rank-1 updates.
pub const KC: usize = 256;

/// Target bytes of a packed A block (`MC × KC` floats): half of a 512 KiB L2 (what this
/// machine's EPYC reports per core; a quarter of Zen 4's 1 MiB), leaving the rest for the B
/// micro-panel being reused and the C tiles that stream through.
pub const A_BLOCK_BYTES: usize = 256 * 1024;

/// Target bytes of a packed B block (`KC × NC` floats): 4 MiB, an eighth of the 32 MiB L3
/// (shared by the cores and the other processes of this machine), reused by every A block.
pub const B_BLOCK_BYTES: usize = 4 * 1024 * 1024;

/// Below this many multiply-adds (`m·n·k`) a call stays on the calling thread whatever its
/// [`Parallelism`](crate::par::Parallelism): about 30 µs of work at 100 GFLOP/s, an order of
/// magnitude above the cost of waking a rayon worker.
pub const PAR_MIN_MNK: usize = 128 * 128 * 96;

/// Widest C (n) for which A is read in place by the micro-kernels instead of being packed.
pub const DIRECT_A_MAX_N: usize = 128;

/// Block sizes for one micro-kernel shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Depth of a k-block.
    pub kc: usize,
    /// Rows of an A block, a multiple of MR.
    pub mc: usize,
    /// Columns of a B block, a multiple of NR.
    pub nc: usize,
}

impl Blocking {
    /// The blocking for an `mr × nr` micro-kernel: [`KC`], and MC / NC rounded down to whole
    /// micro-panels of the byte budgets above.
    pub const fn for_tile(mr: usize, nr: usize) -> Self {
        let mc = A_BLOCK_BYTES / (KC * 4) / mr * mr;
        let nc = B_BLOCK_BYTES / (KC * 4) / nr * nr;
        Blocking { kc: KC, mc, nc }
    }
}
