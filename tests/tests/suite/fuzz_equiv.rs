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

use attn_kernels::attention::{Attention, Path};
use attn_kernels::gemm::{bf16_dot_available, sgemm, HalfPath};
use attn_reference::{Mask, MatMut, TensorMut, TensorRef};
use attn_tests::fuzz_decode::{
    AttentionCase, DtypeAttentionCase, GemmCase, PagedCase, SoftmaxCase, VarlenCase,
};
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

/// A fixed sequence of 200-byte inputs (xorshift from `seed`), for the regime tests.
fn byte_strings(mut rng: u64) -> impl FnMut() -> Vec<u8> {
    move || {
        (0..200)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect()
    }
}

#[test]
fn decoders_reach_every_regime() {
    // Over a few thousand random inputs the decoders must produce errors and successes, empty
    // and non-empty shapes, every mask kind and non-finite data: otherwise the fuzzing is blind.
    let mut bytes = byte_strings(0x1234_5678_9abc_def1);
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

#[test]
fn varlen_and_dtype_decoders_reach_successes() {
    // The packed-batch decoder damages offsets and picks masks a batch refuses; the dtype
    // decoder must still reach every storage type on calls that run. Both need enough calls
    // the reference accepts, with work in them, or the fuzzing only tests argument checks.
    let mut bytes = byte_strings(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut busy, mut err) = (0, 0, 0);
    for _ in 0..3000 {
        let c = VarlenCase::decode(&bytes());
        let a = &c.attention;
        let mut o = a.o.data.clone();
        let r = attn_reference::batch::attention_varlen(
            TensorRef::new(&a.q.data, a.q.layout),
            TensorRef::new(&a.k.data, a.k.layout),
            TensorRef::new(&a.v.data, a.v.layout),
            &c.cu_q,
            &c.cu_k,
            a.scale,
            &a.mask.mask(),
            &a.variants.variants(),
            TensorMut::new(&mut o, a.o.layout),
            None,
        );
        match r {
            Ok(()) => {
                ok += 1;
                busy += usize::from(c.cu_q.windows(2).filter(|w| w[1] > w[0]).count() >= 2);
            }
            Err(_) => err += 1,
        }
    }
    assert!(
        ok > 300 && busy > 100 && err > 300,
        "varlen: {ok} ok ({busy} with 2+ sequences), {err} errors"
    );
    let mut seen = std::collections::HashMap::new();
    for _ in 0..3000 {
        let c = DtypeAttentionCase::decode(&bytes());
        let a = &c.attention;
        let r = attn_reference::attention::check_attention(
            &TensorRef::new(&a.q.data, a.q.layout),
            &TensorRef::new(&a.k.data, a.k.layout),
            &TensorRef::new(&a.v.data, a.v.layout),
            a.scale,
            &a.mask.mask(),
            &TensorMut::new(&mut a.o.data.clone(), a.o.layout),
            None,
        );
        if matches!(r, Ok([_, _, _, nq, nk, _, _]) if nq * nk > 0) {
            for (i, t) in c.types.iter().enumerate() {
                *seen.entry((i, *t)).or_insert(0) += 1;
            }
        }
    }
    // Q: 3 types, K and V: 4 each.
    assert!(seen.len() == 11 && seen.values().all(|&n| n > 20), "dtypes: {seen:?}");
    let (mut ok, mut err, mut types) = (0, 0, std::collections::HashSet::new());
    for _ in 0..3000 {
        let c = PagedCase::decode(&bytes());
        let a = &c.attention;
        let mut o = a.o.data.clone();
        let cache = attn_kernels::batch::PagedKv {
            k: (&c.pools[0]).into(),
            v: (&c.pools[1]).into(),
            page_size: c.page_size,
            kv_heads: c.kv_heads,
            dk: c.dk,
            dv: c.dv,
            block_table: &c.block_table,
            max_pages: c.max_pages,
            seq_lens: &c.seq_lens,
        };
        let r = attn_reference::batch::attention_paged(
            TensorRef::new(&a.q.data, a.q.layout),
            &c.cu_q,
            &cache,
            a.scale,
            &a.mask.mask(),
            &a.variants.variants(),
            TensorMut::new(&mut o, a.o.layout),
            None,
        );
        if r.is_ok() && c.seq_lens.iter().filter(|&&n| n > 0).count() >= 2 {
            ok += 1;
            types.insert(c.types);
        } else if r.is_err() {
            err += 1;
        }
    }
    assert!(ok > 300 && err > 300 && types.len() == 16, "paged: {ok} ok, {err} errors, {types:?}");
}

fn selected_isa() -> attn_kernels::Isa {
    attn_kernels::arch::selected()
}

#[test]
fn fuzz_attention() {
    run(512, |b| AttentionCase::decode(b).check(|a, o| a.run(o)));
}

#[test]
fn fuzz_varlen() {
    run(512, |b| VarlenCase::decode(b).check(|a, o| a.run(o)));
}

#[test]
fn fuzz_paged() {
    run(512, |b| PagedCase::decode(b).check(|a, o| a.run(o)));
}

/// Paged attention with `HalfPath::Dot` over bf16 queries and pools: decode pieces run their
/// scores on `vdpbf16ps`, prefill pieces both flash products; each sequence is held to its
/// piece's bound. Named as skipped on a CPU without AVX512_BF16.
#[test]
fn fuzz_paged_dot() {
    if !bf16_dot_available() {
        eprintln!(
            "fuzz_paged_dot: paged attention on vdpbf16ps (HalfPath::Dot) needs AVX-512F and \
             AVX512_BF16, which this CPU lacks; skipped"
        );
        return;
    }
    let ran = std::cell::Cell::new(0u32);
    run(512, |b| {
        PagedCase::decode_dot(b).check(|a, o| {
            let r = a.isa(attn_kernels::Isa::Avx512).half_path(HalfPath::Dot).run(o);
            ran.set(ran.get() + u32::from(r.is_ok()));
            r
        })
    });
    assert!(ran.get() > cases() / 8, "{} of {} calls ran", ran.get(), cases());
}

#[test]
fn fuzz_attention_dtypes() {
    run(512, |b| DtypeAttentionCase::decode(b).check(|a, o| a.run(o)));
}

#[test]
fn fuzz_attention_dtypes_flash() {
    run(512, |b| {
        DtypeAttentionCase::decode(b).check(|a, o| a.isa(selected_isa()).path(Path::Flash).run(o))
    });
}

/// The flash path on `vdpbf16ps` (`HalfPath::Dot`: bf16 Q, K and V, the `avx512` ISA and
/// AVX512_BF16), held to its own bound; named as skipped on a CPU without it.
#[test]
fn fuzz_attention_dtypes_dot() {
    fuzz_dot("fuzz_attention_dtypes_dot", Path::Flash);
}

/// The decode path on `vdpbf16ps` (`HalfPath::Dot`: the scores on the instruction for an
/// even `dk`, widened for an odd one), held to its bound; named as skipped on a CPU without it.
#[test]
fn fuzz_attention_dtypes_dot_decode() {
    fuzz_dot("fuzz_attention_dtypes_dot_decode", Path::Decode);
}

/// Fuzzes `path` with `HalfPath::Dot` on bf16 cases, each held to that path's bound (flash:
/// scores and `P·V` on the instruction; decode: the scores only).
fn fuzz_dot(test: &str, path: Path) {
    if !bf16_dot_available() {
        eprintln!(
            "{test}: the {path:?} path on vdpbf16ps (HalfPath::Dot) needs AVX-512F and \
             AVX512_BF16, which this CPU lacks; skipped"
        );
        return;
    }
    // Calls the kernel ran (not refused): the fuzzing must reach the products, not only the
    // argument checks.
    let ran = std::cell::Cell::new(0u32);
    run(512, |b| {
        let case = DtypeAttentionCase::decode_dot(b);
        let kernel = |a: Attention<'_>, o: TensorMut<'_>| {
            let r = a.isa(attn_kernels::Isa::Avx512).path(path).half_path(HalfPath::Dot).run(o);
            ran.set(ran.get() + u32::from(r.is_ok()));
            r
        };
        match path {
            Path::Decode => case.check_scores_dot(kernel),
            _ => case.check(kernel),
        }
    });
    assert!(ran.get() > cases() / 8, "{} of {} calls ran", ran.get(), cases());
}

#[test]
fn fuzz_attention_flash() {
    run(512, |b| {
        AttentionCase::decode(b).check(|a, o| a.isa(selected_isa()).path(Path::Flash).run(o))
    });
}

#[test]
fn fuzz_attention_unfused() {
    run(512, |b| {
        AttentionCase::decode(b).check(|a, o| a.isa(selected_isa()).path(Path::Unfused).run(o))
    });
}

#[test]
fn fuzz_attention_decode() {
    run(512, |b| {
        AttentionCase::decode_single_query(b)
            .check(|a, o| a.isa(selected_isa()).path(Path::Decode).run(o))
    });
}

/// Inputs the long proptest runs (`scripts/fuzz.sh --proptest 100000`) found, kept as
/// regressions. Issue 25: rows whose scores overflow f32 but not f64 (huge data or scale),
/// where the reference's row is NaN from ±∞/NaN values at keys it weighs while the kernel
/// (now giving its +∞ scores the row, not a NaN) weighs other keys: a gray-zone row the oracle
/// must not judge by NaN-ness (see `value_nan_unresolved` in the attention oracle).
#[test]
fn fuzz_regressions() {
    let isa = selected_isa();
    // Packed batches (the first runs of `fuzz_varlen`, 2026-12-03): an empty last sequence of
    // an empty view with a huge token stride overflowed `packed_seq`'s offset (a panic in the
    // kernels and the reference alike); and 17 queries of width 0 against no keys, whose empty Q
    // view had a huge token stride, overflowed the flash tile's row index.
    VarlenCase::decode(&[
        33, 113, 160, 104, 16, 0, 0, 0, 0, 3, 0, 192, 0, 0, 71, 0, 0, 4, 85, 6, 120, 0, 0, 0, 0,
        100, 0, 0, 0, 0, 0, 0, 136, 0, 0, 0, 56, 98, 1, 0, 0, 0,
    ])
    .check(|a, o| a.run(o))
    .unwrap();
    VarlenCase::decode(&[
        1, 49, 32, 19, 65, 232, 0, 0, 0, 0, 15, 0, 0, 0, 103, 0, 0, 4, 5, 42, 136, 34, 0, 0, 0, 0,
        0, 0, 0, 0, 116, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ])
    .check(|a, o| a.run(o))
    .unwrap();
    // Softmax rows of width 0 with an lse and a huge row stride: the prefetch of the next row
    // computed its index (overflow panic); empty rows now prefetch nothing.
    SoftmaxCase::decode(&[112, 0, 5, 32, 0, 0, 2, 102, 69, 0, 2, 0, 0, 172, 0, 0, 0, 0, 226])
        .check(attn_kernels::softmax::scale_mask_softmax)
        .unwrap();
    let bytes: &[u8] = &[
        103, 80, 12, 3, 2, 165, 59, 62, 104, 131, 34, 128, 235, 158, 161, 24, 50, 40, 2, 8, 230,
        116, 92, 31, 51, 15, 66, 109, 45, 53, 55, 54, 7, 95, 49, 171, 135, 170, 69, 175, 95, 65,
        104, 28, 133, 72, 190, 42, 52, 9, 39, 40, 8, 160, 11, 87, 8, 76, 124, 83, 69, 18, 23, 183,
        20, 200, 89, 1, 34, 35, 113, 61, 123, 31, 9, 181, 176, 27, 92, 56, 33, 106, 29, 81, 68,
        161, 115, 155, 16, 118, 204, 8, 137, 12, 37, 85, 23, 59, 131, 167, 42, 109, 79, 30, 14,
        146, 45, 10, 38, 70, 139, 175, 1, 22, 12, 119, 15, 81, 27, 63, 13, 65, 133, 36, 23, 1, 29,
        69, 34, 206, 52, 105, 4, 14, 11, 245, 192, 24, 18, 68, 43, 62, 74, 182, 9, 3, 150, 57, 141,
        135, 40, 45, 71, 18, 167, 166, 56, 10,
    ];
    AttentionCase::decode(bytes).check(|a, o| a.run(o)).unwrap();
    let bytes: &[u8] = &[
        76, 160, 36, 112, 229, 25, 142, 208, 79, 135, 149, 30, 40, 54, 20, 92, 64, 57, 20, 23, 18,
        155, 91, 159, 54, 66, 52, 168, 82, 11, 188, 93, 71, 250, 42, 13, 240, 63, 71, 82, 0, 116,
        2, 11, 3, 83, 70, 21, 142, 88, 2, 67, 153, 124, 51, 170, 4, 21, 140, 10, 12, 58, 0, 34, 2,
        0, 118, 13, 71, 34, 169, 199, 29, 92, 0, 48, 62, 28, 24, 6, 22, 39, 4, 9, 19, 11, 54, 80,
        12, 56, 109, 71, 74, 19, 179,
    ];
    AttentionCase::decode_single_query(bytes)
        .check(|a, o| a.isa(isa).path(Path::Decode).run(o))
        .unwrap();
    let bytes: &[u8] = &[
        49, 17, 90, 9, 82, 119, 128, 180, 153, 168, 31, 83, 100, 70, 129, 33, 13, 84, 215, 101, 48,
        56, 131, 202, 254, 9, 121, 20, 122, 185, 218, 92, 187, 117, 60, 33, 57, 36, 104, 155, 153,
        175, 200, 3, 178, 54, 214, 222, 184, 71, 188, 194, 72, 232, 199, 56, 80, 119, 165, 87, 236,
        31, 147, 99, 84,
    ];
    AttentionCase::decode(bytes).check(|a, o| a.isa(isa).path(Path::Flash).run(o)).unwrap();
    // Random fuzzing, 2026-12-05: one query, one key hidden by a causal offset of `i64::MIN`,
    // an ALiBi slope of 1e30. The unfused path added the overflowing term (+∞) to the hidden
    // key's −∞: NaN where the reference gives zeros and the sink's logsumexp.
    let bytes: &[u8] = &[
        130, 4, 0, 1, 1, 1, 20, 0, 0, 5, 0, 85, 146, 64, 0, 35, 0, 224, 0, 6, 176, 0, 16, 145, 68,
        0, 0, 0, 0, 0, 163, 0, 140, 0, 0, 45, 0, 0, 204,
    ];
    for path in [Path::Unfused, Path::Flash, Path::Decode] {
        AttentionCase::decode(bytes).check(|a, o| a.isa(isa).path(path).run(o)).unwrap();
    }
    // `fuzz_paged_dot`'s first random run, 2026-12-05: a prefill piece's key block over pages
    // 0, 2, 6, 3 (16 slots each) whose first and last rows happen to be 61 apart for 62 keys;
    // the paired key operand took that for one run of memory and copied rows 0..62.
    if bf16_dot_available() {
        let bytes: &[u8] = &[
            90, 201, 192, 162, 43, 2, 89, 69, 4, 192, 124, 86, 60, 192, 97, 192, 33, 22, 66, 4, 0,
            185, 1, 61, 1, 28, 74, 1, 71, 71, 13, 125, 0, 0, 0, 4, 0, 0, 16,
        ];
        PagedCase::decode_dot(bytes)
            .check(|a, o| a.isa(attn_kernels::Isa::Avx512).half_path(HalfPath::Dot).run(o))
            .unwrap();
    }
}
