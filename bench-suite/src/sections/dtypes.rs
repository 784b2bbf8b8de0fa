//! Element types in attention: decode over K/V caches of f32, f16, bf16 and int8 (Q8), and
//! flash attention with all operands (Q, K, V, O) in bf16 or f16 beside f32. One thread.
//!
//! Decode (1 query × 32 heads × 4096 keys × d 128, with 32 and 8 K/V heads) is bound by the
//! bytes of K/V it reads, so each cache type is measured in GB/s of the bytes it actually
//! holds (`DType::row_bytes`: 4, 2, 2 and 1 + 4/32 bytes per value), each beside a plain read
//! of those very bytes (`read-<type>`: the `decode` section's stream-sum over the same
//! buffers, which hold every cache as f32 words whatever its element type). Targets (issue 21):
//! f16/bf16 time ≤ 0.6× of f32's, int8 ≤ 0.35×, each ≥ 0.85× of its own read. Where the CPU
//! has AVX512_BF16, also bf16 Q and K/V with the scores on `vdpbf16ps` (`kv-bf16-dot`,
//! `HalfPath::Dot`), beside the same read.
//!
//! Flash (h8, d 64 and 128, N 1024 and 4096, causal and not) in bf16 and f16 beside f32, in
//! GFLOP/s of the visible pairs (the `attention` section's count): target ≥ 0.9× of f32. Where
//! the CPU has AVX512_BF16, also bf16 on the `vdpbf16ps` kernel (`bf16-dot`,
//! `HalfPath::Dot`): target ≥ 1.5× of f32.
//!
//! Checks: each cache type on the decode path and each half type on the flash path against the
//! reference on the exact values the stored elements represent (widened, or `fl(q·scale)`, the
//! dequantised value the kernels compute on), with the f32 attention bound (f32 output); the
//! `vdpbf16ps` paths with that bound plus their own terms (the instruction's flushing; on the
//! flash path also the probabilities rounded to bf16: `attn_kernels::attention::Attention`'s
//! docs).

use std::hint::black_box;

use attn_kernels::attention::{Attention, Path};
use attn_kernels::gemm::{bf16_dot_available, HalfPath};
use attn_kernels::{bf16, f16, quantize_q8, AnyRef, DType, KvRef, Parallelism, Q8Mut, Q8Ref};
use attn_reference::attention::default_scale;
use attn_reference::{Mask, Tensor4Layout, TensorMut, TensorRef};
use half::slice::HalfBitsSliceExt;
use wide::bytemuck;

use super::attention::flops;
use super::decode::stream_sum;
use super::{Aligned, Ctx, Work};
use crate::check::{attention_bound, compare, Rng};
use crate::record::Shape;
use attn_tests::numerics::BF16_U;

const OP: &str = "dtypes";

/// A `[batch, heads, seq, d]` tensor stored in one element type, in a buffer of f32 words (so
/// that the plain read of its bytes is the stream-sum of the `decode` section over that very
/// buffer); a Q8 tensor has its scales in a second buffer.
struct Stored {
    ty: DType,
    words: Aligned,
    scales: Vec<f32>,
    layout: Tensor4Layout,
    /// The values the stored elements represent, as f32 (widened, or `fl(q·scale)`).
    exact: Vec<f32>,
}

impl Stored {
    /// `x` (contiguous, `layout`) stored as `ty`.
    fn new(ty: DType, x: &[f32], layout: Tensor4Layout) -> Stored {
        let n = x.len();
        // Exactly the bytes of the values (rounded up to a whole f32 word).
        let mut words = Aligned::zeros((n * ty.value_size()).div_ceil(4));
        let mut scales = Vec::new();
        let exact: Vec<f32> = match ty {
            DType::F32 => {
                words[..n].copy_from_slice(x);
                x.to_vec()
            }
            DType::BF16 => {
                let u: &mut [u16] = bytemuck::cast_slice_mut(&mut words[..]);
                for (w, &v) in u.iter_mut().zip(x) {
                    *w = bf16::from_f32(v).to_bits();
                }
                x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect()
            }
            DType::F16 => {
                let u: &mut [u16] = bytemuck::cast_slice_mut(&mut words[..]);
                for (w, &v) in u.iter_mut().zip(x) {
                    *w = f16::from_f32(v).to_bits();
                }
                x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
            }
            DType::Q8 => {
                let [b, h, s, d] = layout.dims;
                scales = vec![0.0f32; b * h * s * d.div_ceil(32)];
                let q: &mut [i8] = bytemuck::cast_slice_mut(&mut words[..]);
                let dst = Q8Mut::bhsd(&mut q[..n], &mut scales, b, h, s, d);
                quantize_q8(TensorRef::new(x, layout), dst).expect("finite inputs quantise");
                let q: &[i8] = bytemuck::cast_slice(&words[..]);
                (0..n)
                    .map(|i| f32::from(q[i]) * scales[(i / d) * d.div_ceil(32) + (i % d) / 32])
                    .collect()
            }
        };
        Stored { ty, words, scales, layout, exact }
    }

