//! The runner's errors: a scenario that did not pass ([`ScenarioError`]: malformed, refused, failed or
//! mismatched, with the field at fault), a file that could not run ([`FileError`]: which file, which
//! scenario), and a path that names no scenarios ([`CollectError`]).

use std::path::PathBuf;

/// Why a scenario file did not pass: the file, and (once it parsed) the scenario's name.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a scenario: not JSON, an unknown or missing field, a value of the wrong type or
    /// spelling (serde's message), at `field` (`None`: the document as a whole).
    #[error("{}: {}malformed: {}{message}", path.display(), named(name.as_deref()), at(field.as_deref()))]
    Parse {
        /// The file.
        path: PathBuf,
        /// The scenario's `name`, when the file is JSON with a string `name`.
        name: Option<String>,
        /// Where in the document, as a path (`requests[0].state`).
        field: Option<String>,
        /// What is wrong there.
        message: String,
    },
    /// The runner panicked (a bug in the runner or the scheduler).
    #[error("{}: the runner panicked", path.display())]
    Panicked {
        /// The file.
        path: PathBuf,
    },
    /// The scenario ran and did not pass.
    #[error("{}: scenario {name}: {source}", path.display())]
    Scenario {
        /// The file.
        path: PathBuf,
        /// The scenario's `name`.
        name: String,
        /// What went wrong.
        source: ScenarioError,
    },
}

/// `scenario N: ` for a named scenario, nothing otherwise.
fn named(name: Option<&str>) -> String {
    name.map_or(String::new(), |n| format!("scenario {n}: "))
}

/// `field F: ` for a field, nothing for the document as a whole.
fn at(field: Option<&str>) -> String {
    field.map_or(String::new(), |f| format!("field {f}: "))
}

/// A path given to [`run_paths`](crate::run_paths) that names no scenarios.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// Neither a file nor a folder.
    #[error("{}: no such file or folder", .0.display())]
    Missing(PathBuf),
    /// A folder that could not be listed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The paths exist but hold no scenario file (`*.json`): a wrong folder must not pass.
    #[error("no scenario files (*.json) under {}", display_all(.0))]
    Empty(Vec<PathBuf>),
}

fn display_all(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    names.join(", ")
}

/// Why a parsed scenario did not pass.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScenarioError {
    /// A field's value cannot work (the scenario is malformed).
    #[error("malformed: field {field}: {reason}")]
    Malformed {
        /// The field, as a path (`passes[1].update[0].position`).
        field: String,
        /// What is wrong with it.
        reason: Reason,
    },
    /// The file has both `expect` and `passes`, or neither.
    #[error("malformed: {0}")]
    Shape(Shape),
    /// The scheduler refused a call a pass's setup makes (`complete_step`, `remove`, …) at `field`.
    #[error("{field}: {error}")]
    Step {
        /// The step, as a path (`passes[2].remove`).
        field: String,
        /// The scheduler's error.
        error: kvsched_core::Error,
    },
    /// The pass failed and the scenario expects no error.
    #[error("{}the pass failed: {error}", label(*pass))]
    PassFailed {
        /// The pass (1-based) of a scenario with several.
        pass: Option<usize>,
        /// The scheduler's error.
        error: kvsched_core::Error,
    },
    /// The incremental pass did not do what the full pass does (the differential check).
    #[error("pass {pass}: the incremental pass differs from the full pass:\n  incremental: {incremental}\n  full:        {full}")]
    Differential {
        /// The pass (1-based).
        pass: usize,
        /// What the incremental run's pass did (its lists, request states and backend calls, one line).
        incremental: String,
        /// What the full-pass run's pass did.
        full: String,
    },
    /// The pass ran and its output differs from the expectations.
    #[error("{}{}", label(*pass), diffs.join("; "))]
    Mismatch {
        /// The pass (1-based) of a scenario with several.
        pass: Option<usize>,
        /// Each difference: `generation: expected [0], got [1]`.
        diffs: Vec<String>,
    },
}

