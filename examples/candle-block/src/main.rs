//! A small attention block (`x → Q, K, V projections → causal multi-head attention → output
//! projection`, random weights) run through candle on CPU tensors twice: attention written in
//! candle ops (scores, mask, softmax, `P·V`, as a candle model does it), and attention as one
//! `CustomOp3` backed by `attn_kernels::attention::Attention`. Checks that the outputs agree
//! and times both.
//!
//! Usage: `candle-block [n_tokens] [threads]` (defaults 1024 and 1). Candle's own matmuls use
//! rayon's global pool: set `RAYON_NUM_THREADS` to the same count (run.sh does).

use std::time::Instant;

use attn_kernels::attention::Attention;
use attn_kernels::{Mask, Parallelism, Tensor4Layout, TensorMut, TensorRef};
use candle_core::{CpuStorage, CustomOp3, Device, Layout, Result, Shape, Tensor, D};

/// Causal attention of `q: [b, n, h, d]`, `k`, `v` (candle's layout before any transpose)
/// into a contiguous `[b, n, h, d]` output, by `attn-kernels`.
struct FlashAttention {
    threads: usize,
}

/// A candle layout `[b, n, h, d]` (any strides) as our `[b, h, n, d]` view.
fn view(l: &Layout) -> Result<Tensor4Layout> {
    let (dims, strides) = (l.shape().dims(), l.stride());
    if dims.len() != 4 {
        candle_core::bail!("attention operands are [batch, seq, heads, dim], got {dims:?}");
    }
    Ok(Tensor4Layout::strided(
        [dims[0], dims[2], dims[1], dims[3]],
        [strides[0], strides[2], strides[1], strides[3]],
        l.start_offset(),
    ))
}

fn f32s<'a>(s: &'a CpuStorage, what: &str) -> Result<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => Ok(v),
        _ => candle_core::bail!("{what}: f32 tensors only"),
    }
}

impl CustomOp3 for FlashAttention {
    fn name(&self) -> &'static str {
        "attn-kernels-attention"
    }

    fn cpu_fwd(
        &self,
        sq: &CpuStorage,
        lq: &Layout,
        sk: &CpuStorage,
        lk: &Layout,
        sv: &CpuStorage,
        lv: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (q, k, v) = (f32s(sq, "q")?, f32s(sk, "k")?, f32s(sv, "v")?);
        let (vq, vk, vv) = (view(lq)?, view(lk)?, view(lv)?);
        let [b, h, n, _] = vq.dims;
        let dv = vv.dims[3];
        // The output `[b, n, h, dv]`, contiguous, seen as `[b, h, n, dv]`.
        let lo = Tensor4Layout::strided([b, h, n, dv], [n * h * dv, dv, h * dv, 1], 0);
        let mut o = vec![0.0f32; b * n * h * dv];
        Attention::new(TensorRef::new(q, vq), TensorRef::new(k, vk), TensorRef::new(v, vv))
            .mask(Mask::CAUSAL)
            .parallelism(Parallelism::threads(self.threads))
            .run(TensorMut::new(&mut o, lo))
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok((CpuStorage::F32(o), Shape::from((b, n, h, dv))))
    }
}

/// The block's weights, `[in, out]` each.
struct Block {
    heads: usize,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
}

impl Block {
    fn new(d_model: usize, heads: usize, dev: &Device) -> Result<Block> {
        let w =
            || Tensor::randn(0f32, (1.0 / d_model as f64).sqrt() as f32, (d_model, d_model), dev);
        Ok(Block { heads, wq: w()?, wk: w()?, wv: w()?, wo: w()? })
    }

    /// `x: [b, n, d_model]` → `[b, n, d_model]`; `ours` selects the attention.
    fn forward(&self, x: &Tensor, ours: Option<&FlashAttention>) -> Result<Tensor> {
        let (b, n, dm) = x.dims3()?;
        let (h, dh) = (self.heads, dm / self.heads);
        let proj = |w: &Tensor| x.reshape((b * n, dm))?.matmul(w)?.reshape((b, n, h, dh));
        let (q, k, v) = (proj(&self.wq)?, proj(&self.wk)?, proj(&self.wv)?);
        let o = match ours {
            Some(op) => q.apply_op3_no_bwd(&k, &v, op)?,
            None => candle_attention(&q, &k, &v)?,
        };
        o.reshape((b * n, dm))?.matmul(&self.wo)?.reshape((b, n, dm))
    }
}

/// Causal attention in candle ops, as a candle model writes it: heads first, scores, a −∞
/// mask above the diagonal, a stable softmax, `P·V`.
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (_, n, _, dh) = q.dims4()?;
    let (q, k, v) = (
        q.transpose(1, 2)?.contiguous()?,
        k.transpose(1, 2)?.contiguous()?,
        v.transpose(1, 2)?.contiguous()?,
    );
    let s = (q.matmul(&k.t()?)? * (1.0 / (dh as f64).sqrt()))?;
    let mask: Vec<f32> =
        (0..n * n).map(|x| if x % n > x / n { f32::NEG_INFINITY } else { 0.0 }).collect();
    let s = s.broadcast_add(&Tensor::from_vec(mask, (n, n), q.device())?)?;
    let m = s.max_keepdim(D::Minus1)?;
    let e = s.broadcast_sub(&m)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v)?.transpose(1, 2)?.contiguous()
}

/// Median seconds of `reps` calls of `f` (after one warm-up call).
fn time(reps: usize, mut f: impl FnMut() -> Result<Tensor>) -> Result<f64> {
    f()?;
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f().map(|_| s.elapsed().as_secs_f64())
        })
        .collect::<Result<_>>()?;
    t.sort_by(f64::total_cmp);
    Ok(t[reps / 2])
}

fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (n, threads) = (args.first().copied().unwrap_or(1024), args.get(1).copied().unwrap_or(1));
    let (d_model, heads) = (512, 8);
    let dev = Device::Cpu;
    let block = Block::new(d_model, heads, &dev)?;
    let x = Tensor::randn(0f32, 1.0, (1, n, d_model), &dev)?;
    let op = FlashAttention { threads };
    let plain = block.forward(&x, None)?;
    let ours = block.forward(&x, Some(&op))?;
    let diff = (&plain - &ours)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    let scale = plain.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    // A sanity check, not the equivalence proof (that is the test suite's, against the f64
    // reference): the two f32 attentions round differently, by far less than this.
    let agree = diff <= 1e-4 * scale.max(1.0);
    let reps = if n >= 2048 { 3 } else { 7 };
    let t_plain = time(reps, || block.forward(&x, None))?;
    let t_ours = time(reps, || block.forward(&x, Some(&op)))?;
    println!(
        "candle-block: n {n} d_model {d_model} heads {heads} causal, {threads} thread(s): \
         candle attention {:.2} ms, with attn-kernels {:.2} ms ({:.2}× faster); \
         max |diff| {diff:.2e} (output max {scale:.2}) {}",
        t_plain * 1e3,
        t_ours * 1e3,
        t_plain / t_ours,
        if agree { "agree" } else { "DISAGREE" }
    );
    if !agree {
        std::process::exit(1);
    }
    Ok(())
}
