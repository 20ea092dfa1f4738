//! Tidiness as a test (in the spirit of TigerBeetle's `tidy.zig`): the core's layers, its function
//! lengths and its file lengths, read from the sources.
//!
//! - **Layers** (drawn in `core/src/lib.rs`): every `crate::` path in a module's code (comments, doc
//!   comments and `#[cfg(test)]` code aside) names a module of its own layer or a lower one. An edge that
//!   points up a layer fails, naming the file, the line and both layers.
//! - **Functions** stay under [`MAX_FN_LINES`] lines, except the few in [`LONG_FNS`], each at most as
//!   long as recorded there: the list only shrinks (an entry that is now short enough, or gone, fails too,
//!   so it is removed).
//! - **Files** in `core/src` stay under [`MAX_FILE_LINES`] lines, the same way ([`LONG_FILES`]).

use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first: a module may use modules of its own layer and of lower ones.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "L0 vocabulary",
        &[
            "ids",
            "bomb",
            "error",
            "phase",
            "arena",
            "id_index",
            "fmt",
            "fingerprint",
            "storage",
            "narrow",
        ],
    ),
    ("L1 contracts", &["kv", "kv_events", "adapter", "connector"]),
    (
        "L2 mechanisms",
        &[
            "page_pool",
            "kv_set",
            "kv_groups",
            "adapter_pool",
            "state_pool",
        ],
    ),
    ("L3 lifecycle", &["request", "lease"]),
    (
        "L4 scheduler",
        &[
            "config",
            "budget",
            "step_budget",
            "scheduler",
            "output",
            "delta",
            "wire",
        ],
    ),
];

/// Most lines a function may have (signature to closing brace).
const MAX_FN_LINES: usize = 70;

/// Functions allowed over [`MAX_FN_LINES`]: `file` (under `core/src`), name, most lines. Shrinks only.
const LONG_FNS: &[(&str, &str, usize)] = &[];

/// Most lines a file in `core/src` may have.
const MAX_FILE_LINES: usize = 600;

/// Files allowed over [`MAX_FILE_LINES`], with their most lines. Shrinks only.
const LONG_FILES: &[(&str, usize)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, relative to `core/src`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("read core/src") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.strip_prefix(dir).expect("under src").to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// Test-only files: declared under `#[cfg(test)]` by their parents, never part of the library.
fn test_only(rel: &Path) -> bool {
    let stem = rel.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    stem == "tests" || stem == "testing" || stem.ends_with("_tests")
}

/// The top-level module a file belongs to (`None` for `lib.rs`).
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_string())
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

