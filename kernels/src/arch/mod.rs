//! Instruction-set detection and dispatch: the one place where the ISA is chosen.
//!
//! [`selected`] returns the ISA every kernel uses by default: the best one this CPU supports,
//! lowered by the `ATTN_ISA` environment variable (`avx512`, `avx2` or `portable`, read once) or
//! by [`set_isa_override`]. It is computed once and cached in an atomic, so the fast path is one
//! relaxed load. Kernels also accept an explicit [`Isa`] so that tests can run every kernel this
//! CPU supports side by side without touching global state. [`cache`] detects the cache sizes
//! that the block sizes are derived from.
//!
//! The vector layer lives here too: the one vector trait [`Simd`] (`simd.rs`), its three
//! token implementations ([`Avx512`] in `avx512.rs`, [`Avx2`] in `avx2.rs`, [`Portable`] in
//! `portable.rs`: with the GEMM micro-kernels' wrappers, the only code that names an
//! intrinsic), and [`vectorize`], which runs a [`Kernel`] written once over [`Simd`] inside
//! the `#[target_feature]` function of an ISA. [`convert`] widens and narrows `bf16`/`f16`
//! through the trait, the same bits on every ISA.

use std::sync::atomic::{AtomicU8, Ordering};

use attn_core::{Error, Result};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod cache;
pub mod convert;
mod portable;
mod simd;

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::Avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::Avx512;
pub(crate) use portable::Portable;
pub use simd::RECIP_MAX_REL;
pub(crate) use simd::{
    addr, bf16_pair_dot, keep, keep_tail, lanes_to_boundary, load, load_cells, load_tail,
    load_tail_cells, prefetch_line, store, store_cells, store_fence, store_tail, store_tail_cells,
    stream_cells, transpose, transpose_matrix, vectorize, vectorize_dot, Floats, Kernel, Simd,
    MAX_LANES, ROUND_MAGIC, TWO_POW_M64,
};

/// An instruction set a kernel family has a micro-kernel for, ordered from lowest to highest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable SIMD on the `wide` crate; runs everywhere.
    Portable = 1,
    /// x86-64 AVX2 + FMA + F16C (256-bit vectors, 16 registers; F16C converts f16, and every
    /// AVX2 CPU has it).
    Avx2 = 2,
    /// x86-64 AVX-512F (512-bit vectors, 32 registers, masked tails).
    Avx512 = 3,
}

impl Isa {
    /// All ISAs, lowest first.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// Short lower-case name, as accepted by `ATTN_ISA` and [`Isa::parse`].
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parses a name produced by [`Isa::name`] (case-insensitive).
    pub fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    /// True when this CPU can run kernels of this ISA.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The best ISA this CPU supports.
    pub fn best() -> Isa {
        Isa::ALL.into_iter().rev().find(|i| i.is_supported()).unwrap_or(Isa::Portable)
    }

    /// The ISAs this CPU supports, lowest first.
    pub fn supported() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
    }

    /// `Ok(self)` when supported, else an error naming the ISA (for explicit-ISA entry points).
    pub fn require(self) -> Result<Isa> {
        if self.is_supported() {
            Ok(self)
        } else {
            Err(Error::InvalidParameter {
                arg: "isa",
                requirement: match self {
                    Isa::Avx512 => "AVX-512F is not supported by this CPU",
                    Isa::Avx2 => "AVX2, FMA and F16C are not supported by this CPU",
                    Isa::Portable => "unreachable: portable is always supported",
                },
            })
        }
    }

    fn from_u8(v: u8) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| *i as u8 == v)
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// 0 = not yet computed; otherwise `Isa as u8`.
static SELECTED: AtomicU8 = AtomicU8::new(0);

/// The ISA kernels use when not told otherwise (see the module docs). Cached after first use.
#[inline]
pub fn selected() -> Isa {
    match Isa::from_u8(SELECTED.load(Ordering::Relaxed)) {
        Some(isa) => isa,
        None => {
            let isa = from_env().map_or(Isa::best(), |cap| cap.min(Isa::best()));
            SELECTED.store(isa as u8, Ordering::Relaxed);
            isa
        }
    }
}

/// Caps the default ISA at `max` (`None` restores detection plus `ATTN_ISA`). Asking for an ISA
/// the CPU lacks gives the best supported one below it. Affects calls that start afterwards.
pub fn set_isa_override(max: Option<Isa>) -> Isa {
    let best = from_env().map_or(Isa::best(), |cap| cap.min(Isa::best()));
    let isa = max.map_or(best, |m| m.min(Isa::best()));
    SELECTED.store(isa as u8, Ordering::Relaxed);
    isa
}

