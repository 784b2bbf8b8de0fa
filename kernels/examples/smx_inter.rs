//! 8192x4096 softmax, pipelined vs not (env NOPIPE toggled per call), and memcpy, interleaved per call: args reps
use attn_kernels::Parallelism;
use attn_reference::{Mask, Tensor4Layout, TensorMut, TensorRef};
use std::time::Instant;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (rows, cols) = (8192usize, 4096usize);
    let reps: usize = a[1].parse().unwrap();
    let l = Tensor4Layout::bhsd(1, 1, rows, cols);
    let mut s = 0x1234_5678u64;
    let x: Vec<f32> = (0..l.len())
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect();
    let mut y = vec![0.0f32; l.len()];
    let mut c = vec![0.0f32; l.len() + 1024];
    let n = l.len();
    let mut t = [vec![], vec![], vec![], vec![]];
    for i in 0..reps {
        for k in 0..4 {
            let k = (k + i) % 4;
            let st = Instant::now();
            if k == 2 {
                c[512..512 + n].copy_from_slice(std::hint::black_box(&x));
                std::hint::black_box(&mut c);
            } else {
                if k == 1 {
                    std::env::set_var("NOPHASE", "1")
                } else {
                    std::env::remove_var("NOPHASE")
                }
                if k != 3 {
                    std::env::set_var("PERROW", "1")
                } else {
                    std::env::remove_var("PERROW")
                }
                attn_kernels::softmax::scale_mask_softmax(
                    TensorRef::new(&x, l),
                    0.125,
                    &Mask::None,
                    TensorMut::new(&mut y, l),
                    None,
                    Parallelism::threads(1),
                )
                .unwrap();
            }
            t[k].push(st.elapsed().as_secs_f64());
        }
    }
    let mut r3: Vec<f64> = (0..reps).map(|i| t[3][i] / t[0][i]).collect();
    r3.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let ratio: Vec<f64> = (0..reps).map(|i| t[1][i] / t[0][i]).collect();
    let mut ratio = ratio;
    ratio.sort_by(|a, b| a.partial_cmp(b).unwrap());
    for v in t.iter_mut() {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    }
    let m = reps / 2;
    let g = |s: f64| n as f64 / s / 1e9;
    println!("perrow-phase med {:.3} best {:.3} | perrow-nophase med {:.3} best {:.3} | copy med {:.2} best {:.2} G elem/s | pipe/copy med {:.3} nopipe/copy {:.3} | nopipe_t/pipe_t median {:.3} | pipe-phase med {:.3} perrow_t/pipe_t {:.3} perrow/copy {:.3}",
        g(t[0][m]), g(t[0][0]), g(t[1][m]), g(t[1][0]), g(t[2][m]), g(t[2][0]), t[2][m]/t[0][m], t[2][m]/t[1][m], ratio[m], g(t[3][m]), r3[m], t[2][m]/t[3][m]);
}
