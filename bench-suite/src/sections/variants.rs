//! Attention variants (sliding window, logit softcap, sinks, ALiBi), each beside plain
//! attention in the same run, batch 1, 8 heads, d = 64 unless said:
//!
//! - sliding window `w` (Mistral's: causal, `w − 1` keys back) at N = 8192 (d 64 and 128) and
//!   N = 32768 (d 64) for w = 1024 and 4096, beside full causal attention at N = 8192, in
//!   useful GFLOP/s (visible pairs only, so the two rates compare directly: the target is
//!   ≥ 0.85× of full causal);
//! - softcap 50 at N = 2048, sinks and ALiBi at N = 2048 causal, each timed in alternating
//!   calls with the plain kernel on the same operands (`plain` in the ratios);
//! - masks given as data at N = 2048, alternating with the plain kernel the same way: key
//!   padding as a bias and as a keep-mask, a full per-head bias and a keep-mask over every
//!   (query, key) pair;
//! - decode with a window of 1024 over a 32768-key cache (32 heads, d = 128), beside decode
//!   over a cache of just those 1024 keys (`dense-w` in the ratios: the target is that a
//!   window costs what its keys cost), in GB/s of the K/V bytes the window reads.

use attn_kernels::attention::Path;
use attn_kernels::{alibi_slopes, Variants};
use attn_reference::{Mask, Tensor4Layout, TensorMut, TensorRef};

use super::attention::Problem;
use super::{Call, Ctx, Work};
use crate::check::{attention_bound, compare, Rng};
use crate::record::Shape;

const OP: &str = "variants";

fn shape(heads: usize, nq: usize, nk: usize, d: usize, mask: &'static str) -> Shape {
    Shape::Attn { batch: 1, heads, kv_heads: heads, nq, nk, dk: d, dv: d, mask }
}

/// Useful FLOPs of `p` under a window `(left, 0)` and its causal mask: visible pairs only.
fn window_flops(p: &Problem, left: usize) -> f64 {
    let Shape::Attn { heads, nq, nk, dk, dv, .. } = p.shape else { unreachable!() };
    let off = nk as i128 - nq as i128;
    let pairs: i128 = (0..nq as i128)
        .map(|i| {
            let hi = (i + off).min(nk as i128 - 1);
            let lo = (i + off - left as i128).max(0);
            (hi - lo + 1).max(0)
        })
        .sum();
    pairs as f64 * heads as f64 * 2.0 * (dk + dv) as f64
}