/// The code of a source file with comments, string and char literals blanked (newlines kept, so line
/// numbers hold) and `#[cfg(test)]` items removed.
fn code_of(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let keep_newlines = |out: &mut String, s: &[char]| {
        out.extend(s.iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
    };
    while i < b.len() {
        let rest = &b[i..];
        let end = if rest.starts_with(&['/', '/']) {
            i + rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            i + 2 + find(&rest[2..], &['*', '/']).map_or(rest.len() - 2, |p| p + 2)
        } else if rest[0] == '"' || rest.starts_with(&['b', '"']) && !ident_char(prev(&b, i)) {
            let q = i + usize::from(rest[0] == 'b');
            string_end(&b, q + 1)
        } else if rest[0] == 'r' && !ident_char(prev(&b, i)) && raw_start(rest).is_some() {
            let hashes = raw_start(rest).expect("checked");
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body = i + 2 + hashes;
            body + find(&b[body..], &close).map_or(b.len() - body, |p| p + close.len())
        } else if rest[0] == '\'' && rest.len() > 2 && (rest[1] == '\\' || rest[2] == '\'') {
            let mut j = i + 2;
            while j < b.len() && b[j] != '\'' {
                j += 1 + usize::from(b[j] == '\\');
            }
            j + 1
        } else {
            out.push(b[i]);
            i += 1;
            continue;
        };
        let end = end.min(b.len());
        keep_newlines(&mut out, &b[i..end]);
        i = end;
    }
    strip_cfg_test(&out)
}

fn prev(b: &[char], i: usize) -> char {
    if i == 0 {
        ' '
    } else {
        b[i - 1]
    }
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn find(hay: &[char], needle: &[char]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn string_end(b: &[char], mut j: usize) -> usize {
    while j < b.len() && b[j] != '"' {
        j += 1 + usize::from(b[j] == '\\');
    }
    j + 1
}

/// `r"`, `r#"`, … : the number of `#`.
fn raw_start(rest: &[char]) -> Option<usize> {
    let hashes = rest[1..].iter().take_while(|&&c| c == '#').count();
    (rest.get(1 + hashes) == Some(&'"')).then_some(hashes)
}

/// Blanks every item that follows a `#[cfg(test)]` attribute (a `mod x;` line or a braced block).
fn strip_cfg_test(code: &str) -> String {
    let mut b: Vec<char> = code.chars().collect();
    let pat: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut from = 0;
    while let Some(p) = find(&b[from..], &pat).map(|p| p + from) {
        let mut j = p + pat.len();
        while j < b.len() && b[j] != '{' && b[j] != ';' {
            j += 1;
        }
        if j < b.len() && b[j] == '{' {
            let mut depth = 0usize;
            while j < b.len() {
                depth = match b[j] {
                    '{' => depth + 1,
                    '}' => depth - 1,
                    _ => depth,
                };
                if depth == 0 {
                    break;
                }
                j += 1;
            }
        }
        for c in &mut b[p..(j + 1).min(code.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
        from = j.min(b.len());
    }
    b.into_iter().collect()
}

/// Every `crate::` edge in `code`: (line, top-level module named).
fn edges(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let b: Vec<char> = code.chars().collect();
    let pat: Vec<char> = "crate::".chars().collect();
    let mut from = 0;
    while let Some(p) = find(&b[from..], &pat).map(|p| p + from) {
        from = p + pat.len();
        if p > 0 && (ident_char(b[p - 1]) || b[p - 1] == ':' || b[p - 1] == '$') {
            continue;
        }
        let line = 1 + b[..p].iter().filter(|&&c| c == '\n').count();
        if b.get(from) == Some(&'{') {
            for name in group_heads(&b, from) {
                out.push((line, name));
            }
        } else {
            out.push((line, ident_at(&b, from)));
        }
    }
    out
}

fn ident_at(b: &[char], i: usize) -> String {
    b[i..].iter().take_while(|&&c| ident_char(c)).collect()
}

/// The first path segment of each item of a `{…}` use group starting at `b[open]`.
fn group_heads(b: &[char], open: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut j, mut expect) = (0usize, open, true);
    while j < b.len() {
        match b[j] {
            '{' => {
                depth += 1;
                expect = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect = true,
            c if expect && depth == 1 && ident_char(c) => {
                heads.push(ident_at(b, j));
                expect = false;
            }
            _ => {}
        }
        j += 1;
    }
    heads
}

/// The upward edges of one file: "file:line: module (layer) uses target (layer)".
fn upward_edges(rel: &str, module: &str, text: &str) -> Vec<String> {
    let Some(own) = layer_of(module) else {
        return vec![format!(
            "{rel}: module `{module}` is in no layer (add it to LAYERS and to the drawing in lib.rs)"
        )];
    };
    let mut out = Vec::new();
    for (line, target) in edges(&code_of(text)) {
        // `crate::Name` (a re-export at the root) and the root's macros name no module.
        let Some(theirs) = layer_of(&target) else {
            continue;
        };
        if theirs > own {
            out.push(format!(
                "{rel}:{line}: `{module}` ({}) uses `crate::{target}` ({}), a higher layer",
                LAYERS[own].0, LAYERS[theirs].0
            ));
        }
    }
    out
}

#[test]
fn no_module_uses_a_higher_layer() {
    let mut problems = Vec::new();
    for rel in sources(&src()) {
        let Some(module) = module_of(&rel) else {
            continue;
        };
        if test_only(&rel) {
            continue;
        }
        let text = fs::read_to_string(src().join(&rel)).expect("read source");
        problems.extend(upward_edges(&rel.display().to_string(), &module, &text));
    }
    assert!(
        problems.is_empty(),
        "layer violations (see the layers in core/src/lib.rs):\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_module_has_a_layer() {
    let lib = fs::read_to_string(src().join("lib.rs")).expect("read lib.rs");
    for (layer, modules) in LAYERS {
        for m in *modules {
            assert!(
                src().join(format!("{m}.rs")).exists() || src().join(m).join("mod.rs").exists(),
                "{layer} names `{m}`, which is not a module of core/src"
            );
            assert!(
                lib.contains(&format!("mod {m};")),
                "lib.rs does not declare `{m}`"
            );
        }
    }
}

#[test]
fn the_check_sees_an_upward_edge() {
    // A lower layer naming the scheduler, in a `use` group, inline, and across lines.
    let text =
        "use crate::{ids::RequestId,\n    scheduler::Handle};\nfn f() { crate::output::x(); }\n";
    let found = upward_edges("kv.rs", "kv", text);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("kv.rs:1: `kv` (L1 contracts) uses `crate::scheduler`"));
    assert!(found[1].starts_with("kv.rs:3: `kv` (L1 contracts) uses `crate::output`"));
    // Comments, strings and test code are not edges.
    let quiet = "//! [`crate::scheduler::Scheduler`]\nconst S: &str = \"crate::scheduler\";\n#[cfg(test)]\nmod tests {\n    use crate::scheduler::Handle;\n}\n";
    assert!(upward_edges("kv.rs", "kv", quiet).is_empty());
}

/// Every function of `code`: (name, first line, line count).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let b: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let pat: Vec<char> = "fn ".chars().collect();
    let mut from = 0;
    while let Some(p) = find(&b[from..], &pat).map(|p| p + from) {
        from = p + pat.len();
        if p > 0 && ident_char(b[p - 1]) {
            continue;
        }
        let name = ident_at(&b, from);
        if name.is_empty() {
            continue;
        }
        // The body: the first `{` before any `;` (a trait method without a body has none).
        let mut j = from;
        let mut depth = 0i32;
        while j < b.len() && !(depth == 0 && (b[j] == '{' || b[j] == ';')) {
            depth += match b[j] {
                '(' | '[' | '<' => 1,
                ')' | ']' | '>' if b[j - 1] != '-' => -1,
                _ => 0,
            };
            j += 1;
        }
        if j >= b.len() || b[j] == ';' {
            continue;
        }
        let mut depth = 0usize;
        while j < b.len() {
            depth = match b[j] {
                '{' => depth + 1,
                '}' => depth - 1,
                _ => depth,
            };
            if depth == 0 {
                break;
            }
            j += 1;
        }
        let first = 1 + b[..p].iter().filter(|&&c| c == '\n').count();
        let last = 1 + b[..j.min(b.len())].iter().filter(|&&c| c == '\n').count();
        out.push((name, first, last - first + 1));
    }
    out
}

#[test]
fn functions_are_short() {
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for rel in sources(&src()) {
        let text = fs::read_to_string(src().join(&rel)).expect("read source");
        let file = rel.display().to_string();
        for (name, line, len) in functions(&code_of(&text)) {
            let allowed = LONG_FNS
                .iter()
                .find(|(f, n, _)| *f == file && *n == name)
                .map(|&(_, _, max)| max);
            if allowed.is_some() {
                seen.push((file.clone(), name.clone(), len));
            }
            let limit = allowed.unwrap_or(MAX_FN_LINES);
            if len > limit {
                problems.push(format!(
                    "{file}:{line}: fn {name} is {len} lines (at most {limit}): split it into named steps"
                ));
            }
        }
    }
    for (file, name, max) in LONG_FNS {
        match seen.iter().find(|(f, n, _)| f == file && n == name) {
            None => problems.push(format!(
                "LONG_FNS lists {file}: fn {name}, which is gone: remove it"
            )),
            Some((_, _, len)) if *len <= MAX_FN_LINES => problems.push(format!(
                "{file}: fn {name} is {len} lines now: remove it from LONG_FNS"
            )),
            Some((_, _, len)) if len < max => problems.push(format!(
                "{file}: fn {name} shrank to {len} lines: lower its entry in LONG_FNS"
            )),
            _ => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_length_check_sees_a_long_function() {
    let body = "    x += 1;\n".repeat(MAX_FN_LINES);
    let text =
        format!("pub(crate) fn long<T: Into<u32>>(x: T) -> u32 {{\n{body}}}\nfn short() {{}}\n");
    let fns = functions(&code_of(&text));
    assert_eq!(fns[0], ("long".to_string(), 1, MAX_FN_LINES + 2));
    assert_eq!(fns[1], ("short".to_string(), MAX_FN_LINES + 3, 1));
}

#[test]
fn files_are_short() {
    let mut problems = Vec::new();
    for rel in sources(&src()) {
        let file = rel.display().to_string();
        let len = fs::read_to_string(src().join(&rel))
            .expect("read source")
            .lines()
            .count();
        let allowed = LONG_FILES.iter().find(|(f, _)| *f == file).map(|&(_, m)| m);
        let limit = allowed.unwrap_or(MAX_FILE_LINES);
        if len > limit {
            problems.push(format!(
                "{file} is {len} lines (at most {limit}): split it by concept"
            ));
        }
        if let Some(max) = allowed {
            if len <= MAX_FILE_LINES {
                problems.push(format!(
                    "{file} is {len} lines now: remove it from LONG_FILES"
                ));
            } else if len < max {
                problems.push(format!(
                    "{file} shrank to {len} lines: lower its entry in LONG_FILES"
                ));
            }
        }
    }
    for (file, _) in LONG_FILES {
        if !src().join(file).exists() {
            problems.push(format!("LONG_FILES lists {file}, which is gone: remove it"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
