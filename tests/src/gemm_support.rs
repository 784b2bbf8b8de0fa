//! Helpers for the GEMM tests: deterministic operand generation, the stride layouts every test
//! sweeps, NaN guard-banded output buffers, and the forward error bound.

use attn_reference::MatLayout;

pub use crate::numerics::U;

/// The register tiles (MR, NR) of the GEMM micro-kernels, in `Isa::ALL`'s order:
/// `sgemm_4x16_portable`, `sgemm_6x16_avx2`, `sgemm_6x64_avx512`.
pub const GEMM_TILES: [(usize, usize); 3] = [(4, 16), (6, 16), (6, 64)];

/// Every register tile: the GEMM ones and `sgemm_12x32_avx512` (also the tile of the
/// `vdpbf16ps` kernel), which the flash block products run on; edge sizes cover them all.
pub const TILES: [(usize, usize); 4] = [GEMM_TILES[0], GEMM_TILES[1], GEMM_TILES[2], (12, 32)];

/// A small deterministic generator (xorshift64*), so proptest only has to shrink a seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15 | 1)
    }
    /// Next raw 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// Uniform integer in [-r, r], as f32.
    pub fn small_int(&mut self, r: u64) -> f32 {
        (self.next_u64() % (2 * r + 1)) as f32 - r as f32
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// How a test operand is laid out in its slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Contiguous row-major.
    RowMajor,
    /// Contiguous column-major (what a transposed row-major operand looks like).
    ColMajor,
    /// Row-major with `pad` extra elements per row and an offset.
    PaddedRows(usize),
    /// Column-major with `pad` extra elements per column and an offset.
    PaddedCols(usize),
    /// Neither stride is 1: rows and columns both step over gaps.
    General,
}

impl Layout {
    /// Every layout the tests sweep.
    pub const ALL: [Layout; 5] = [
        Layout::RowMajor,
        Layout::ColMajor,
        Layout::PaddedRows(3),
        Layout::PaddedCols(5),
        Layout::General,
    ];

    /// The view of a `rows × cols` operand in this layout.
    pub fn view(self, rows: usize, cols: usize) -> MatLayout {
        match self {
            Layout::RowMajor => MatLayout::row_major(rows, cols),
            Layout::ColMajor => MatLayout::col_major(rows, cols),
            Layout::PaddedRows(pad) => MatLayout::strided(rows, cols, cols + pad, 1, 7),
            Layout::PaddedCols(pad) => MatLayout::strided(rows, cols, 1, rows + pad, 3),
            Layout::General => MatLayout::strided(rows, cols, 2, 2 * rows + 1, 5),
        }
    }
}

/// A buffer holding a view plus a guard band of `guard` elements after it; every element that
/// is not in the view is set to `fill`.
pub fn buffer(view: &MatLayout, guard: usize, fill: f32, mut val: impl FnMut() -> f32) -> Vec<f32> {
    let len = view.required_len().expect("test layouts do not overflow") + guard;
    let mut v = vec![fill; len];
    for i in 0..view.rows {
        for j in 0..view.cols {
            v[view.index(i, j)] = val();
        }
    }
    v
}

/// Positions of `buf` that are not elements of `view`.
pub fn outside(view: &MatLayout, len: usize) -> Vec<usize> {
    let mut inside = vec![false; len];
    for i in 0..view.rows {
        for j in 0..view.cols {
            inside[view.index(i, j)] = true;
        }
    }
    (0..len).filter(|&x| !inside[x]).collect()
}

/// Per-element forward error bound for `C ← α·A·B + β·C` computed in f32 with k terms:
/// `γ·(k + 3)·u·(|α|·(|A||B|)_ij + |β|·|c_ij|)`; the `+3` covers the roundings of the α and β
/// products and of the final sum, γ = 2 the unfused (two roundings per term) portable kernel.
#[allow(clippy::too_many_arguments)]
pub fn bound(
    alpha: f32,
    a: &[f32],
    la: &MatLayout,
    b: &[f32],
    lb: &MatLayout,
    beta: f32,
    c_before: f32,
    i: usize,
    j: usize,
) -> f64 {
    let k = la.cols;
    let abs: f64 =
        (0..k).map(|p| (a[la.index(i, p)] as f64 * b[lb.index(p, j)] as f64).abs()).sum();
    let mag =
        alpha.abs() as f64 * abs + if beta == 0.0 { 0.0 } else { (beta * c_before).abs() as f64 };
    crate::numerics::dot_bound(k, mag)
}
