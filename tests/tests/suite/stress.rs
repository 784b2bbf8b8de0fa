//! Stress and determinism.
//!
//! - Stress: thousands of random calls (SGEMM, attention through both paths; hostile cases from
//!   the fuzz decoders, errors included) run from several OS threads at once, all sharing the
//!   kernels' cached rayon pools, give bitwise the results the same calls give one at a time.
//! - Determinism (the contract tested here): for a fixed input and a fixed `Parallelism`, results
//!   are bitwise identical run to run, however the pool's threads pick up the work. SGEMM is
//!   moreover bitwise independent of the thread count, and so is every other kernel: softmax,
//!   flash, decode (whose key chunks follow `nk`, not the thread count), unfused attention
//!   (tested at 1, 2, 3 and 8 threads; the layers, built on these, in `layers.rs`).
//!
//! `ATTN_STRESS_CALLS` sets the number of random calls (default 2000).

use attn_kernels::arch::selected;
use attn_kernels::attention::{Attention, Path};
use attn_kernels::gemm::sgemm;
use attn_kernels::Parallelism;
use attn_reference::{MatMut, MatRef, Tensor4Layout, TensorMut, TensorRef};
use attn_tests::attention_support::with_lse;
use attn_tests::fuzz_decode::{AttentionCase, GemmCase, MaskSpec, TensorOperand};

enum Call {
    Gemm(GemmCase),
    Attention(AttentionCase),
    Decode(AttentionCase),
}

/// Output bits (C, or O followed by lse) or the error text.
type Outcome = Result<Vec<u32>, String>;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn exec_attention(c: &AttentionCase, par: Parallelism, decode_path: bool) -> Outcome {
    let mut o = c.o.data.clone();
    let mut lse = c.lse.map(|n| vec![0.0; n]);
    let (q, k, v) = (
        TensorRef::new(&c.q.data, c.q.layout),
        TensorRef::new(&c.k.data, c.k.layout),
        TensorRef::new(&c.v.data, c.v.layout),
    );
    let out = TensorMut::new(&mut o, c.o.layout);
    let mask = c.mask.mask();
    let path = if decode_path { Path::Decode } else { Path::Auto };
    let a = Attention::new(q, k, v).scale(c.scale).mask(mask).parallelism(par).path(path);
    with_lse(a, lse.as_deref_mut()).run(out).map_err(|e| e.to_string())?;
    o.extend(lse.unwrap_or_default());
    Ok(bits(&o))
}

/// Runs a call; a panic (a kernel bug, reported by `hostile.rs` / the fuzz targets) is an outcome
/// too, so this test checks only its own property: concurrent == one at a time.
fn exec(call: &Call, par: Parallelism) -> Outcome {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exec_inner(call, par)))
        .unwrap_or_else(|_| Err("panicked".into()))
}

fn exec_inner(call: &Call, par: Parallelism) -> Outcome {
    match call {
        Call::Gemm(g) => {
            let mut c = g.c.data.clone();
            sgemm(
                g.alpha,
                MatRef::new(&g.a.data, g.a.layout),
                MatRef::new(&g.b.data, g.b.layout),
                g.beta,
                MatMut::new(&mut c, g.c.layout),
                par,
            )
            .map_err(|e| e.to_string())?;
            Ok(bits(&c))
        }
        Call::Attention(a) => exec_attention(a, par, false),
        Call::Decode(a) => exec_attention(a, par, true),
    }
}

fn par_of(call: &Call) -> Parallelism {
    match call {
        Call::Gemm(g) => g.par,
        Call::Attention(a) | Call::Decode(a) => a.par,
    }
}

/// Random calls decoded from a fixed pseudo-random byte stream.
fn calls(n: usize) -> Vec<Call> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut bytes = move |len: usize| -> Vec<u8> {
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    };
    (0..n)
        .map(|i| match i % 3 {
            0 => Call::Gemm(GemmCase::decode(&bytes(64))),
            1 => Call::Attention(AttentionCase::decode(&bytes(64))),
            _ => Call::Decode(AttentionCase::decode_single_query(&bytes(64))),
        })
        .collect()
}