fn from_env() -> Option<Isa> {
    std::env::var("ATTN_ISA").ok().and_then(|v| Isa::parse(&v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::dtype::bf16;

    #[test]
    fn names_round_trip() {
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse("AVX2"), Some(Isa::Avx2));
        assert_eq!(Isa::parse("sse"), None);
    }

    /// [`Simd::recip`] of every element of a slice (whole vectors: the tests' lengths are
    /// multiples of every lane count).
    struct Recip<'a>(&'a [f32]);

    impl Kernel for Recip<'_> {
        type Output = Vec<f32>;

        fn run<S: Simd>(self, s: S) -> Vec<f32> {
            let mut out = self.0.to_vec();
            for v in out.chunks_exact_mut(S::LANES) {
                let r = s.recip(load(s, v));
                store(s, v, r);
            }
            out
        }
    }

    #[test]
    fn recip_is_within_its_bound() {
        // Every mantissa of [1, 2) (the estimate's error depends on the mantissa alone), and
        // of both signs a few steps at the ends of the documented range and around powers of 2.
        let mut ds: Vec<f32> = (0..1u32 << 23).map(|m| f32::from_bits(0x3F80_0000 | m)).collect();
        for e in [-125i32, -124, -1, 0, 1, 60, 124] {
            for k in [-2i64, -1, 0, 1, 2, 1 << 22, (1 << 23) - 3] {
                let b = ((e + 127) as i64) << 23;
                let x = f32::from_bits((b + k).clamp(0, 0x7F7F_FFFF) as u32);
                if x.abs() >= 2.0f32.powi(-125) && x.abs() <= 2.0f32.powi(125) {
                    ds.extend([x, -x]);
                }
            }
        }
        ds.resize(ds.len().div_ceil(16) * 16, 1.0);
        for isa in runnable("recip_is_within_its_bound") {
            let r = vectorize(isa, Recip(&ds));
            let worst = ds
                .iter()
                .zip(&r)
                .map(|(&d, &r)| (f64::from(r) * f64::from(d) - 1.0).abs())
                .fold(0.0f64, f64::max);
            assert!(worst <= RECIP_MAX_REL, "{isa}: recip off by {worst:e} relative");
        }
        for isa in Isa::supported() {
            let r = vectorize(isa, Recip(&[f32::NAN; 16]));
            assert!(r.iter().all(|x| x.is_nan()), "{isa}: recip of NaN");
        }
    }

    /// The ISAs this CPU runs, after naming on stderr each one `test` skips.
    fn runnable(test: &str) -> Vec<Isa> {
        for isa in Isa::ALL.into_iter().filter(|i| !i.is_supported()) {
            eprintln!("{test}: skipping {isa} (not supported by this CPU)");
        }
        Isa::supported()
    }

    /// [`Simd::reduce_add4`] of four vectors of distinct powers of two, with `special` (vector,
    /// value) in the last lane of that vector; with each vector's sum taken in order.
    struct Reduce4(Option<(usize, f32)>);

    impl Kernel for Reduce4 {
        type Output = ([f32; 4], [f32; 4]);

        fn run<S: Simd>(self, s: S) -> ([f32; 4], [f32; 4]) {
            let l = S::LANES;
            let mut x: Vec<f32> = (0..4 * l).map(|i| 2.0f32.powi(i as i32 - 40)).collect();
            if let Some((v, value)) = self.0 {
                x[v * l + l - 1] = value;
            }
            let mut want = [0.0f32; 4];
            for (w, v) in want.iter_mut().zip(x.chunks(l)) {
                *w = v.iter().sum();
            }
            let v = [load(s, &x), load(s, &x[l..]), load(s, &x[2 * l..]), load(s, &x[3 * l..])];
            (s.reduce_add4(v), want)
        }
    }

    #[test]
    fn reduce_add4_sums_each_vector_in_its_place() {
        // Distinct powers of two per lane and vector: every partial sum is exact in any order,
        // so each result must equal its vector's sum exactly and no lane may land in the wrong
        // sum; a NaN or ∞ in one vector reaches its own sum only.
        for isa in runnable("reduce_add4") {
            let specials =
                [None, Some((1, f32::NAN)), Some((2, f32::INFINITY)), Some((3, f32::NEG_INFINITY))];
            for special in specials {
                let (got, want) = vectorize(isa, Reduce4(special));
                for (g, w) in got.iter().zip(&want) {
                    let same = g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan();
                    assert!(same, "{isa}, {special:?}: {got:?} against {want:?}");
                }
            }
        }
    }

    /// [`Simd::transpose`] of the block at `(1, 2)` of a `20 × 37` matrix of distinct values
    /// into the block at `(3, 1)` of a `19 × 23` one; the rest of the destination unchanged.
    struct Transpose;

    impl Kernel for Transpose {
        type Output = (Vec<f32>, Vec<f32>);

        fn run<S: Simd>(self, s: S) -> (Vec<f32>, Vec<f32>) {
            let l = S::LANES;
            let src: Vec<f32> = (0..20 * 37).map(|i| i as f32).collect();
            let mut got = vec![-1.0f32; 19 * 23];
            let mut want = got.clone();
            for p in 0..l {
                for i in 0..l {
                    want[(3 + p) * 23 + 1 + i] = src[(1 + i) * 37 + 2 + p];
                }
            }
            // SAFETY: rows 1..1 + l and columns 2..2 + l are inside the source, rows 3..3 + l
            // and columns 1..1 + l inside the destination (l ≤ 16).
            unsafe { s.transpose(src[37 + 2..].as_ptr(), 37, got[3 * 23 + 1..].as_mut_ptr(), 23) };
            (got, want)
        }
    }

    #[test]
    fn transpose_moves_each_element_to_its_place() {
        for isa in runnable("transpose") {
            let (got, want) = vectorize(isa, Transpose);
            assert_eq!(got, want, "{isa}");
        }
    }

    /// [`transpose_matrix`] of a `rows × cols` block of a 40 × 70 source into a 90 × 50
    /// destination.
    struct TransposeMatrix {
        rows: usize,
        cols: usize,
    }

    impl Kernel for TransposeMatrix {
        type Output = (Vec<f32>, Vec<f32>);

        fn run<S: Simd>(self, s: S) -> (Vec<f32>, Vec<f32>) {
            let src: Vec<f32> = (0..40 * 70).map(|i| i as f32).collect();
            let mut got = vec![-1.0f32; 90 * 50];
            let mut want = got.clone();
            for r in 0..self.rows {
                for c in 0..self.cols {
                    want[(1 + c) * 50 + 2 + r] = src[(3 + r) * 70 + 4 + c];
                }
            }
            transpose_matrix(s, &src[3 * 70 + 4..], (self.rows, self.cols, 70), &mut got[52..], 50);
            (got, want)
        }
    }

    #[test]
    fn transpose_matrix_moves_each_element_to_its_place() {
        // Whole blocks of every ISA, edges in either dimension or both, an empty matrix.
        let shapes = [(32, 64), (37, 64), (32, 67), (35, 41), (5, 3), (1, 33), (0, 7), (16, 0)];
        for isa in runnable("transpose_matrix") {
            for (rows, cols) in shapes {
                let (got, want) = vectorize(isa, TransposeMatrix { rows, cols });
                assert_eq!(got, want, "{isa} {rows} × {cols}");
            }
        }
    }

    /// [`Simd::dot_bf16`] lane by lane over `(acc, a, b)`.
    struct DotBf16<'a>(&'a [f32], &'a [f32], &'a [f32]);

    impl Kernel for DotBf16<'_> {
        type Output = Vec<f32>;

        fn run<S: Simd>(self, s: S) -> Vec<f32> {
            let l = S::LANES;
            let mut out = self.0.to_vec();
            for (i, o) in out.chunks_exact_mut(l).enumerate() {
                let (a, b) = (load(s, &self.1[i * l..]), load(s, &self.2[i * l..]));
                // SAFETY: run by `vectorize_dot` (the instruction only on a CPU with
                // AVX512_BF16) or on an ISA whose `dot_bf16` is the scalar emulation.
                let r = unsafe { s.dot_bf16(load(s, o), a, b) };
                store(s, o, r);
            }
            out
        }
    }

    #[test]
    fn dot_bf16_pairs_each_half_with_its_own() {
        // Small integers: every product and sum is exact, so the instruction and the emulation
        // must agree bit for bit; distinct halves catch a pair read crosswise or a lane moved.
        let n = 64;
        let word = |i: usize, salt: usize| {
            let h = |k: usize| bf16::from_f32(((k * 7 + salt) % 33) as f32 - 16.0).to_bits();
            f32::from_bits(u32::from(h(2 * i)) | (u32::from(h(2 * i + 1 + salt)) << 16))
        };
        let acc: Vec<f32> = (0..n).map(|i| (i % 9) as f32 * 64.0 - 200.0).collect();
        let a: Vec<f32> = (0..n).map(|i| word(i, 3)).collect();
        let b: Vec<f32> = (0..n).map(|i| word(i, 5)).collect();
        let want: Vec<f32> = (0..n).map(|i| bf16_pair_dot(acc[i], a[i], b[i])).collect();
        for i in 0..n {
            let x = |w: f32, k: u32| f64::from(f32::from_bits(w.to_bits() >> k << 16));
            let exact = f64::from(acc[i]) + x(a[i], 0) * x(b[i], 0) + x(a[i], 16) * x(b[i], 16);
            assert_eq!(f64::from(want[i]), exact, "emulation, lane {i}");
        }
        let got = vectorize_dot(DotBf16(&acc, &a, &b));
        assert_eq!(got, want, "vectorize_dot");
        for isa in runnable("dot_bf16").into_iter().filter(|&i| i != Isa::Avx512) {
            assert_eq!(vectorize(isa, DotBf16(&acc, &a, &b)), want, "{isa}");
        }
        if !crate::gemm::bf16_dot_available() {
            eprintln!("dot_bf16: no AVX512_BF16 on this CPU; vdpbf16ps itself was not run");
        }
    }

    #[test]
    fn selected_is_supported() {
        assert!(selected().is_supported());
        assert!(Isa::Portable.require().is_ok());
    }
}
