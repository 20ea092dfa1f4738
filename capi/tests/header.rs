//! The checked-in header is what cbindgen generates from the crate now: a stale header fails here.
//! `KVSCHED_BLESS=1 cargo test -p kvsched-capi --test header` rewrites it.

use std::path::PathBuf;

#[test]
fn the_header_is_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = dir.join("include/kvsched.h");
    if std::env::var_os("KVSCHED_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "capi/include/kvsched.h is stale: run `KVSCHED_BLESS=1 cargo test -p kvsched-capi --test header` and commit it"
    );
}
