//! The C ABI from C: `tests/c/abi_test.c` is compiled with the system C compiler against the
//! committed header and the crate's staticlib, and run on cases written here (inputs, the
//! reference's result, and the error bound derived for it in `layers_support`). The C program
//! checks sgemm, attention, decode, layer norm and multi-head attention (allocating and
//! caller-workspace forms) against those values, and the status codes of bad arguments.
//! `tests/c/boundary_test.c` checks the boundary itself (out-of-range enum values, status names
//! of any integer, aliasing and overflow statuses, absurd thread counts) and makes one additive
//! attention call (the mean of V when `w` is 0, and three statuses), and one varlen attention
//! call and one paged cache write (results, and the statuses of bad offsets and shared slots).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::layers_support::*;
use attn_reference::{Mask, MatLayout, MatMut, MatRef, MhaConfig};

/// Writes a case file: arrays as `u64 count` + values.
struct Case(BufWriter<File>);

impl Case {
    fn new(dir: &Path, name: &str) -> Self {
        Case(BufWriter::new(File::create(dir.join(name)).unwrap()))
    }
    fn u64s(&mut self, v: &[usize]) -> &mut Self {
        self.0.write_all(&(v.len() as u64).to_ne_bytes()).unwrap();
        v.iter().for_each(|x| self.0.write_all(&(*x as u64).to_ne_bytes()).unwrap());
        self
    }
    fn f32s(&mut self, v: &[f32]) -> &mut Self {
        self.0.write_all(&(v.len() as u64).to_ne_bytes()).unwrap();
        v.iter().for_each(|x| self.0.write_all(&x.to_ne_bytes()).unwrap());
        self
    }
    /// A bound as f32, padded by 1% for the C side's own f32 subtraction.
    fn bound(&mut self, b: &Bounded) -> &mut Self {
        let t: Vec<f32> = b.err.iter().map(|e| (e * 1.01) as f32).collect();
        self.f32s(&b.val).f32s(&t)
    }
}

fn write_cases(dir: &Path) {
    let mut g = Gen::new(42);

    // sgemm 37×65 · 65×29; B handed to C as its transpose (an [n, k] buffer, column strides).
    let (m, n, k) = (37, 29, 65);
    let a = g.vec(m * k, 1.0);
    let b = g.vec(k * n, 1.0);
    let mut bt = vec![0.0; k * n];
    for p in 0..k {
        for j in 0..n {
            bt[j * k + p] = b[p * n + j];
        }
    }
    let want = linear_b(&Bounded::exact(a.clone(), m, k), MatRef::row_major(&b, k, n), None);
    Case::new(dir, "sgemm.bin").u64s(&[m, n, k]).f32s(&a).f32s(&bt).bound(&want);

    // Attention (flash path: 37 queries) and decode (1 query over 300 keys, MQA), causal.
    for (file, [batch, hq, hkv, nq, nk, dk, dv]) in
        [("attention.bin", [2, 4, 2, 37, 45, 16, 8]), ("decode.bin", [1, 4, 1, 1, 300, 32, 32])]
    {
        let q = Bounded::exact(g.vec(batch * nq * hq * dk, 1.0), batch * nq, hq * dk);
        let kk = Bounded::exact(g.vec(batch * nk * hkv * dk, 1.0), batch * nk, hkv * dk);
        let v = Bounded::exact(g.vec(batch * nk * hkv * dv, 1.0), batch * nk, hkv * dv);
        let scale = 1.0 / (dk as f32).sqrt();
        let want = attention_b(&q, &kk, &v, batch, hq, hkv, scale, &Mask::CAUSAL);
        Case::new(dir, file)
            .u64s(&[batch, hq, hkv, nq, nk, dk, dv])
            .f32s(&q.val)
            .f32s(&kk.val)
            .f32s(&v.val)
            .bound(&want);
    }

    // The seed's MHA shape: (1, 5, 64), two heads of 32, biases everywhere.
    let cfg = MhaConfig::new(64, 32, 32, 2);
    let p = MhaParams::new(cfg, true, false, &mut g);
    let (batch, n) = (1, 5);
    let x = g.vec(batch * n * 64, 1.0);
    let want = mha_b(&p, &Bounded::exact(x.clone(), batch * n, 64), None, batch, &Mask::None);
    let opt = |b: &Option<Vec<f32>>| b.clone().unwrap();
    Case::new(dir, "mha.bin")
        .u64s(&[batch, n, cfg.in_dim, cfg.k_dim, cfg.v_dim, cfg.num_heads, cfg.kv_heads])
        .f32s(&p.wq)
        .f32s(&p.wk)
        .f32s(&p.wv)
        .f32s(&p.wo)
        .f32s(&opt(&p.bq))
        .f32s(&opt(&p.bk))
        .f32s(&opt(&p.bv))
        .f32s(&opt(&p.bo))
        .f32s(&x)
        .bound(&want);
}

/// The staticlib cargo built beside this test binary (`target/<profile>/deps`).
fn staticlib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let lib = deps.join("libattn_kernels.a");
    assert!(lib.exists(), "{} not built (crate-type staticlib)", lib.display());
    lib
}

/// Compiles `tests/c/{name}.c` against the committed header and the staticlib into `dir`.
fn compile_c(name: &str, dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let exe = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("kernels/include"))
        .arg(root.join(format!("tests/c/{name}.c")))
        .arg(staticlib())
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(out.status.success(), "C build failed:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

#[test]
fn c_program_calls_the_abi() {
    let dir = std::env::temp_dir().join(format!("attn-c-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_cases(&dir);
    let exe = compile_c("abi_test", &dir);
    let run = Command::new(&exe).arg(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "C checks failed ({:?}):\n{stdout}\n{stderr}", run.status);
    assert!(stdout.contains("all checks passed"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tests/c/boundary_test.c`: out-of-range enum and bool values (mask kind 4, 7, 9, a causal
/// flag of 2, keep bytes 2 and 255, activation 5), status names of 12, −1, 1000, statuses and
/// messages naming the real fault, and `SIZE_MAX` / 4096 threads on every threaded entry point
/// (each call under a second). Set `ATTN_C_TEST_KEEP=1` to keep the binary (for valgrind).
#[test]
fn c_program_checks_the_boundary() {
    let dir = std::env::temp_dir().join(format!("attn-c-boundary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = compile_c("boundary_test", &dir);
    let run = Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "C checks failed ({:?}):\n{stdout}\n{stderr}", run.status);
    assert!(stdout.contains("all boundary checks passed"), "{stdout}");
    if std::env::var_os("ATTN_C_TEST_KEEP").is_some() {
        eprintln!("kept {}", exe.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The same values through the Rust API, so a failure above can be told apart from one here.
#[test]
fn rust_side_of_the_c_cases() {
    let mut g = Gen::new(7);
    let (m, n, k) = (5, 3, 4);
    let a = g.vec(m * k, 1.0);
    let b = g.vec(k * n, 1.0);
    let want = linear_b(&Bounded::exact(a.clone(), m, k), MatRef::row_major(&b, k, n), None);
    let mut c = vec![0.0; m * n];
    attn_kernels::gemm::sgemm(
        1.0,
        MatRef::row_major(&a, m, k),
        MatRef::row_major(&b, k, n),
        0.0,
        MatMut::new(&mut c, MatLayout::row_major(m, n)),
        attn_kernels::Parallelism::Sequential,
    )
    .unwrap();
    assert_bounded(&c, &want, "sgemm");
}
