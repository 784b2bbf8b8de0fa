//! The fuzz decoders of `attn_tests::fuzz_decode` driven by proptest: random byte strings become
//! hostile calls (edge shapes, odd strides, overrunning views, every mask kind, special values),
//! each checked against the reference with the derived bounds and guard bands. The same checks
//! run under cargo-fuzz (`fuzz/`, `scripts/fuzz.sh`).
//!
//! Case counts: `ATTN_FUZZ_CASES` (default 256 per target, sized for the CI time budget;
//! `scripts/fuzz.sh --proptest` runs 100 000 with fresh random inputs, `ATTN_FUZZ_RANDOM=1`).
//!
//! The oracle itself is tested too: a kernel that is off by a few ULP too many, writes outside its
//! view, or accepts a call the reference rejects must be caught.

use attn_kernels::gemm::sgemm;
use attn_reference::{Mask, MatMut, TensorMut, TensorRef};
use attn_tests::fuzz_decode::{AttentionCase, GemmCase, SoftmaxCase};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

fn cases() -> u32 {
    std::env::var("ATTN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// Runs `check` on `cases()` random byte strings of up to `max_len` bytes (plus the empty one).
fn run(max_len: usize, check: impl Fn(&[u8]) -> Result<(), String>) {
    check(&[]).unwrap();
    let config = Config { cases: cases(), failure_persistence: None, ..Config::default() };
    // Deterministic in CI (the same byte strings every run); ATTN_FUZZ_RANDOM=1 (scripts/fuzz.sh
    // --proptest) draws fresh ones.
    let mut runner = if std::env::var_os("ATTN_FUZZ_RANDOM").is_some() {
        TestRunner::new(config)
    } else {
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
    };
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..max_len), |bytes| {
            check(&bytes).map_err(TestCaseError::fail)
        })
        .unwrap();
}

#[test]
fn fuzz_sgemm() {
    run(512, |b| GemmCase::decode(b).check(sgemm));
}

#[test]
fn fuzz_softmax() {
    run(512, |b| SoftmaxCase::decode(b).check(attn_kernels::softmax::scale_mask_softmax));
}

/// A fixed, fully specified case the oracle tests below perturb.
fn plain_gemm() -> GemmCase {
    // m = n = k = 17 (byte 15 → EDGE_SIZES[15]), α = 1, β = 0, no wrong shape, sequential,
    // row-major operands of uniform values.
    GemmCase::decode(&[15, 15, 15, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1])
}

#[test]
fn oracle_catches_a_few_ulp_too_many() {
    let case = plain_gemm();
    assert_eq!((case.a.layout.rows, case.a.layout.cols, case.b.layout.cols), (17, 17, 17));
    case.check(sgemm).unwrap();
    // 2(k + 3)·u·Σ|a||b| is the bound; an error of 64·(k + 3)·u·|c| exceeds it on most elements
    // (|c| ≈ Σ|a||b| / √k for random signs).
    let err = case.check(|al, a, b, be, mut c: MatMut<'_>, par| {
        sgemm(al, a, b, be, c.rb(), par)?;
        let i = c.layout.index(3, 5);
        c.data[i] *= 1.0 + 64.0 * 20.0 / (1u32 << 24) as f32 * 8.0;
        Ok(())
    });
    assert!(err.unwrap_err().contains("exceeds bound"));
}

#[test]
fn oracle_catches_a_write_outside_the_view() {
    let mut case = plain_gemm();
    // pad C's rows so there is NaN padding inside the slice (β = 0: C is not read)
    case.c.layout.row_stride += 2;
    case.c.data = vec![f32::NAN; case.c.layout.required_len().unwrap()];
    case.check(sgemm).unwrap();
    let err = case.check(|al, a, b, be, mut c: MatMut<'_>, par| {
        sgemm(al, a, b, be, c.rb(), par)?;
        c.data[17] = 0.0; // first padding element of row 0
        Ok(())
    });
    assert!(err.unwrap_err().contains("outside its view"));
}