    /// The K/V view of the stored elements.
    fn kv(&self) -> KvRef<'_> {
        let n = self.layout.len();
        match self.ty {
            DType::F32 => TensorRef::new(&self.words[..n], self.layout).into(),
            DType::BF16 => {
                let u: &[u16] = bytemuck::cast_slice(&self.words[..]);
                let b: &[bf16] = u.reinterpret_cast();
                TensorRef::new(&b[..n], self.layout).into()
            }
            DType::F16 => {
                let u: &[u16] = bytemuck::cast_slice(&self.words[..]);
                let h: &[f16] = u.reinterpret_cast();
                TensorRef::new(&h[..n], self.layout).into()
            }
            DType::Q8 => {
                let [b, h, s, d] = self.layout.dims;
                let q: &[i8] = bytemuck::cast_slice(&self.words[..]);
                Q8Ref::bhsd(&q[..n], &self.scales, b, h, s, d).into()
            }
        }
    }

    /// The Q view (a Q8 tensor is never a query).
    fn any(&self) -> AnyRef<'_> {
        match self.kv() {
            KvRef::F32(t) => t.into(),
            KvRef::BF16(t) => t.into(),
            KvRef::F16(t) => t.into(),
            KvRef::Q8(_) => unreachable!("queries are not quantised"),
        }
    }

    /// Bytes a kernel streaming the whole tensor reads (`DType::row_bytes` per row).
    fn bytes(&self) -> f64 {
        let [b, h, s, d] = self.layout.dims;
        (b * h * s * self.ty.row_bytes(d)) as f64
    }
}

/// Runs one problem on `path`, one thread: `q`, `k`, `v` as stored, into `o`.
fn call(
    q: &Stored,
    k: &Stored,
    v: &Stored,
    mask: Mask<'_>,
    (path, half): (Path, HalfPath),
    o: &mut Out,
) -> attn_reference::Result<()> {
    let a = Attention::new(q.any(), k.kv(), v.kv())
        .scale(default_scale(q.layout.dim()))
        .mask(mask)
        .path(path)
        .half_path(half)
        .parallelism(Parallelism::Sequential);
    let l = o.layout;
    match &mut o.data {
        OutData::F32(x) => a.run(TensorMut::new(&mut x[..], l)),
        OutData::BF16(x) => a.run(TensorMut::new(&mut x[..], l)),
        OutData::F16(x) => a.run(TensorMut::new(&mut x[..], l)),
    }
}

/// An output buffer of one element type.
struct Out {
    data: OutData,
    layout: Tensor4Layout,
}

enum OutData {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
}

impl Out {
    fn new(ty: DType, layout: Tensor4Layout) -> Out {
        let n = layout.len();
        let data = match ty {
            DType::BF16 => OutData::BF16(vec![bf16::ZERO; n]),
            DType::F16 => OutData::F16(vec![f16::ZERO; n]),
            _ => OutData::F32(vec![0.0; n]),
        };
        Out { data, layout }
    }
}

fn attn_shape(
    heads: usize,
    kv: usize,
    nq: usize,
    nk: usize,
    d: usize,
    mask: &'static str,
) -> Shape {
    Shape::Attn { batch: 1, heads, kv_heads: kv, nq, nk, dk: d, dv: d, mask }
}

fn imp_name(prefix: &str, ty: DType) -> &'static str {
    match (prefix, ty) {
        ("kv", DType::F32) => "kv-f32",
        ("kv", DType::BF16) => "kv-bf16",
        ("kv", DType::F16) => "kv-f16",
        ("kv", DType::Q8) => "kv-q8",
        ("read", DType::F32) => "read-f32",
        ("read", DType::BF16) => "read-bf16",
        ("read", DType::F16) => "read-f16",
        ("read", DType::Q8) => "read-q8",
        (_, DType::F32) => "f32",
        (_, DType::BF16) => "bf16",
        (_, DType::F16) => "f16",
        (_, DType::Q8) => "q8",
    }
}

