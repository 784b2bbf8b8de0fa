//! Helpers for the tests of the reference crate itself: a deterministic generator for fixed
//! examples (no seed-dependent flakiness, no extra dependency) and closeness checks that report
//! the first offending index.

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
