//! The committed C header must be what cbindgen generates from `ffi/mod.rs` now.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/ffi/mod.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let path = root.join("include/attn_kernels.h");
    if std::env::var_os("ATTN_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write the header");
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/attn_kernels.h is out of date: run `ATTN_BLESS=1 cargo test -p attn-kernels \
         --lib ffi::header` and commit it"
    );
}
