//! Attention `O = softmax(scale·Q·Kᵀ + mask)·V`, prefill shapes: batch 1, 8 heads, d = 64 at
//! N = 512–4096 and d = 128 at N = 1024–2048, with and without the causal mask. Our kernel (the flash path) beside the
//! unfused path (scores materialised per head, then softmax, then `P·V`) and the reference at
//! the smallest size. FLOPs count 2·(d_k + d_v) per visible (query, key) pair, so a causal
//! figure is in useful FLOP/s. Also home of the attention check shared with `decode`.

use attn_kernels::attention::{Attention, Path};
use attn_kernels::{Parallelism, Variants};
use attn_reference::attention::default_scale;
use attn_reference::{Mask, Result, Tensor4Layout, TensorMut, TensorRef};

use super::{Aligned, Ctx, Work};
use crate::check::{attention_bound, compare, Rng};
use crate::record::Shape;

const OP: &str = "attention";
/// The unfused path is timed up to this sequence length: it materialises an N×N score matrix
/// per head and thread (64 MiB at N = 4096), and timing it at 4096 too would push the default
/// report past its 3-minute budget on a loaded 2-core machine.
const UNFUSED_MAX_N: usize = 2048;

/// One implementation: `o = attention(q, k, v)` on `threads` threads.
pub struct Impl {
    /// Name in the tables.
    pub name: &'static str,
    /// False: measured at one thread only.
    pub threaded: bool,
    /// The call.
    pub call: Call,
}

/// `(q, k, v, scale, mask, o, threads)`.
pub type Call = fn(
    TensorRef<'_>,
    TensorRef<'_>,
    TensorRef<'_>,
    f32,
    &Mask<'_>,
    TensorMut<'_>,
    usize,
) -> Result<()>;

/// Ours (the default path: decode for few queries, flash otherwise), the unfused path, the
/// reference.
pub const IMPLS: &[Impl] = &[
    Impl {
        name: "attn-kernels",
        threaded: true,
        call: |q, k, v, s, m, o, t| {
            Attention::new(q, k, v).scale(s).mask(*m).parallelism(Parallelism::threads(t)).run(o)
        },
    },
    Impl {
        name: "unfused",
        threaded: true,
        call: |q, k, v, s, m, o, t| {
            let a = Attention::new(q, k, v).scale(s).mask(*m).path(Path::Unfused);
            a.parallelism(Parallelism::threads(t)).run(o)
        },
    },
    Impl {
        name: "reference",
        threaded: false,
        call: |q, k, v, s, m, o, _| attn_reference::attention::attention(q, k, v, s, m, o, None),
    },
];

/// Operands of one attention problem, contiguous `[batch, heads, seq, dim]`.
pub struct Problem {
    /// Sizes and mask, as recorded.
    pub shape: Shape,
    q: Aligned,
    k: Aligned,
    v: Aligned,
    lq: Tensor4Layout,
    lk: Tensor4Layout,
    lv: Tensor4Layout,
    lo: Tensor4Layout,
    /// The mask.
    pub mask: Mask<'static>,
    /// The score scale, 1/√d_k.
    pub scale: f32,
}

impl Problem {
    /// Random operands in [−1, 1) for a shape (which must be [`Shape::Attn`]); the mask is
    /// causal with the default (bottom-right) offset when the shape's mask starts with
    /// "causal" (the variants section names its variants after it). A shape whose mask is
    /// "bshd" (no mask) stores K and V sequence-major (`Problem::kv_seq_major`); its values
    /// are those of the same shape with mask "none" and the same seed.
    pub fn new(shape: Shape, seed: u64) -> Problem {
        let Shape::Attn { batch, heads, kv_heads, nq, nk, dk, dv, mask } = shape else {
            unreachable!("attention problems have attention shapes")
        };
        let lq = Tensor4Layout::bhsd(batch, heads, nq, dk);
        let lk = Tensor4Layout::bhsd(batch, kv_heads, nk, dk);
        let lv = Tensor4Layout::bhsd(batch, kv_heads, nk, dv);
        let lo = Tensor4Layout::bhsd(batch, heads, nq, dv);
        let mut rng = Rng::new(seed);
        let seq_major = mask == "bshd";
        let p = Problem {
            q: Aligned::copy_of(&rng.vec(lq.len())),
            k: Aligned::copy_of(&rng.vec(lk.len())),
            v: Aligned::copy_of(&rng.vec(lv.len())),
            lq,
            lk,
            lv,
            lo,
            mask: if mask.starts_with("causal") {
                Mask::Causal { offset: None }
            } else {
                Mask::None
            },
            scale: default_scale(dk),
            shape,
        };
        if seq_major {
            p.kv_seq_major()
        } else {
            p
        }
    }