#[test]
fn oracle_catches_a_missing_error_and_a_write_on_error() {
    let mut case = plain_gemm();
    case.c.data.pop(); // C now overruns its slice
    let err = case.check(|_, _, _, _, _, _| Ok(()));
    assert!(err.unwrap_err().contains("OutOfBounds"));
    let err = case.check(|_, _, _, _, c: MatMut<'_>, _| {
        c.data[0] = 1.0;
        Err(attn_reference::Error::OutOfBounds { arg: "c", required: 289, len: 288 })
    });
    assert!(err.unwrap_err().contains("changed on error"));
}

#[test]
fn oracle_catches_nan_where_reference_is_finite_and_finite_where_it_is_nan() {
    let case = plain_gemm();
    let err = case.check(|al, a, b, be, mut c: MatMut<'_>, par| {
        sgemm(al, a, b, be, c.rb(), par)?;
        c.data[0] = f32::NAN;
        Ok(())
    });
    assert!(err.unwrap_err().contains("not finite"));
    let mut case = plain_gemm();
    case.a.data[0] = f32::NAN;
    case.check(sgemm).unwrap();
    let err = case.check(|al, a, b, be, mut c: MatMut<'_>, par| {
        sgemm(al, a, b, be, c.rb(), par)?;
        c.data[0] = 0.0;
        Ok(())
    });
    assert!(err.unwrap_err().contains("reference is NaN"));
}

#[test]
fn decoders_reach_every_regime() {
    // Over a few thousand random inputs the decoders must produce errors and successes, empty
    // and non-empty shapes, every mask kind and non-finite data: otherwise the fuzzing is blind.
    let mut rng = 0x1234_5678_9abc_def1u64;
    let mut bytes = || {
        (0..200)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect::<Vec<u8>>()
    };
    let (mut err, mut ok, mut empty, mut nan, mut masks) = (0, 0, 0, 0, [0; 4]);
    for _ in 0..3000 {
        let c = AttentionCase::decode(&bytes());
        let r = attn_reference::attention::check_attention(
            &TensorRef::new(&c.q.data, c.q.layout),
            &TensorRef::new(&c.k.data, c.k.layout),
            &TensorRef::new(&c.v.data, c.v.layout),
            c.scale,
            &c.mask.mask(),
            &TensorMut::new(&mut c.o.data.clone(), c.o.layout),
            None,
        );
        match r {
            Ok([_, _, _, nq, nk, _, _]) => {
                ok += 1;
                empty += usize::from(nq * nk == 0);
            }
            Err(_) => err += 1,
        }
        nan += usize::from(c.q.data.iter().chain(&c.k.data).any(|x| !x.is_finite()));
        masks[match c.mask.mask() {
            Mask::None => 0,
            Mask::Causal { .. } => 1,
            Mask::Keep { .. } => 2,
            Mask::Bias { .. } => 3,
        }] += 1;
    }
    assert!(ok > 300 && err > 300 && empty > 30 && nan > 300, "{ok} {err} {empty} {nan}");
    assert!(masks.iter().all(|&m| m > 200), "{masks:?}");
}

fn selected_isa() -> attn_kernels::Isa {
    attn_kernels::arch::selected()
}

#[test]
fn fuzz_attention() {
    run(512, |b| AttentionCase::decode(b).check(attn_kernels::attention::attention));
}

#[test]
fn fuzz_attention_flash() {
    run(512, |b| {
        AttentionCase::decode(b).check(|q, k, v, s, m, o, l, p| {
            attn_kernels::attention::flash(selected_isa(), q, k, v, s, m, o, l, p)
        })
    });
}

#[test]
fn fuzz_attention_decode() {
    run(512, |b| {
        AttentionCase::decode_single_query(b).check(|q, k, v, s, m, o, l, p| {
            attn_kernels::attention::decode(selected_isa(), q, k, v, s, m, o, l, p)
        })
    });
}
