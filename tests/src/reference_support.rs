//! Helpers for the tests of the reference crate itself: a deterministic generator for fixed
//! examples (no seed-dependent flakiness, no extra dependency), closeness checks that report
//! the first offending index, and the design's golden example ([`golden`]).

/// A small deterministic generator (SplitMix64) for fixed test data.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator started at `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`, a multiple of 2⁻²³.
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32) / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values from [`uniform`](Self::uniform).
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

/// Asserts `|got_i − want_i| ≤ rel·|want_i|` for every `i` (so a zero expectation demands an
/// exact zero), naming `what` and the first failing index.
pub fn assert_rel_close(got: &[f32], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= rel * w.abs(),
            "{what}[{i}]: got {g}, want {w}, error {err:e} > {rel:e}·|want|"
        );
    }
}

/// Asserts `|got_i − want_i| ≤ tol_i` elementwise, naming `what` and the first failing index.
pub fn assert_within(got: &[f32], want: &[f32], tol: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    assert_eq!(got.len(), tol.len(), "{what}: tolerance length");
    for i in 0..got.len() {
        let err = (f64::from(got[i]) - f64::from(want[i])).abs();
        assert!(
            err <= tol[i] || (got[i].is_nan() && want[i].is_nan()),
            "{what}[{i}]: got {}, want {}, error {err:e} > {:e}",
            got[i],
            want[i],
            tol[i]
        );
    }
}

/// The design's golden example (the seed "8 steps" article), shared by the tests that run it:
/// three inputs of width 4 projected to width 3, the scores, softmax and outputs. Everything up
/// to the scores is small-integer arithmetic, exact in f32; the softmax and outputs were computed
/// in high precision.
pub mod golden {
    /// The three inputs of width 4, `[3, 4]` row-major.
    pub const X: [f32; 12] = [1., 0., 1., 0., 0., 2., 0., 2., 1., 1., 1., 1.];
    /// The key projection, `[4, 3]`.
    pub const W_KEY: [f32; 12] = [0., 0., 1., 1., 1., 0., 0., 1., 0., 1., 1., 0.];
    /// The query projection, `[4, 3]`.
    pub const W_QUERY: [f32; 12] = [1., 0., 1., 1., 0., 0., 0., 0., 1., 0., 1., 1.];
    /// The value projection, `[4, 3]`.
    pub const W_VALUE: [f32; 12] = [0., 2., 0., 0., 3., 0., 1., 0., 3., 1., 1., 0.];
    /// `X·W_KEY`, `[3, 3]` (exact: small integers).
    pub const KEYS: [f32; 9] = [0., 1., 1., 4., 4., 0., 2., 3., 1.];
    /// `X·W_QUERY`, `[3, 3]` (exact).
    pub const QUERIES: [f32; 9] = [1., 0., 2., 2., 2., 2., 2., 1., 3.];
    /// `X·W_VALUE`, `[3, 3]` (exact).
    pub const VALUES: [f32; 9] = [1., 2., 3., 2., 8., 0., 2., 6., 3.];
    /// `QUERIES·KEYSᵀ`, `[3, 3]` (exact).
    pub const SCORES: [f32; 9] = [2., 4., 4., 4., 16., 12., 4., 12., 10.];
    /// The row softmax of [`SCORES`], to 10 significant digits.
    pub const SOFTMAX: [f64; 9] = [
        6.337893833e-02,
        4.683105308e-01,
        4.683105308e-01,
        6.033664855e-06,
        9.820078649e-01,
        1.798610144e-02,
        2.953872230e-04,
        8.805369018e-01,
        1.191677110e-01,
    ];
    /// The attention output with scale 1 (`SOFTMAX·VALUES`), to 10 digits.
    pub const OUTPUT_SCALE_1: [f64; 9] = [
        1.936621062,
        6.683105308,
        1.595068407,
        1.999993966,
        7.963991595,
        0.053976405,
        1.999704613,
        7.759892255,
        0.358389295,
    ];
    /// The attention output with scale 1/√3, to 10 digits.
    pub const OUTPUT_SCALE_RSQRT3: [f64; 9] = [
        1.863874202,
        6.319371012,
        1.704188696,
        1.999109553,
        7.814123505,
        0.273472058,
        1.992555108,
        7.479635592,
        0.735877258,
    ];
}