    /// The same problem with K and V stored sequence-major, `[batch, seq, kv_heads, dim]` (an
    /// engine's cache: the heads of one token side by side), holding the same values at the
    /// same logical indexes, so every implementation computes the same result.
    fn kv_seq_major(mut self) -> Problem {
        fn relay(x: &[f32], l: Tensor4Layout) -> (Aligned, Tensor4Layout) {
            let [b, h, s, d] = l.dims;
            let to = Tensor4Layout::strided(l.dims, [s * h * d, d, h * d, 1], 0);
            let mut y = Aligned::zeros(x.len());
            for bi in 0..b {
                for hi in 0..h {
                    for si in 0..s {
                        for di in 0..d {
                            y[to.index(bi, hi, si, di)] = x[l.index(bi, hi, si, di)];
                        }
                    }
                }
            }
            (y, to)
        }
        (self.k, self.lk) = relay(&self.k, self.lk);
        (self.v, self.lv) = relay(&self.v, self.lv);
        self
    }

    /// Elements of the output.
    pub fn out_len(&self) -> usize {
        self.lo.len()
    }

    /// Runs `imp` into `o`.
    pub fn run(&self, imp: &Impl, o: &mut [f32], threads: usize) -> Result<()> {
        (imp.call)(
            TensorRef::new(&self.q, self.lq),
            TensorRef::new(&self.k, self.lk),
            TensorRef::new(&self.v, self.lv),
            self.scale,
            &self.mask,
            TensorMut::new(o, self.lo),
            threads,
        )
    }

    /// Runs our kernel on `path` with `variants` into `o`.
    pub fn run_variants(
        &self,
        variants: &Variants<'_>,
        path: Path,
        o: &mut [f32],
        threads: usize,
    ) -> Result<()> {
        self.run_masked(&self.mask, variants, path, o, threads)
    }

    /// [`run_variants`](Self::run_variants) with `mask` in place of the problem's own.
    pub fn run_masked(
        &self,
        mask: &Mask<'_>,
        variants: &Variants<'_>,
        path: Path,
        o: &mut [f32],
        threads: usize,
    ) -> Result<()> {
        Attention::new(
            TensorRef::new(&self.q, self.lq),
            TensorRef::new(&self.k, self.lk),
            TensorRef::new(&self.v, self.lv),
        )
        .scale(self.scale)
        .mask(*mask)
        .variants(*variants)
        .path(path)
        .parallelism(Parallelism::threads(threads))
        .run(TensorMut::new(o, self.lo))
    }

    /// FLOPs of one call: see [`flops`].
    pub fn flops(&self) -> f64 {
        let [batch, heads, nq, dk] = self.lq.dims;
        flops(batch * heads, nq, self.lk.seq(), dk, self.lv.dim(), &self.mask)
    }

    /// Bytes of K and V (what a decode step must stream).
    pub fn kv_bytes(&self) -> f64 {
        4.0 * (self.lk.len() + self.lv.len()) as f64
    }

    /// The Q, K and V buffers.
    pub fn qkv(&self) -> (&[f32], &[f32], &[f32]) {
        (&self.q, &self.k, &self.v)
    }

    /// The K and V buffers (the bytes [`Problem::kv_bytes`] counts).
    pub fn kv(&self) -> (&[f32], &[f32]) {
        (&self.k, &self.v)
    }
}

/// (Query, key) pairs of one head that `mask` leaves visible: all `nq·nk` but for a causal mask,
/// which shows query `i` the keys `j ≤ i + offset` (other masks are data and count in full).
fn visible_pairs(nq: usize, nk: usize, mask: &Mask<'_>) -> usize {
    match *mask {
        Mask::Causal { offset } => {
            let off = Mask::causal_offset(offset, nq, nk);
            (0..nq).map(|i| (i as isize + off + 1).clamp(0, nk as isize) as usize).sum()
        }
        _ => nq * nk,
    }
}

/// FLOPs of attention over `heads` (batch × heads) score matrices: 2·(d_k + d_v) per visible
/// (query, key) pair, one multiply-add per element of `q_i·k_j` and of `p_ij·v_j`; the scale,
/// max, exp and normalisation are not counted, so a causal figure is in useful FLOP/s.
pub fn flops(heads: usize, nq: usize, nk: usize, dk: usize, dv: usize, mask: &Mask<'_>) -> f64 {
    (visible_pairs(nq, nk, mask) * heads) as f64 * 2.0 * (dk + dv) as f64
}

