//! Gives the dynamic library an ELF SONAME, `libkvsched_capi.so.<ABI>`: the crate's major version, or
//! `0.<minor>` while it is 0.x (cargo's compatibility rule: 0.1 and 0.2 are incompatible). A program
//! linked against it then records that name and the loader finds the installed library by it
//! (`capi/README.md` installs it with the usual symbolic links). Other targets are left as they are.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let elf = matches!(
        os.as_str(),
        "linux" | "android" | "freebsd" | "netbsd" | "openbsd" | "dragonfly"
    );
    if elf {
        let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets it");
        let minor = std::env::var("CARGO_PKG_VERSION_MINOR").expect("cargo sets it");
        let abi = if major == "0" {
            format!("0.{minor}")
        } else {
            major
        };
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkvsched_capi.so.{abi}");
    }
}
