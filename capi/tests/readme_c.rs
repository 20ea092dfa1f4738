//! The README's C example (its one ```c block) is a complete program: extracted from `README.md`,
//! built with the system C compiler against the static library and the checked-in header, under
//! AddressSanitizer and UndefinedBehaviorSanitizer, and run. It must exit 0 and say what it served.

use std::path::PathBuf;

#[path = "support/build.rs"]
mod build;

/// The body of the one fenced block whose info string is `lang` (fails on none or several).
fn fenced_block(markdown: &str, lang: &str) -> String {
    let open = format!("```{lang}");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.trim_end() == open => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.push(current.take().unwrap()),
            Some(body) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    assert!(current.is_none(), "an unclosed ```{lang} block");
    assert_eq!(
        blocks.len(),
        1,
        "the README must hold exactly one ```{lang} block"
    );
    blocks.pop().unwrap()
}

#[test]
fn the_readme_c_example_builds_and_runs_under_the_sanitizers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let source = fenced_block(&readme, "c");
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let src = tmp.join("readme_example.c");
    std::fs::write(&src, source).expect("write the extracted example");

    let bin = tmp.join("readme_example");
    build::compile_sanitized(&src, &bin);
    let stdout = build::run_c(&bin, &[]);
    assert!(stdout.contains("served 2 requests in "), "{stdout}");
}

#[test]
fn the_extractor_takes_the_one_c_block() {
    let md = "text\n```c\nint main(void) { return 0; }\n```\n```sh\nls\n```\n";
    assert_eq!(fenced_block(md, "c"), "int main(void) { return 0; }\n");
}