/// `pass N: ` for a pass of several, nothing for a single pass.
fn label(pass: Option<usize>) -> String {
    pass.map_or(String::new(), |k| format!("pass {k}: "))
}

impl ScenarioError {
    /// A malformed `field`.
    pub fn malformed(field: impl Into<String>, reason: Reason) -> Self {
        Self::Malformed {
            field: field.into(),
            reason,
        }
    }
}

/// What is wrong with a scenario's field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Reason {
    /// The value has the wrong shape: what it must be (`an array of ids`).
    #[error("expected {0}")]
    Expected(&'static str),
    /// An element or value that is not what it must be: the value (JSON) and what it must be.
    #[error("{value} is not {what}")]
    Not {
        /// The value, as JSON.
        value: String,
        /// What it must be (`a boolean`).
        what: &'static str,
    },
    /// An object key that must be a request or task id.
    #[error("key {key:?} is not {what}")]
    Key {
        /// The key.
        key: String,
        /// What it must be (`a request id`).
        what: &'static str,
    },
    /// A script's outcome that is neither `"ok"` nor `"fail"` (the value, as JSON).
    #[error("expected \"ok\" or \"fail\", got {0}")]
    NotOkFail(String),
    /// A key the object does not take.
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    /// A key next to a script's `"calls"` other than `"then"`.
    #[error("unknown key {0:?} next to \"calls\"")]
    BesideCalls(String),
    /// A per-id script with no outcomes.
    #[error("empty outcome list")]
    EmptyOutcomes,
    /// An id scripted both by its outcomes and by the releases it waits for.
    #[error("id {0} is in both \"ids\" and \"after_released\"")]
    InBoth(u64),
    /// A required value is absent: what it must be.
    #[error("missing (expected {0})")]
    Missing(&'static str),
    /// More items than the runner or the core holds.
    #[error("more than {max} {what}")]
    TooMany {
        /// What (`snapshot points`).
        what: &'static str,
        /// The most allowed.
        max: usize,
    },
    /// A position past the request's prompt.
    #[error("{position} is beyond the prompt ({prompt})")]
    BeyondPrompt {
        /// The position.
        position: u32,
        /// The prompt's length.
        prompt: u32,
    },
    /// A count that must be at least 1.
    #[error("must be at least 1")]
    Zero,
    /// Two requests with one id.
    #[error("duplicate id {0}")]
    DuplicateId(u64),
    /// An id no live request has.
    #[error("unknown id {0}")]
    UnknownId(u64),
    /// The leases of started requests (the initial ones, or a pass's `add`) need more device pages
    /// than the adapter cache has.
    #[error("the leases of started requests need {pinned} pages, the cache has {pages}")]
    LeasesOverCache {
        /// Pages the leases pin.
        pinned: u32,
        /// The cache's device pages.
        pages: u32,
    },
    /// An update that changes a request's LoRA task.
    #[error("the LoRA task of a request cannot change")]
    LoraChanged,
    /// A `calls` key that names no recorded method.
    #[error("unknown method")]
    UnknownMethod,
    /// A `mode` on a pool other than the draft pool.
    #[error("only the draft pool pairs")]
    OnlyDraftPairs,
    /// A backend feature KV groups do not take (`a draft pool`).
    #[error("KV groups do not take {0}")]
    NotWithGroups(&'static str),
    /// What a recurrent-state group (`kv.state`) does not take.
    #[error("a recurrent-state group does not take {0}")]
    NotWithState(&'static str),
    /// An expectation about the recurrent-state group in a scenario without one.
    #[error("needs kv.state (a recurrent-state group)")]
    NeedsState,
    /// An embedded object that does not parse (serde's message).
    #[error("{0}")]
    Json(String),
    /// The core refused the value (a configuration, a request, a transfer's end).
    #[error("{0}")]
    Refused(kvsched_core::Error),
}

/// A scenario's top level, wrong as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Shape {
    /// Both `expect` and `passes`.
    #[error("both \"expect\" and \"passes\" are present")]
    Both,
    /// Neither `expect` nor `passes`.
    #[error("one of \"expect\" and \"passes\" is required")]
    Neither,
}
