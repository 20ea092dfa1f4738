//! Builds a workspace package's library with the profile this test runs under (tests do not build a
//! package's static or dynamic library themselves) and returns the profile's output folder.

use std::path::PathBuf;
use std::process::Command;

/// `cargo build -p PACKAGE` for this test's profile; the folder its libraries land in.
pub fn build_library(package: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps")
        .to_path_buf();
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "-q", "-p", package]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let built = build.status().expect("run cargo");
    assert!(built.success(), "cargo build -p {package} failed");
    profile_dir
}
