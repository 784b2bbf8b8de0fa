//! An engine-side forward pass of one encoder layer, using only the public API of
//! `attn-kernels`: weights stored as PyTorch stores them (`in_proj_weight: [3d, d]`,
//! `Linear.weight: [out, in]`) and seen through transposed views (no copy), one workspace
//! allocated up front and reused by every call, a key-padding mask for a padded batch.
//!
//! `cargo run --release -p attn-kernels --example encoder_layer`

use std::time::Instant;

use attn_kernels::layers::{
    add_positional_encoding, Activation, EncoderConfig, EncoderLayer, EncoderWeights,
    FeedForwardWeights, LayerNormWeights, MatRef, MhaConfig, MhaWeights, PositionalEncoding,
    TensorMut, TensorRef,
};
use attn_kernels::{Mask, MatLayout, Parallelism, Result, Tensor4Layout, Variants};

/// Deterministic stand-in for weights loaded from a checkpoint.
fn fill(len: usize, seed: u32, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A PyTorch `[out, in]` weight as the `[in, out]` operand the layers take: its transpose.
fn torch_linear(w: &[f32], out: usize, inp: usize) -> MatRef<'_> {
    MatRef::new(w, MatLayout::row_major(out, inp).transposed())
}

fn main() -> Result<()> {
    let (batch, n, d, heads, ff) = (2, 128, 256, 4, 1024);
    let lengths = [128, 97]; // the second sequence is padded after 97 tokens

    // Checkpoint tensors, PyTorch layout (nn.TransformerEncoderLayer, post-norm).
    let sc = 1.0 / (d as f32).sqrt();
    let in_proj_weight = fill(3 * d * d, 1, sc); // [3d, d]: rows = Q | K | V outputs
    let in_proj_bias = fill(3 * d, 2, 0.02);
    let out_proj_weight = fill(d * d, 3, sc);
    let out_proj_bias = fill(d, 4, 0.02);
    let linear1_weight = fill(ff * d, 5, sc); // [ff, d]
    let linear1_bias = fill(ff, 6, 0.02);
    let linear2_weight = fill(d * ff, 7, 1.0 / (ff as f32).sqrt()); // [d, ff]
    let linear2_bias = fill(d, 8, 0.02);
    let (ones, zeros) = (vec![1.0; d], vec![0.0; d]);

    // Q, K, V are adjacent column blocks of the transposed in_proj_weight: the layer sees that
    // and runs the three projections as one GEMM.
    let qkv = torch_linear(&in_proj_weight, 3 * d, d); // [d, 3d] view
    let block = |i: usize| {
        let l = qkv.layout;
        MatRef::new(qkv.data, MatLayout::strided(d, d, l.row_stride, l.col_stride, i * d * d))
    };
    let cfg = EncoderConfig {
        attn: MhaConfig::from_embed_dim(d, heads)?,
        ff_dim: ff,
        activation: Activation::Relu,
        eps: 1e-5,
    };
    let norm = LayerNormWeights { gamma: &ones, beta: &zeros };
    let weights = EncoderWeights {
        attn: MhaWeights {
            wq: block(0),
            wk: block(1),
            wv: block(2),
            wo: torch_linear(&out_proj_weight, d, d),
            bq: Some(&in_proj_bias[..d]),
            bk: Some(&in_proj_bias[d..2 * d]),
            bv: Some(&in_proj_bias[2 * d..]),
            bo: Some(&out_proj_bias),
            variants: Variants::NONE,
        },
        norm1: norm,
        ff: FeedForwardWeights {
            w1: torch_linear(&linear1_weight, ff, d),
            b1: Some(&linear1_bias),
            w2: torch_linear(&linear2_weight, d, ff),
            b2: Some(&linear2_bias),
        },
        norm2: norm,
    };
    let layer = EncoderLayer::new(cfg, weights)?;

    // The engine owns every buffer: activations and one workspace sized once.
    let seq = Tensor4Layout::batch_seq(batch, n, d);
    let embeddings = fill(batch * n * d, 9, 1.0);
    let mut x = vec![0.0; batch * n * d];
    let mut y = vec![0.0; batch * n * d];
    let mut workspace = vec![0.0; layer.workspace_len(batch, n)];
    add_positional_encoding(
        TensorRef::new(&embeddings, seq),
        &PositionalEncoding::Sinusoidal { start: 0 },
        TensorMut::new(&mut x, seq),
    )?;
    let keep: Vec<bool> = (0..batch).flat_map(|b| (0..n).map(move |j| j < lengths[b])).collect();
    let mask = Mask::key_padding(&keep, batch, heads, n, n);

    let par = Parallelism::threads(2);
    let start = Instant::now();
    layer.forward_in(
        TensorRef::new(&x, seq),
        &mask,
        TensorMut::new(&mut y, seq),
        &mut workspace,
        par,
    )?;
    let took = start.elapsed();

    // Post-norm output: every row has mean ≈ 0 and variance ≈ 1 (γ = 1, β = 0).
    let row = &y[..d];
    let mean = row.iter().sum::<f32>() / d as f32;
    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / d as f32;
    println!(
        "encoder layer: batch {batch}, n {n}, d {d}, {heads} heads, ff {ff}: {:.2} ms; \
         workspace {} floats; row 0 mean {mean:.2e}, variance {var:.4}",
        took.as_secs_f64() * 1e3,
        workspace.len()
    );
    // A workspace one element short is reported, not overrun.
    let short = workspace.len() - 1;
    let err = layer
        .forward_in(
            TensorRef::new(&x, seq),
            &mask,
            TensorMut::new(&mut y, seq),
            &mut workspace[..short],
            par,
        )
        .unwrap_err();
    println!("with a short workspace: {err}");
    Ok(())
}
