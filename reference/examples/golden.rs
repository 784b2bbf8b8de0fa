//! The seed's "8 steps" self-attention example, walked through with the reference crate and
//! printed matrix by matrix: inputs, weights, keys/queries/values, scores, softmax, weighted
//! values, outputs (scale 1, as in the article, and the usual 1/√d_k), and finally the same
//! computation as one `MultiHeadAttention` call.
//!
//! Run with `cargo run --example golden -p attn-reference`.

use attn_reference::attention::{attention, default_scale};
use attn_reference::softmax::softmax;
use attn_reference::{
    dot_product_scores, linear, multi_head_attention, scaled_dot_product_scores, Mask, MatMut,
    MatRef, MhaConfig, MhaWeights, Result, Tensor4Layout, TensorMut, TensorRef, Variants,
};

const X: [f32; 12] = [1., 0., 1., 0., 0., 2., 0., 2., 1., 1., 1., 1.];
const W_KEY: [f32; 12] = [0., 0., 1., 1., 1., 0., 0., 1., 0., 1., 1., 0.];
const W_QUERY: [f32; 12] = [1., 0., 1., 1., 0., 0., 0., 0., 1., 0., 1., 1.];
const W_VALUE: [f32; 12] = [0., 2., 0., 0., 3., 0., 1., 0., 3., 1., 1., 0.];

/// Prints a row-major matrix; each f32 in its shortest round-trip decimal form.
fn show(title: &str, m: &[f32], rows: usize, cols: usize) {
    println!("{title}  [{rows} × {cols}]");
    for r in 0..rows {
        let row: Vec<String> =
            m[r * cols..(r + 1) * cols].iter().map(|v| format!("{v:>15}")).collect();
        println!("  [{}]", row.join(", "));
    }
    println!();
}

fn project(w: &[f32]) -> Result<Vec<f32>> {
    let mut y = vec![0.0; 9];
    linear(
        MatRef::row_major(&X, 3, 4),
        MatRef::row_major(w, 4, 3),
        None,
        MatMut::row_major(&mut y, 3, 3),
    )?;
    Ok(y)
}

fn attend(q: &[f32], k: &[f32], v: &[f32], scale: f32) -> Result<Vec<f32>> {
    let l = Tensor4Layout::bhsd(1, 1, 3, 3);
    let mut o = vec![0.0; 9];
    attention(
        TensorRef::new(q, l),
        TensorRef::new(k, l),
        TensorRef::new(v, l),
        scale,
        &Mask::None,
        TensorMut::new(&mut o, l),
        None,
    )?;
    Ok(o)
}

fn main() -> Result<()> {
    println!("Step 1: three inputs of width 4");
    show("x", &X, 3, 4);

    println!("Step 2: weights, each [4 × 3] (inputs of width 4 → representations of width 3)");
    show("w_key", &W_KEY, 4, 3);
    show("w_query", &W_QUERY, 4, 3);
    show("w_value", &W_VALUE, 4, 3);

    println!("Step 3: keys = x·w_key, queries = x·w_query, values = x·w_value  (linear)");
    let keys = project(&W_KEY)?;
    let queries = project(&W_QUERY)?;
    let values = project(&W_VALUE)?;
    show("keys", &keys, 3, 3);
    show("queries", &queries, 3, 3);
    show("values", &values, 3, 3);

    println!("Step 4: attention scores = queries · keysᵀ  (dot_product_scores; no scaling)");
    let mut scores = vec![0.0; 9];
    dot_product_scores(
        MatRef::row_major(&queries, 3, 3),
        MatRef::row_major(&keys, 3, 3),
        MatMut::row_major(&mut scores, 3, 3),
    )?;
    show("scores", &scores, 3, 3);

    println!("Step 5: softmax over each row  (softmax)");
    let mut weights = vec![0.0; 9];
    softmax(MatRef::row_major(&scores, 3, 3), MatMut::row_major(&mut weights, 3, 3))?;
    show("softmax", &weights, 3, 3);

    println!("Step 6: weighted values for input 1: softmax[0][j] · values[j]");
    let weighted: Vec<f32> =
        (0..9).map(|i| ((weights[i / 3] as f64) * (values[i] as f64)) as f32).collect();
    show("weighted values (input 1)", &weighted, 3, 3);

    println!("Step 7: output 1 = sum of the weighted values (the article rounds the softmax to");
    println!("        [0, 0.5, 0.5] and prints [2.0, 7.0, 1.5]; here it is not rounded)");
    let out1: Vec<f32> =
        (0..3).map(|d| (0..3).map(|j| weighted[j * 3 + d] as f64).sum::<f64>() as f32).collect();
    show("output 1", &out1, 1, 3);

    println!(
        "Step 8: all outputs at once, softmax(queries · keysᵀ) · values  (attention, scale 1)"
    );
    let out = attend(&queries, &keys, &values, 1.0)?;
    show("outputs (scale 1)", &out, 3, 3);

    let scale = default_scale(3);
    println!("The transformer's scaling: scores · 1/√3 = scores · {scale}");
    let mut scaled = vec![0.0; 9];
    scaled_dot_product_scores(
        MatRef::row_major(&queries, 3, 3),
        MatRef::row_major(&keys, 3, 3),
        scale,
        MatMut::row_major(&mut scaled, 3, 3),
    )?;
    show("scaled scores", &scaled, 3, 3);
    let mut scaled_w = vec![0.0; 9];
    softmax(MatRef::row_major(&scaled, 3, 3), MatMut::row_major(&mut scaled_w, 3, 3))?;
    show("softmax (scale 1/√3)", &scaled_w, 3, 3);
    let out_s = attend(&queries, &keys, &values, scale)?;
    show("outputs (scale 1/√3)", &out_s, 3, 3);

    println!("The same as the seed's MultiHeadAttention(in_dim 4, k_dim 3, v_dim 3, 1 head),");
    println!("whose output projection [I₃ | 0] copies the head into the first 3 of 4 columns");
    let wo: Vec<f32> = (0..12).map(|i| if i % 4 == i / 4 { 1.0 } else { 0.0 }).collect();
    let w = MhaWeights {
        wq: MatRef::row_major(&W_QUERY, 4, 3),
        wk: MatRef::row_major(&W_KEY, 4, 3),
        wv: MatRef::row_major(&W_VALUE, 4, 3),
        wo: MatRef::row_major(&wo, 3, 4),
        bq: None,
        bk: None,
        bv: None,
        bo: None,
        variants: Variants::NONE,
    };
    let seq = Tensor4Layout::batch_seq(1, 3, 4);
    let mut y = vec![0.0; 12];
    multi_head_attention(
        &MhaConfig::new(4, 3, 3, 1),
        &w,
        TensorRef::new(&X, seq),
        &Mask::None,
        TensorMut::new(&mut y, seq),
    )?;
    show("MultiHeadAttention(x)", &y, 3, 4);
    Ok(())
}