/// Checks `path` with Q of `qt`, K/V of `kvt` (f32 output) against the reference on the exact
/// values, with the f32 attention bound (plus the `vdpbf16ps` terms for [`HalfPath::Dot`]).
fn check(
    ctx: &mut Ctx,
    shape: Shape,
    (qt, kvt): (DType, DType),
    (path, half): (Path, HalfPath),
    imp: &'static str,
) {
    let Shape::Attn { heads, kv_heads, nq, nk, dk, mask, .. } = shape else { unreachable!() };
    let (lq, lk) =
        (Tensor4Layout::bhsd(1, heads, nq, dk), Tensor4Layout::bhsd(1, kv_heads, nk, dk));
    let lo = Tensor4Layout::bhsd(1, heads, nq, dk);
    let mut rng = Rng::new(0xd7 + nk as u64);
    let (q, k, v) = (rng.vec(lq.len()), rng.vec(lk.len()), rng.vec(lk.len()));
    let (q, k, v) = (Stored::new(qt, &q, lq), Stored::new(kvt, &k, lk), Stored::new(kvt, &v, lk));
    let m = if mask == "causal" { Mask::Causal { offset: None } } else { Mask::None };
    let scale = default_scale(dk);
    let (mut want, mut w) = (vec![0.0f32; lo.len()], vec![0.0f32; lo.len()]);
    let abs_v: Vec<f32> = v.exact.iter().map(|x| x.abs()).collect();
    let (qe, ke) = (TensorRef::new(&q.exact[..], lq), TensorRef::new(&k.exact[..], lk));
    let r = attn_reference::attention::attention(
        qe,
        ke,
        TensorRef::new(&v.exact[..], lk),
        scale,
        &m,
        TensorMut::new(&mut want, lo),
        None,
    )
    .and_then(|()| {
        let wv = TensorRef::new(&abs_v[..], lk);
        attn_reference::attention::attention(
            qe,
            ke,
            wv,
            scale,
            &m,
            TensorMut::new(&mut w, lo),
            None,
        )
    });
    let mut bound = attention_bound(&qe, &ke, scale, &TensorRef::new(&w, lo));
    if half == HalfPath::Dot {
        // Flushing below 2⁻¹²⁶: each score off by scale·F·(dk + 1 + Σ|q| + Σ|k|), twice that
        // relative to w. The flash path also rounds the probabilities to bf16 (2⁻⁸ of Σ p|v|
        // = w, the other terms on the rounded weights) and flushes in P·V (F·(nk + 2) on each
        // output); decode runs P·V in f32.
        let f = f64::from(f32::MIN_POSITIVE);
        let mx = |x: &[f32]| x.iter().fold(0.0f64, |a, y| a.max(f64::from(y.abs())));
        let delta = f64::from(scale) * f * (dk as f64 * (1.0 + mx(&q.exact) + mx(&k.exact)) + 1.0);
        let pv = path == Path::Flash;
        for (b, &wi) in bound.iter_mut().zip(&w) {
            let wi = f64::from(wi);
            *b += 2.0 * delta * wi;
            if pv {
                *b = *b * (1.0 + BF16_U) + BF16_U * wi + f * (nk as f64 + 2.0);
            }
        }
    }
    let mut o = Out::new(DType::F32, lo);
    let verdict =
        r.and_then(|()| call(&q, &k, &v, m, (path, half), &mut o)).map_err(|e| e.to_string());
    let verdict = verdict.map(|()| match &o.data {
        OutData::F32(got) => compare(got, &want, &bound),
        _ => unreachable!(),
    });
    ctx.check(OP, imp, shape, 1, verdict);
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    for kvt in [DType::F32, DType::BF16, DType::F16, DType::Q8] {
        let sh = attn_shape(8, 2, 1, 301, 64, "none");
        check(ctx, sh, (DType::F32, kvt), (Path::Decode, HalfPath::Auto), imp_name("kv", kvt));
    }
    let flash = attn_shape(2, 1, 67, 130, 64, "causal");
    for t in [DType::BF16, DType::F16] {
        check(ctx, flash.clone(), (t, t), (Path::Flash, HalfPath::Auto), imp_name("", t));
    }
    let dot = bf16_dot_available();
    if dot {
        let t = (DType::BF16, DType::BF16);
        check(ctx, flash, t, (Path::Flash, HalfPath::Dot), "bf16-dot");
        let sh = attn_shape(8, 2, 1, 301, 64, "none");
        check(ctx, sh, t, (Path::Decode, HalfPath::Dot), "kv-bf16-dot");
    }

    // Decode: every cache type beside the read of its own bytes.
    let (heads, nk, d) = if ctx.quick { (8, 512, 64) } else { (32, 4096, 128) };
    for kv_heads in [heads, heads / 4] {
        let shape = attn_shape(heads, kv_heads, 1, nk, d, "none");
        let lk = Tensor4Layout::bhsd(1, kv_heads, nk, d);
        let lq = Tensor4Layout::bhsd(1, heads, 1, d);
        let mut rng = Rng::new((kv_heads * nk) as u64);
        let qx = rng.vec(lq.len());
        let q = Stored::new(DType::F32, &qx, lq);
        let (kx, vx) = (rng.vec(lk.len()), rng.vec(lk.len()));
        let mut o = Out::new(DType::F32, lq);
        for ty in [DType::F32, DType::BF16, DType::F16, DType::Q8] {
            let (k, v) = (Stored::new(ty, &kx, lk), Stored::new(ty, &vx, lk));
            let work = Work::Bytes(k.bytes() + v.bytes());
            ctx.bench(OP, imp_name("kv", ty), shape.clone(), 1, work, None, || {
                call(&q, &k, &v, Mask::None, (Path::Decode, HalfPath::Auto), &mut o)
            });
            if ty == DType::BF16 && dot {
                // bf16 queries too, as `HalfPath::Dot` needs: the scores on `vdpbf16ps`.
                let qb = Stored::new(DType::BF16, &qx, lq);
                ctx.bench(OP, "kv-bf16-dot", shape.clone(), 1, work, None, || {
                    call(&qb, &k, &v, Mask::None, (Path::Decode, HalfPath::Dot), &mut o)
                });
            }
            let bufs: [&[f32]; 4] = [&k.words[..], &v.words[..], &k.scales, &v.scales];
            ctx.bench(OP, imp_name("read", ty), shape.clone(), 1, work, None, || {
                black_box(stream_sum(&bufs, 1));
                Ok::<(), std::convert::Infallible>(())
            });
        }
    }

    // Flash: all operands in one type.
    let (heads, grid): (usize, &[(usize, &[usize])]) = if ctx.quick {
        (2, &[(64, &[128, 256])])
    } else {
        (8, &[(64, &[1024, 4096]), (128, &[1024, 4096])])
    };
    for &(d, sizes) in grid {
        for &n in sizes {
            let l = Tensor4Layout::bhsd(1, heads, n, d);
            let mut rng = Rng::new((n * d) as u64);
            let (qx, kx, vx) = (rng.vec(l.len()), rng.vec(l.len()), rng.vec(l.len()));
            for mask in ["none", "causal"] {
                let m = if mask == "causal" { Mask::Causal { offset: None } } else { Mask::None };
                let shape = attn_shape(heads, heads, n, n, d, mask);
                let work = Work::Flops(flops(heads, n, n, d, d, &m));
                let runs = [
                    (DType::F32, HalfPath::Auto, "f32"),
                    (DType::BF16, HalfPath::Auto, "bf16"),
                    (DType::F16, HalfPath::Auto, "f16"),
                    (DType::BF16, HalfPath::Dot, "bf16-dot"),
                ];
                for (ty, half, imp) in runs {
                    if half == HalfPath::Dot && !dot {
                        continue;
                    }
                    let (q, k, v) =
                        (Stored::new(ty, &qx, l), Stored::new(ty, &kx, l), Stored::new(ty, &vx, l));
                    let mut o = Out::new(ty, l);
                    let plot = Some((format!("dtypes-flash-d{d}-{mask}"), n as f64));
                    ctx.bench(OP, imp, shape.clone(), 1, work, plot, || {
                        call(&q, &k, &v, m, (Path::Flash, half), &mut o)
                    });
                }
            }
        }
    }
}