/// Checks every implementation but the reference against the reference on `shapes`, at each
/// thread count, with the bound of [`attention_bound`].
pub fn check_all(ctx: &mut Ctx, op: &'static str, shapes: &[Shape]) {
    for (n, shape) in shapes.iter().enumerate() {
        let p = Problem::new(shape.clone(), 0xa77e + n as u64);
        let reference = IMPLS.iter().find(|i| i.name == "reference");
        let mut want = vec![0.0; p.out_len()];
        let mut w = vec![0.0; p.out_len()];
        let abs_v: Vec<f32> = p.v.iter().map(|x| x.abs()).collect();
        let r = reference.map_or(Ok(()), |imp| p.run(imp, &mut want, 1)).and_then(|()| {
            // w = Σ_j p_ij·|v_j|: the reference attention of |V|.
            attn_reference::attention::attention(
                TensorRef::new(&p.q, p.lq),
                TensorRef::new(&p.k, p.lk),
                TensorRef::new(&abs_v, p.lv),
                p.scale,
                &p.mask,
                TensorMut::new(&mut w, p.lo),
                None,
            )
        });
        if let Err(e) = r {
            ctx.check(op, "reference", shape.clone(), 1, Err(e.to_string()));
            continue;
        }
        let (q, k) = (TensorRef::new(&p.q, p.lq), TensorRef::new(&p.k, p.lk));
        let bound = attention_bound(&q, &k, p.scale, &TensorRef::new(&w, p.lo));
        for imp in IMPLS.iter().filter(|i| i.name != "reference") {
            for &t in ctx.threads.clone().iter().filter(|&&t| t == 1 || imp.threaded) {
                let mut got = vec![f32::NAN; p.out_len()];
                let v = p
                    .run(imp, &mut got, t)
                    .map(|()| compare(&got, &want, &bound))
                    .map_err(|e| e.to_string());
                ctx.check(op, imp.name, shape.clone(), t, v);
            }
        }
    }
}

fn attn_shape(
    heads: usize,
    kv_heads: usize,
    nq: usize,
    nk: usize,
    d: usize,
    mask: &'static str,
) -> Shape {
    Shape::Attn { batch: 1, heads, kv_heads, nq, nk, dk: d, dv: d, mask }
}

/// Runs the section.
pub fn run(ctx: &mut Ctx) {
    // Odd sizes (not multiples of any tile), GQA, cross-attention with the bottom-right causal
    // offset, d_k ≠ d_v.
    let checks = [
        attn_shape(4, 2, 67, 130, 64, "none"),
        attn_shape(4, 2, 67, 130, 64, "causal"),
        Shape::Attn {
            batch: 2,
            heads: 2,
            kv_heads: 1,
            nq: 33,
            nk: 95,
            dk: 40,
            dv: 24,
            mask: "causal",
        },
    ];
    check_all(ctx, OP, &checks);
    // d = 64 over the whole range; d = 128 where the targets are set (N ≥ 1024) but not at
    // 4096, whose calls alone would take a third of the report's time on this machine.
    let grid: &[(usize, &[usize])] = if ctx.quick {
        &[(64, &[128, 256])]
    } else {
        &[(64, &[512, 1024, 2048, 4096]), (128, &[1024, 2048])]
    };
    let heads = if ctx.quick { 2 } else { 8 };
    let (first_d, first_n) = (grid[0].0, grid[0].1[0]);
    for &(d, sizes) in grid {
        for mask in ["none", "causal"] {
            for &n in sizes {
                let p = Problem::new(attn_shape(heads, heads, n, n, d, mask), (n * d) as u64);
                let mut o = vec![0.0f32; p.out_len()];
                let work = Work::Flops(p.flops());
                let group = format!("attention-d{d}-{mask}");
                for &t in &ctx.threads.clone() {
                    for imp in IMPLS {
                        // The reference (f64, one score at a time) only at the smallest case.
                        let skip = match imp.name {
                            "reference" => n != first_n || d != first_d || mask != "none",
                            "unfused" => n > UNFUSED_MAX_N,
                            _ => false,
                        };
                        if (t > 1 && !imp.threaded) || skip {
                            continue;
                        }
                        let plot = Some((group.clone(), n as f64));
                        ctx.bench(OP, imp.name, p.shape.clone(), t, work, plot, || {
                            p.run(imp, &mut o, t)
                        });
                    }
                }
            }
        }
    }
}