/// Checks our kernel with every variant at once (window, softcap, sinks, ALiBi) against the
/// reference, on every path, with the plain attention bound widened by the softcap's error
/// and the ALiBi term's roundings.
fn check(ctx: &mut Ctx) {
    let sh = shape(4, 67, 130, 64, "causal+w40+softcap+sinks+alibi");
    let p = Problem::new(sh.clone(), 0x7a71);
    let (sinks, slopes) = (vec![0.5f32, -1.0, 2.0, 0.0], alibi_slopes(4));
    let var = Variants::NONE.window(40, 0).softcap(5.0).sinks(&sinks).alibi(&slopes);
    let Shape::Attn { heads, nq, nk, dk, .. } = sh else { unreachable!() };
    let lq = attn_reference::Tensor4Layout::bhsd(1, heads, nq, dk);
    let lk = attn_reference::Tensor4Layout::bhsd(1, heads, nk, dk);
    let (q, k, v) = p.qkv();
    let mask = Mask::Causal { offset: None };
    let mut want = vec![0.0f32; p.out_len()];
    let mut w = vec![0.0f32; p.out_len()];
    let abs_v: Vec<f32> = v.iter().map(|x| x.abs()).collect();
    let reference = |v: &[f32], o: &mut [f32]| {
        attn_reference::attention::attention_with_variants(
            TensorRef::new(q, lq),
            TensorRef::new(k, lk),
            TensorRef::new(v, lk),
            p.scale,
            &mask,
            &var,
            TensorMut::new(o, lq),
            None,
        )
    };
    if let Err(e) = reference(v, &mut want).and_then(|()| reference(&abs_v, &mut w)) {
        ctx.check(OP, "reference", sh, 1, Err(e.to_string()));
        return;
    }
    let mut bound = attention_bound(
        &TensorRef::new(q, lq),
        &TensorRef::new(k, lk),
        p.scale,
        &TensorRef::new(&w, lq),
    );
    // The softcap's error and the ALiBi term (two roundings of at most |slope|·nk) enter each
    // logit; a logit error δ moves the output by at most 2δ relative to Σ p|v| = w.
    let alibi_max = slopes.iter().fold(0.0f64, |a, s| a.max(f64::from(s.abs()))) * nk as f64;
    let delta = attn_tests::numerics::softcap_error(5.0) + 4.0 * crate::check::U * alibi_max;
    for (b, wi) in bound.iter_mut().zip(&w) {
        *b += 2.0 * delta * f64::from(*wi);
    }
    for (name, path) in
        [("flash", Path::Flash), ("decode", Path::Decode), ("unfused", Path::Unfused)]
    {
        for &t in &ctx.threads.clone() {
            let mut got = vec![f32::NAN; p.out_len()];
            let verdict = p
                .run_variants(&var, path, &mut got, t)
                .map(|()| compare(&got, &want, &bound))
                .map_err(|e| e.to_string());
            ctx.check(OP, name, sh.clone(), t, verdict);
        }
    }
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    check(ctx);
    let (heads, d) = (if ctx.quick { 2 } else { 8 }, 64);
    let threads = ctx.threads.clone();

    // Sliding window against full causal attention, useful GFLOP/s each. Full causal
    // attention at N = 32768 (8 s a call at d 64) is left out: its rate at N = 8192 stands in
    // (the flash rate is flat or still rising with N beyond 4096).
    let sizes: &[(usize, usize, bool)] = if ctx.quick {
        &[(1024, 64, true)]
    } else {
        &[(8192, 64, true), (8192, 128, true), (32768, 64, false)]
    };
    let windows: &[usize] = if ctx.quick { &[128] } else { &[1024, 4096] };
    for &(n, d, with_full) in sizes {
        let full = Problem::new(shape(heads, n, n, d, "causal"), 0x5717);
        let mut o = vec![0.0f32; full.out_len()];
        for &t in &threads {
            if with_full {
                let work = Work::Flops(full.flops());
                ctx.bench(OP, "attn-kernels", full.shape.clone(), t, work, None, || {
                    full.run_variants(&Variants::NONE, Path::Flash, &mut o, t)
                });
            }
            for &w in windows {
                let label = match w {
                    1024 => "causal+window1024",
                    4096 => "causal+window4096",
                    _ => "causal+window128",
                };
                let p = Problem::new(shape(heads, n, n, d, label), 0x5717);
                let var = Variants::NONE.window(w - 1, 0);
                let work = Work::Flops(window_flops(&p, w - 1));
                ctx.bench(OP, "attn-kernels", p.shape.clone(), t, work, None, || {
                    p.run_variants(&var, Path::Flash, &mut o, t)
                });
            }
        }
    }

    // Softcap, sinks and ALiBi, each alternating with the plain kernel on the same operands.
    let n = if ctx.quick { 256 } else { 2048 };
    let sinks: Vec<f32> = (0..heads).map(|h| 0.25 * h as f32 - 1.0).collect();
    let slopes = alibi_slopes(heads);
    let cases: [(&'static str, Variants<'_>); 3] = [
        ("softcap50", Variants::NONE.softcap(50.0)),
        ("causal+sinks", Variants::NONE.sinks(&sinks)),
        ("causal+alibi", Variants::NONE.alibi(&slopes)),
    ];
    for (label, var) in cases {
        let p = Problem::new(shape(heads, n, n, d, label), 0x50f7);
        let work = Work::Flops(p.flops());
        let (mut o1, mut o2) = (vec![0.0f32; p.out_len()], vec![0.0f32; p.out_len()]);
        for &t in &threads {
            let mut ours =
                || p.run_variants(&var, Path::Flash, &mut o1, t).map_err(|e| e.to_string());
            let mut plain = || {
                p.run_variants(&Variants::NONE, Path::Flash, &mut o2, t).map_err(|e| e.to_string())
            };
            let imps: &mut [(&'static str, Call<'_>)] =
                &mut [("attn-kernels", &mut ours), ("plain", &mut plain)];
            ctx.bench_alternating(OP, p.shape.clone(), t, work, None, imps);
        }
    }

    // Masks given as data, each alternating with the unmasked kernel on the same operands: a
    // key-padding bias (one value per key, 0 or −∞ for the last eighth) and the same padding
    // as a keep-mask (whose hidden blocks the kernel skips), a full per-head bias
    // (`[1, h, N, N]`, as a relative-position bias is), and a keep-mask over every (query,
    // key) pair shared by the heads (`[1, 1, N, N]`, about one pair in ten hidden).
    let lk = |strides| Tensor4Layout::strided([1, heads, n, n], strides, 0);
    let pad: Vec<f32> =
        (0..n).map(|j| if j < n - n / 8 { 0.0 } else { f32::NEG_INFINITY }).collect();
    let full = Rng::new(0xb1a5).vec(heads * n * n);
    let keep: Vec<bool> = (0..n * n).map(|x| (x / n * 7 + x % n * 13) % 10 != 0).collect();
    let pad_keep: Vec<bool> = pad.iter().map(|&b| b == 0.0).collect();
    let masks: [(&'static str, Mask<'_>); 4] = [
        ("keypad-bias", Mask::Bias { bias: &pad, layout: lk([0, 0, 0, 1]) }),
        ("keypad", Mask::key_padding(&pad_keep, 1, heads, n, n)),
        ("bias", Mask::Bias { bias: &full, layout: lk([heads * n * n, n * n, n, 1]) }),
        ("keep", Mask::Keep { keep: &keep, layout: lk([0, 0, n, 1]) }),
    ];
    for (label, mask) in masks {
        let p = Problem::new(shape(heads, n, n, d, label), 0x50f7);
        let work = Work::Flops(p.flops());
        let (mut o1, mut o2) = (vec![0.0f32; p.out_len()], vec![0.0f32; p.out_len()]);
        let none = Variants::NONE;
        for &t in &threads {
            let mut ours = || p.run_masked(&mask, &none, Path::Flash, &mut o1, t);
            let mut ours = || ours().map_err(|e| e.to_string());
            let mut plain =
                || p.run_variants(&none, Path::Flash, &mut o2, t).map_err(|e| e.to_string());
            let imps: &mut [(&'static str, Call<'_>)] =
                &mut [("attn-kernels", &mut ours), ("plain", &mut plain)];
            ctx.bench_alternating(OP, p.shape.clone(), t, work, None, imps);
        }
    }

    // Windowed decode over a long cache against dense decode over the window's keys.
    let (heads, nk, w, d) = if ctx.quick { (8, 4096, 256, 64) } else { (32, 32768, 1024, 128) };
    let long = Problem::new(shape(heads, 1, nk, d, "window"), 0xdec0);
    let dense = Problem::new(shape(heads, 1, w, d, "none"), 0xdec0);
    let var = Variants::NONE.window(w - 1, 0);
    let sh = shape(heads, 1, nk, d, if w == 1024 { "window1024" } else { "window256" });
    let work = Work::Bytes(dense.kv_bytes());
    let (mut o1, mut o2) = (vec![0.0f32; long.out_len()], vec![0.0f32; dense.out_len()]);
    for &t in &threads {
        let mut ours =
            || long.run_variants(&var, Path::Decode, &mut o1, t).map_err(|e| e.to_string());
        let mut plain = || {
            dense.run_variants(&Variants::NONE, Path::Decode, &mut o2, t).map_err(|e| e.to_string())
        };
        let imps: &mut [(&'static str, Call<'_>)] =
            &mut [("attn-kernels", &mut ours), ("dense-w", &mut plain)];
        ctx.bench_alternating(OP, sh.clone(), t, work, None, imps);
    }
}
