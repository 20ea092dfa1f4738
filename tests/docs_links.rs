//! Everything the documentation points at is in the repository: every relative markdown link
//! (`[text](path)`, images too) and every backticked repository path in `README.md`, `docs/*.md` and
//! `data/README.md` names a file or folder that exists. External links (`http:`, `https:`, `mailto:`)
//! and in-page anchors are skipped, and so are fenced code blocks.
//!
//! A backticked word is a repository path when it contains a `/`, has no wildcard or placeholder
//! (`*`, `<`, `{`, `$`, `…`, spaces), its last part has an extension or it ends in `/`, and its first
//! part is a top-level entry of the repository, or `shared`/`..` (material beside the repository,
//! which the repository must not cite). It must exist relative to the repository root, to the
//! document's folder, or to one crate's folder (a crate's `tests/x.rs` said inside its section).
//! A path in another repository is written `owner/repo:path`, which this test leaves alone.

use std::path::{Path, PathBuf};

/// One reference that does not resolve: the document, its line, the path as written.
#[derive(Debug, PartialEq)]
struct Broken {
    file: String,
    line: usize,
    target: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents checked: `README.md`, `docs/*.md` (not its subfolders, which hold verbatim
/// copies), `data/README.md`.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![root.join("README.md"), root.join("data/README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    docs.extend(pages);
    docs
}

/// The relative targets of `[text](target)` on one line.
fn links(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        let target = target.split('#').next().unwrap_or("");
        let external = ["http://", "https://", "mailto:"]
            .iter()
            .any(|s| target.starts_with(s));
        if !target.is_empty() && !external {
            out.push(target.to_string());
        }
        rest = &after[end..];
    }
    out
}

/// The backticked words of one line that look like repository paths.
fn code_paths(line: &str, top: &[String]) -> Vec<String> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| looks_like_a_repository_path(w, top))
        .map(str::to_string)
        .collect()
}

fn looks_like_a_repository_path(w: &str, top: &[String]) -> bool {
    let plain = w
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c));
    if !plain || !w.contains('/') || w.starts_with('/') || w.contains("//") {
        return false;
    }
    let last = w.rsplit('/').next().unwrap_or("");
    let has_extension = last.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty() && !ext.is_empty() && ext.chars().all(|c| c.is_ascii_alphanumeric())
    });
    if !(w.ends_with('/') || has_extension) {
        return false;
    }
    let first = w.split('/').next().unwrap_or("");
    first == "shared" || first == ".." || top.iter().any(|t| t == first)
}

/// Whether `target` exists from the repository root, from `dir`, or from a crate's folder.
fn resolves(root: &Path, dir: &Path, target: &str, crates: &[PathBuf]) -> bool {
    let first = target.split('/').next().unwrap_or("");
    if first == "shared" {
        return false; // beside the repository, never in it
    }
    [root, dir]
        .into_iter()
        .chain(crates.iter().map(PathBuf::as_path))
        .any(|base| base.join(target).exists())
}

/// Every broken reference in one document's text.
fn check(
    root: &Path,
    name: &str,
    dir: &Path,
    text: &str,
    top: &[String],
    crates: &[PathBuf],
) -> Vec<Broken> {
    let mut broken = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for target in links(line) {
            // A markdown link is relative to its document only.
            if !dir.join(&target).exists() {
                broken.push(Broken {
                    file: name.into(),
                    line: n + 1,
                    target,
                });
            }
        }
        for target in code_paths(line, top) {
            if !resolves(root, dir, &target, crates) {
                broken.push(Broken {
                    file: name.into(),
                    line: n + 1,
                    target,
                });
            }
        }
    }
    broken
}

/// The repository's top-level entries and its crates' folders.
fn layout(root: &Path) -> (Vec<String>, Vec<PathBuf>) {
    let mut top = Vec::new();
    let mut crates = Vec::new();
    for e in std::fs::read_dir(root).expect("read the repository root") {
        let path = e.expect("an entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // Hidden entries, and the build folder: what a build leaves there is not the repository's, so
        // a path into it is never checked (whether a build ran must not change the verdict).
        if (name.starts_with('.') && name != ".ci") || name == "target" {
            continue;
        }
        if path.join("Cargo.toml").exists() {
            crates.push(path.clone());
        }
        top.push(name);
    }
    (top, crates)
}

#[test]
fn every_link_and_path_in_the_docs_exists_in_the_repository() {
    let root = root();
    let (top, crates) = layout(&root);
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents(&root) {
        let text = std::fs::read_to_string(&doc).expect("read a document");
        let name = doc.strip_prefix(&root).unwrap().display().to_string();
        checked += 1;
        broken.extend(check(
            &root,
            &name,
            doc.parent().unwrap(),
            &text,
            &top,
            &crates,
        ));
    }
    assert!(checked > 10, "only {checked} documents found");
    let report: Vec<String> = broken
        .iter()
        .map(|b| format!("{}:{}: {}", b.file, b.line, b.target))
        .collect();
    assert!(
        broken.is_empty(),
        "documents point at what is not in the repository:\n{}",
        report.join("\n")
    );
}

#[test]
fn planted_bad_links_and_paths_are_caught_and_good_ones_pass() {
    let root = root();
    let (top, crates) = layout(&root);
    let text = "\
See `shared/bench/SCENARIOS.md` and `../shared/measurements/h200/x.log`, [the page](NOPE.md),\n\
`docs/NOPE.md`, `core/src/nope.rs`, ![a figure](nope.svg).\n\
Good: [bench](BENCH.md), [anchor](BENCH.md#figures), [web](https://example.com/x.md), `docs/BENCH.md`,\n\
`core/src/`, `tests/no_alloc.rs` (bench's), `data/AzureLLMInferenceTrace_*.csv`, `FAST25-release/traces/`.\n\
```sh\n\
cat shared/bench/SCENARIOS.md `docs/IN-A-CODE-BLOCK.md`\n\
```\n";
    let found: Vec<String> = check(&root, "planted.md", &root.join("docs"), text, &top, &crates)
        .into_iter()
        .map(|b| b.target)
        .collect();
    assert_eq!(
        found,
        [
            "NOPE.md",
            "shared/bench/SCENARIOS.md",
            "../shared/measurements/h200/x.log",
            "nope.svg",
            "docs/NOPE.md",
            "core/src/nope.rs",
        ]
    );
}

/// The README's first screen says what kvsched is, then how to set up and the commands (issue 43:
/// they began at line 117 of 167).
#[test]
fn the_readmes_first_screen_has_the_setup_and_the_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let screen: Vec<&str> = readme.lines().take(30).collect();
    let at = |needle: &str| screen.iter().position(|l| l.contains(needle));
    let setup = at("## Setup").expect("a setup section on the first screen");
    assert!(
        setup <= 8,
        "two sentences first, then the setup (line {setup})"
    );
    for command in ["cargo test --workspace", "kvsched simulate"] {
        assert!(at(command).is_some(), "{command} on the first screen");
    }
}
