//! `attn-bench`: the benchmark report (until it exists, a walk through the golden example).

fn main() {
    println!("attn-bench: report not yet implemented");
}