fn n_calls() -> usize {
    std::env::var("ATTN_STRESS_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

#[test]
fn concurrent_calls_equal_one_at_a_time() {
    let calls = calls(n_calls());
    let expected: Vec<Outcome> = calls.iter().map(|c| exec(c, par_of(c))).collect();
    let oks = expected.iter().filter(|r| r.is_ok()).count();
    assert!(oks > calls.len() / 4 && oks < calls.len(), "{oks} of {} calls succeed", calls.len());
    const THREADS: usize = 4;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (calls, expected) = (&calls, &expected);
            s.spawn(move || {
                // each thread walks the calls in its own order: stride coprime with the count
                let n = calls.len();
                let step = [1, 7, 13, 31][t] % n.max(1);
                let step = if step == 0 || gcd(step, n) != 1 { 1 } else { step };
                for i in 0..n {
                    let j = (t * 17 + i * step) % n;
                    let got = exec(&calls[j], par_of(&calls[j]));
                    assert!(got == expected[j], "thread {t}, call {j}: result differs");
                }
            });
        }
    });
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Inputs large enough to take every kernel's threaded path.
fn big_cases() -> (GemmCase, AttentionCase, AttentionCase) {
    let mut s = 7u64;
    let mut vals = move |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    };
    let (m, k, n) = (300, 300, 300);
    let mat = |data: Vec<f32>, r, c| attn_tests::fuzz_decode::MatOperand {
        data,
        layout: attn_reference::MatLayout::row_major(r, c),
    };
    let g = GemmCase {
        alpha: 1.0,
        beta: 0.5,
        a: mat(vals(m * k), m, k),
        b: mat(vals(k * n), k, n),
        c: mat(vals(m * n), m, n),
        par: Parallelism::Sequential,
    };
    let t = |data: Vec<f32>, d: [usize; 4]| TensorOperand {
        data,
        layout: Tensor4Layout::bhsd(d[0], d[1], d[2], d[3]),
    };
    let (h, nq, nk, d) = (4, 200, 700, 64);
    let flash = AttentionCase {
        q: t(vals(h * nq * d), [1, h, nq, d]),
        k: t(vals(h * nk * d), [1, h, nk, d]),
        v: t(vals(h * nk * d), [1, h, nk, d]),
        scale: 0.125,
        mask: MaskSpec::Causal(None),
        o: t(vec![0.0; h * nq * d], [1, h, nq, d]),
        lse: Some(h * nq),
        par: Parallelism::Sequential,
        variants: Default::default(),
    };
    let (h, nk) = (8, 8192);
    let dec = AttentionCase {
        q: t(vals(h * d), [1, h, 1, d]),
        k: t(vals(2 * nk * d), [1, 2, nk, d]),
        v: t(vals(2 * nk * d), [1, 2, nk, d]),
        scale: 0.125,
        mask: MaskSpec::None,
        o: t(vec![0.0; h * d], [1, h, 1, d]),
        lse: Some(h),
        par: Parallelism::Sequential,
        variants: Default::default(),
    };
    (g, flash, dec)
}

#[test]
fn results_are_bitwise_deterministic_per_thread_count() {
    let (g, a, d) = big_cases();
    let (g, a, d) = (Call::Gemm(g), Call::Attention(a), Call::Decode(d));
    for threads in [1, 2, 3] {
        let par = Parallelism::threads(threads);
        for call in [&g, &a, &d] {
            let first = exec(call, par).unwrap();
            for _ in 0..4 {
                assert!(exec(call, par).unwrap() == first, "{threads} threads: run differs");
            }
        }
    }
    // SGEMM: also independent of the thread count
    let seq = exec(&g, Parallelism::Sequential).unwrap();
    assert!(exec(&g, Parallelism::threads(2)).unwrap() == seq);
    assert!(exec(&g, Parallelism::threads(3)).unwrap() == seq);
}

