//! The FMA throughput probe: the one place in the report where `std::arch` is used directly.
//!
//! Peak FMA throughput needs enough independent dependency chains to cover latency × issue
//! width: Zen 4 has two FMA pipes with 4-cycle latency, so ≥ 8 chains of 256-bit operations
//! (512-bit ones occupy both halves) keep it busy. [`CHAINS`] = 16 covers that with margin and
//! fits the 32 vector registers of AVX-512 (16 of AVX2 hold [`CHAINS_AVX2`] = 12 chains plus the
//! two constants). Each chain is `acc ← acc·m + a` with `m` just below 1, so it converges to a
//! finite value and the FMAs cannot be folded away (no fast-math: the compiler keeps each one).

/// Independent accumulator chains in the AVX-512 probe.
pub const CHAINS: usize = 16;
/// Independent accumulator chains in the AVX2 probe (16 ymm registers: 12 chains + 2 constants).
pub const CHAINS_AVX2: usize = 12;

/// Which instruction set the probe used, and the f32 FLOPs one round of it performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// 16 chains of 512-bit FMA.
    Avx512,
    /// 12 chains of 256-bit FMA.
    Avx2Fma,
    /// Scalar `a·m + b` chains (no FMA instruction known to be present).
    Portable,
}

impl Probe {
    /// The best probe this CPU can run.
    pub fn best() -> Probe {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                return Probe::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Probe::Avx2Fma;
            }
        }
        Probe::Portable
    }

    /// Name for the report.
    pub const fn name(self) -> &'static str {
        match self {
            Probe::Avx512 => "avx512 fma, 16 chains",
            Probe::Avx2Fma => "avx2 fma, 12 chains",
            Probe::Portable => "scalar mul+add, 16 chains",
        }
    }

    /// Floating-point operations of one round (2 per FMA lane).
    pub const fn flops_per_round(self) -> f64 {
        match self {
            Probe::Avx512 => (CHAINS * 16 * 2) as f64,
            Probe::Avx2Fma => (CHAINS_AVX2 * 8 * 2) as f64,
            Probe::Portable => (CHAINS * 2) as f64,
        }
    }

    /// Runs `rounds` rounds of independent FMA chains and returns a value derived from every
    /// chain (pass it to `black_box`). Safe: the ISA is checked before any intrinsic runs, and a
    /// probe the CPU lacks falls back to the portable one.
    pub fn run(self, rounds: u64, seed: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        match self {
            Probe::Avx512 if is_x86_feature_detected!("avx512f") => {
                // SAFETY: AVX-512F was detected just above.
                return unsafe { x86::chains_avx512(rounds, seed) };
            }
            Probe::Avx2Fma
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") =>
            {
                // SAFETY: AVX2 and FMA were detected just above.
                return unsafe { x86::chains_avx2(rounds, seed) };
            }
            _ => {}
        }
        chains_portable(rounds, seed)
    }
}

fn chains_portable(rounds: u64, seed: f32) -> f32 {
    let m = std::hint::black_box(0.999_999_f32);
    let mut acc = [seed; CHAINS];
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            *a = *a * m + seed;
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{CHAINS, CHAINS_AVX2};
    use std::arch::x86_64::*;

    /// `rounds` rounds of [`CHAINS`] independent 512-bit FMAs.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn chains_avx512(rounds: u64, seed: f32) -> f32 {
        debug_assert!(is_x86_feature_detected!("avx512f"));
        let m = _mm512_set1_ps(std::hint::black_box(0.999_999));
        let a = _mm512_set1_ps(seed);
        let mut acc = [_mm512_set1_ps(seed); CHAINS];
        for _ in 0..rounds {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, m, a);
            }
        }
        let mut s = _mm512_setzero_ps();
        for x in acc {
            s = _mm512_add_ps(s, x);
        }
        _mm512_reduce_add_ps(s)
    }

    /// `rounds` rounds of [`CHAINS_AVX2`] independent 256-bit FMAs.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn chains_avx2(rounds: u64, seed: f32) -> f32 {
        debug_assert!(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
        let m = _mm256_set1_ps(std::hint::black_box(0.999_999));
        let a = _mm256_set1_ps(seed);
        let mut acc = [_mm256_set1_ps(seed); CHAINS_AVX2];
        for _ in 0..rounds {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, m, a);
            }
        }
        let mut s = _mm256_setzero_ps();
        for x in acc {
            s = _mm256_add_ps(s, x);
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds exactly the 8 floats one unaligned 256-bit store writes.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), s) };
        lanes.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_probe_computes_its_recurrence_exactly() {
        // Every chain runs the same f32 recurrence from the same start, so each lane must equal
        // a scalar simulation with the same rounding (one for FMA, two for mul + add); only the
        // final sum over lanes reorders, which costs at most a few ULP of the total.
        let (n, a) = (100_000u64, 1e-3f32);
        let m = 0.999_999f32;
        for p in [Probe::best(), Probe::Portable] {
            let mut x = a;
            for _ in 0..n {
                x = if p == Probe::Portable { x * m + a } else { x.mul_add(m, a) };
            }
            let lanes = p.flops_per_round() / 2.0;
            let got = f64::from(p.run(n, a));
            let want = f64::from(x) * lanes;
            assert!((got - want).abs() <= 1e-5 * want, "{p:?}: {got} vs {want}");
        }
    }
}
