//! Compile-fail tests: the lifecycle mistakes the type-states rule out (tests/ui/*.rs, with the expected
//! compiler errors in the matching .stderr files).

#[test]
fn lifecycle_mistakes_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