#[test]
fn threaded_results_are_within_the_bound() {
    // Across thread counts (where not bitwise), each result is still the reference's.
    let (g, mut a, mut d) = big_cases();
    let mut g2 = g.clone();
    g2.par = Parallelism::threads(2);
    g2.check(sgemm).unwrap();
    a.par = Parallelism::threads(2);
    a.check(|a, o| a.run(o)).unwrap();
    d.par = Parallelism::threads(2);
    d.check(|a, o| a.path(Path::Decode).run(o)).unwrap();
}

#[test]
fn every_kernel_is_bitwise_identical_across_thread_counts() {
    use attn_kernels::softmax::scale_mask_softmax;
    let (g, a, d) = big_cases();
    // Decode with a GQA group of 4, a key-padding mask and a length that is no multiple of a
    // chunk; softmax over rows long enough to be split.
    let mut dm = d.clone();
    let nk = dm.k.layout.dims[2] - 300;
    dm.k.layout = Tensor4Layout::bhsd(1, 2, nk, 64);
    dm.v.layout = Tensor4Layout::bhsd(1, 2, nk, 64);
    let keep: Vec<bool> = (0..nk).map(|j| j % 7 != 3).collect();
    let bcast = Tensor4Layout { dims: [1, 8, 1, nk], strides: [0, 0, 0, 1], offset: 0 };
    dm.mask = MaskSpec::Keep(keep, bcast);
    let isa = selected();
    let attn = |c: &AttentionCase, path: &str, par: Parallelism| -> Vec<u32> {
        let mut o = c.o.data.clone();
        let mut lse = vec![0.0; c.lse.unwrap()];
        let (q, k, v) = (
            TensorRef::new(&c.q.data, c.q.layout),
            TensorRef::new(&c.k.data, c.k.layout),
            TensorRef::new(&c.v.data, c.v.layout),
        );
        let path = match path {
            "flash" => Path::Flash,
            "decode" => Path::Decode,
            _ => Path::Unfused,
        };
        Attention::new(q, k, v)
            .scale(c.scale)
            .mask(c.mask.mask())
            .lse(&mut lse)
            .parallelism(par)
            .isa(isa)
            .path(path)
            .run(TensorMut::new(&mut o, c.o.layout))
            .unwrap();
        o.extend(lse);
        bits(&o)
    };
    let x = &a.k.data;
    let xl = Tensor4Layout::bhsd(2, 2, 350, 64);
    let softmax = |par| {
        let mut y = vec![0.0; xl.len()];
        let mut lse = vec![0.0; 2 * 2 * 350];
        let mask = attn_reference::Mask::CAUSAL;
        let (xr, yr) = (TensorRef::new(&x[..xl.len()], xl), TensorMut::new(&mut y, xl));
        scale_mask_softmax(xr, 0.3, &mask, yr, Some(&mut lse), par).unwrap();
        y.extend(lse);
        bits(&y)
    };
    let gemm = Call::Gemm(g);
    let base = (
        exec(&gemm, Parallelism::Sequential).unwrap(),
        softmax(Parallelism::Sequential),
        attn(&a, "flash", Parallelism::Sequential),
        attn(&d, "decode", Parallelism::Sequential),
        attn(&dm, "decode", Parallelism::Sequential),
        attn(&a, "unfused", Parallelism::Sequential),
    );
    for threads in [2, 3, 8] {
        let par = Parallelism::threads(threads);
        assert!(exec(&gemm, par).unwrap() == base.0, "sgemm, {threads} threads");
        assert!(softmax(par) == base.1, "softmax, {threads} threads");
        assert!(attn(&a, "flash", par) == base.2, "flash, {threads} threads");
        assert!(attn(&d, "decode", par) == base.3, "decode, {threads} threads");
        assert!(attn(&dm, "decode", par) == base.4, "masked decode, {threads} threads");
        assert!(attn(&a, "unfused", par) == base.5, "unfused, {threads} threads");
    }
}
