//! # kvsched-workload
//!
//! Request workloads for the trace simulator (`kvsched-sim`): real traces read from disk, synthetic
//! generators, LoRA adapter popularity laws and multi-turn sessions. No dependency on the scheduler.
//!
//! A [`Workload`] is a time-sorted list of [`Arrival`]s plus where it came from. It is built by
//!
//! - [`load`] / [`load_as`]: read a trace file. [`load`] picks the reader by sniffing the first line
//!   (see [`TraceFormat::sniff`]); [`load_as`] takes the format explicitly. Three formats are known:
//!   [Azure LLM inference 2023](azure) CSV, [Mooncake](mooncake) JSON lines and [BurstGPT](burstgpt) CSV.
//! - [`synthetic::generate`]: Poisson or gamma arrivals with uniform or log-normal lengths, seeded.
//!
//! and then optionally given adapters by [`popularity::assign_adapters`].
//!
//! Bad input never panics: every reader returns a [`TraceError`] that names the file, the 1-based line
//! and the field, for example `traces/conv.csv:12: field ContextTokens: not an integer ("abc")`.
//!
//! # Row policy shared by all readers
//!
//! - Blank lines are skipped (the Azure files have no trailing newline; others may have one).
//! - `\r\n` line endings and a leading UTF-8 byte-order mark are accepted.
//! - Rows whose prompt or output length is 0 are failed or empty requests. They are dropped and
//!   counted in [`Workload::dropped_rows`] (BurstGPT has such rows; the Azure and Mooncake traces
//!   shipped with the project have none).
//! - Arrivals are sorted by time (stably, so rows with equal times keep file order). The shipped
//!   traces are already sorted.
//! - Times are milliseconds from the trace's own origin: Azure timestamps are wall-clock times, so
//!   the earliest row becomes 0; Mooncake and BurstGPT times already count from the start of the
//!   trace and are kept as they are.
#![deny(missing_docs)]

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub mod azure;
pub mod burstgpt;
pub mod mooncake;
pub mod popularity;
pub mod sessions;
pub mod synthetic;

/// The workload generators' random source: xoshiro256\*\* (rand's `rand_xoshiro`), seeded from a `u64`
/// by splitmix64 expansion (`SeedableRng::seed_from_u64`). The same seed gives the same stream on every
/// platform; distributions come from `rand` and `rand_distr`.
pub type Rng = rand_xoshiro::Xoshiro256StarStar;

/// One request as the simulator replays it.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// Arrival time in milliseconds from the start of the workload (finite, ≥ 0).
    pub at_ms: f64,
    /// Prompt (context) length in tokens, ≥ 1.
    pub prompt_tokens: u32,
    /// Number of tokens to generate, ≥ 1.
    pub output_tokens: u32,
    /// LoRA adapter id in `0..n`, or `None` for the base model. Readers leave it `None`;
    /// [`popularity::assign_adapters`] fills it in.
    pub adapter: Option<u32>,
    /// Prefix-block hashes (Mooncake `hash_ids`): two requests whose lists start with the same ids
    /// share that KV prefix. Each block covers [`Workload::prefix_block_tokens`] tokens. Empty for
    /// traces without prefix information.
    pub prefix_blocks: Vec<u64>,
}

/// A replayable request stream: arrivals sorted by [`Arrival::at_ms`], and where they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// The requests, sorted by arrival time (non-decreasing).
    pub arrivals: Vec<Arrival>,
    /// The file or generator the arrivals came from.
    pub source: Source,
    /// Rows read but not replayed because their prompt or output length was 0.
    pub dropped_rows: usize,
    /// Tokens per prefix block when the arrivals carry [`Arrival::prefix_blocks`] (512 for Mooncake),
    /// `None` otherwise.
    pub prefix_block_tokens: Option<u32>,
}

impl Workload {
    /// Builds a workload from arrivals in any order; they are sorted by time (stable).
    #[must_use]
    pub fn new(mut arrivals: Vec<Arrival>, source: Source) -> Self {
        arrivals.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
        Self {
            arrivals,
            source,
            dropped_rows: 0,
            prefix_block_tokens: None,
        }
    }

    /// Number of arrivals.
    #[must_use]
    pub fn len(&self) -> usize {
        self.arrivals.len()
    }

    /// Whether there are no arrivals.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.arrivals.is_empty()
    }

    /// Last arrival time minus first arrival time, in ms (0 for fewer than two arrivals).
    #[must_use]
    pub fn span_ms(&self) -> f64 {
        match (self.arrivals.first(), self.arrivals.last()) {
            (Some(first), Some(last)) => last.at_ms - first.at_ms,
            _ => 0.0,
        }
    }

    /// Mean arrival rate in requests per second over [`span_ms`](Self::span_ms) (`None` when the span is 0).
    #[must_use]
    pub fn mean_rate_per_s(&self) -> Option<f64> {
        let span = self.span_ms();
        (span > 0.0).then(|| (self.arrivals.len() - 1) as f64 / (span / 1000.0))
    }

    /// Multiplies every arrival time by `factor` (e.g. 0.5 replays the trace at twice the rate).
    /// Ignored unless `factor` is finite and positive, so the order and the ≥ 0 invariant hold.
    pub fn scale_time(&mut self, factor: f64) {
        if factor.is_finite() && factor > 0.0 {
            for a in &mut self.arrivals {
                a.at_ms *= factor;
            }
        }
    }
}

/// Where a [`Workload`] came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Read from a trace file.
    Trace {
        /// The file as it was given to [`load`].
        path: PathBuf,
        /// The reader that parsed it.
        format: TraceFormat,
    },
    /// Made by [`synthetic::generate`] from this specification.
    Synthetic(synthetic::SyntheticSpec),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Trace { path, format } => write!(f, "{format} trace {}", path.display()),
            Self::Synthetic(spec) => write!(f, "synthetic: {spec}"),
        }
    }
}

/// The trace file formats [`load_as`] can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// Azure LLM inference trace 2023 CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`. See [`azure`].
    Azure2023,
    /// Mooncake (FAST 2025) JSON lines: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.
    /// See [`mooncake`].
    Mooncake,
    /// BurstGPT CSV: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`.
    /// See [`burstgpt`].
    BurstGpt,
}

impl TraceFormat {
    /// Every known format, in the order [`sniff`](Self::sniff) tries them.
    pub const ALL: [Self; 3] = [Self::Mooncake, Self::Azure2023, Self::BurstGpt];

    /// The format's name as [`FromStr`] accepts it and [`Display`](fmt::Display) prints it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Azure2023 => "azure2023",
            Self::Mooncake => "mooncake",
            Self::BurstGpt => "burstgpt",
        }
    }

    /// Guesses the format from the text's first non-blank line: a line starting with `{` is Mooncake
    /// JSON; otherwise the CSV header must name every column of the Azure or BurstGPT header (in any
    /// order, among others; fields compared after trimming spaces). `None` when nothing matches.
    #[must_use]
    pub fn sniff(text: &str) -> Option<Self> {
        let (_, first) = lines(text).find(|(_, l)| !l.trim().is_empty())?;
        if first.trim_start().starts_with('{') {
            Some(Self::Mooncake)
        } else if header_has(first, &azure::HEADER) {
            Some(Self::Azure2023)
        } else if header_has(first, &burstgpt::HEADER) {
            Some(Self::BurstGpt)
        } else {
            None
        }
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A trace format name that [`TraceFormat::from_str`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown trace format {0:?} (expected one of: azure2023, mooncake, burstgpt)")]
pub struct UnknownFormatName(pub String);

impl FromStr for TraceFormat {
    type Err = UnknownFormatName;

    /// Accepts `azure2023` (or `azure`), `mooncake`, `burstgpt`, in any letter case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "azure2023" | "azure" => Ok(Self::Azure2023),
            "mooncake" => Ok(Self::Mooncake),
            "burstgpt" => Ok(Self::BurstGpt),
            _ => Err(UnknownFormatName(s.to_owned())),
        }
    }
}

/// A trace that could not be read: which file, which line and field, and why.
///
/// `Display` gives `path:LINE: field NAME: REASON`, leaving out the parts that do not apply
/// (`path: REASON` for file-level problems such as I/O errors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}{}{}: {reason}",
    path.display(),
    line.map_or(String::new(), |l| format!(":{l}")),
    field.map_or(String::new(), |f| format!(": field {f}"))
)]
pub struct TraceError {
    /// The file, as given to [`load`] (or to [`parse`]).
    pub path: PathBuf,
    /// 1-based line number, or `None` when the problem is with the whole file.
    pub line: Option<usize>,
    /// The column or JSON field at fault, by its name in the file (e.g. `ContextTokens`, `hash_ids`).
    pub field: Option<&'static str>,
    /// What is wrong.
    pub reason: TraceErrorKind,
}

/// Why a trace could not be read. Values quoted from the file are cut to 60 characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceErrorKind {
    /// The file could not be read.
    #[error("cannot read: {message}")]
    Io {
        /// The I/O error's kind, for matching.
        kind: io::ErrorKind,
        /// The I/O error's message.
        message: String,
    },
    /// The bytes at [`TraceError::line`] are not valid UTF-8.
    #[error("not valid UTF-8")]
    NotUtf8,
    /// The file has no non-blank line.
    #[error("empty file (no header or rows)")]
    Empty,
    /// [`load`] could not tell the format from the first line (quoted).
    #[error(
        "unrecognised trace format (first line {first:?}); expected the Azure 2023 header \"{azure}\", \
         the BurstGPT header \"{burst}\" or Mooncake JSON lines",
        first = .0,
        azure = azure::HEADER.join(","),
        burst = burstgpt::HEADER.join(",")
    )]
    UnknownFormat(String),
    /// The CSV text is malformed (the `csv` crate's message).
    #[error("bad CSV: {0}")]
    Csv(String),
    /// The CSV header lacks a column this format needs.
    #[error("bad header {found:?} (expected {expected:?})")]
    BadHeader {
        /// The header the format needs.
        expected: String,
        /// The line found.
        found: String,
    },
    /// The row ends before this column.
    #[error("missing column")]
    MissingColumn,
    /// The row has more columns than the header.
    #[error("{found} columns, header has {expected}")]
    ExtraColumns {
        /// Columns in the header.
        expected: usize,
        /// Columns in the row.
        found: usize,
    },
    /// Not a (decimal, optionally signed) integer.
    #[error("not an integer ({0:?})")]
    NotAnInteger(String),
    /// Not a decimal number.
    #[error("not a number ({0:?})")]
    NotANumber(String),
    /// A count or time that must be ≥ 0 is negative.
    #[error("negative ({0:?})")]
    Negative(String),
    /// An integer larger than the field allows.
    #[error("out of range ({value:?}; at most {max})")]
    OutOfRange {
        /// The value as written.
        value: String,
        /// The largest value allowed.
        max: u64,
    },
    /// A timestamp that does not parse as `YYYY-MM-DD HH:MM:SS[.fraction]`.
    #[error("bad timestamp ({value:?}): {why}")]
    BadTimestamp {
        /// The value as written.
        value: String,
        /// Which part is wrong (jiff's message).
        why: String,
    },
    /// The line is not valid JSON (serde_json's message).
    #[error("bad JSON: {0}")]
    Json(String),
    /// The line is JSON but not an object.
    #[error("not a JSON object")]
    NotAnObject,
    /// A required JSON field is absent.
    #[error("missing field")]
    MissingField,
    /// A JSON field the format does not have (a misspelling, when a required field is missing).
    #[error(
        "unknown field {name:?} (the fields are timestamp, input_length, output_length, hash_ids){}",
        missing.map_or(String::new(), |m| format!("; field {m} is missing: a misspelling of it?"))
    )]
    UnknownField {
        /// The field as written.
        name: String,
        /// The first required field that is absent, if any.
        missing: Option<&'static str>,
    },
    /// A JSON field has the wrong type or value.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// What the field must hold.
        expected: &'static str,
        /// The value found (JSON text).
        found: String,
    },
}

/// Reads a trace file, choosing the reader with [`TraceFormat::sniff`].
///
/// # Errors
///
/// [`TraceErrorKind::Io`] if the file cannot be read, [`TraceErrorKind::UnknownFormat`] if no format
/// matches, and any row error of the chosen reader.
pub fn load(path: impl AsRef<Path>) -> Result<Workload, TraceError> {
    let path = path.as_ref();
    let text = read_text(path)?;
    parse(&text, path, None)
}

/// Reads a trace file with the given reader.
///
/// # Errors
///
/// [`TraceErrorKind::Io`] if the file cannot be read, and any header or row error of the reader.
pub fn load_as(path: impl AsRef<Path>, format: TraceFormat) -> Result<Workload, TraceError> {
    let path = path.as_ref();
    let text = read_text(path)?;
    parse(&text, path, Some(format))
}

/// Parses trace text already in memory; `path` is only used to describe the source and in errors.
/// With `format` `None` the format is sniffed as in [`load`].
///
/// # Errors
///
/// As [`load`] / [`load_as`], without the I/O errors.
pub fn parse(text: &str, path: &Path, format: Option<TraceFormat>) -> Result<Workload, TraceError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let format = match format {
        Some(f) => f,
        None => TraceFormat::sniff(text).ok_or_else(|| {
            match lines(text).find(|(_, l)| !l.trim().is_empty()) {
                Some((n, first)) => {
                    Ctx { path }.err(n, None, TraceErrorKind::UnknownFormat(clip(first)))
                }
                None => Ctx { path }.file_err(TraceErrorKind::Empty),
            }
        })?,
    };
    let ctx = Ctx { path };
    match format {
        TraceFormat::Azure2023 => azure::parse(text, ctx),
        TraceFormat::Mooncake => mooncake::parse(text, ctx),
        TraceFormat::BurstGpt => burstgpt::parse(text, ctx),
    }
}

fn read_text(path: &Path) -> Result<String, TraceError> {
    let ctx = Ctx { path };
    let bytes = std::fs::read(path).map_err(|e| {
        ctx.file_err(TraceErrorKind::Io {
            kind: e.kind(),
            message: e.to_string(),
        })
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
        ctx.err(line, None, TraceErrorKind::NotUtf8)
    })
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by the readers.

/// Error context: the file being parsed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub(crate) path: &'a Path,
}

impl Ctx<'_> {
    pub(crate) fn err(
        self,
        line: usize,
        field: Option<&'static str>,
        reason: TraceErrorKind,
    ) -> TraceError {
        TraceError {
            path: self.path.to_path_buf(),
            line: Some(line),
            field,
            reason,
        }
    }

    pub(crate) fn file_err(self, reason: TraceErrorKind) -> TraceError {
        TraceError {
            path: self.path.to_path_buf(),
            line: None,
            field: None,
            reason,
        }
    }

    pub(crate) fn source(self, format: TraceFormat) -> Source {
        Source::Trace {
            path: self.path.to_path_buf(),
            format,
        }
    }
}

/// Lines with 1-based numbers, without their `\n` or `\r\n` terminator.
pub(crate) fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split('\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l.strip_suffix('\r').unwrap_or(l)))
}

/// At most 60 characters of `s`, for quoting in an error.
pub(crate) fn clip(s: &str) -> String {
    const MAX: usize = 60;
    match s.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

/// A CSV trace being read with the `csv` crate: quoted fields, `\r\n` and blank lines are handled
/// there; the columns a reader needs are found in the header by name, in any order, and other
/// columns are ignored.
pub(crate) struct Csv<'t, 'c, const N: usize> {
    rows: csv::StringRecordsIntoIter<&'t [u8]>,
    text: &'t str,
    /// Line numbers counted up to this byte: `(byte, line of that byte)`.
    counted: (usize, usize),
    /// The header's length: a row must not be longer.
    width: usize,
    /// Each needed column's name and index.
    columns: [(&'static str, usize); N],
    ctx: Ctx<'c>,
}

impl<'t, 'c, const N: usize> Csv<'t, 'c, N> {
    /// Reads the header and finds the `needed` columns in it.
    pub(crate) fn new(
        text: &'t str,
        ctx: Ctx<'c>,
        needed: &[&'static str; N],
    ) -> Result<Self, TraceError> {
        let mut reader = csv_reader(text);
        let header = reader.headers().map_err(|e| csv_error(ctx, &e))?.clone();
        let line = line_at(text, (0, 1), header.position()).1;
        if header.iter().all(str::is_empty) {
            return Err(ctx.file_err(TraceErrorKind::Empty));
        }
        let mut columns = [("", 0); N];
        for (slot, name) in columns.iter_mut().zip(needed) {
            let Some(index) = header.iter().position(|h| h == *name) else {
                return Err(ctx.err(
                    line,
                    None,
                    TraceErrorKind::BadHeader {
                        expected: needed.join(","),
                        found: clip(&header.iter().collect::<Vec<_>>().join(",")),
                    },
                ));
            };
            *slot = (name, index);
        }
        Ok(Self {
            rows: reader.into_records(),
            text,
            counted: (0, 1),
            width: header.len(),
            columns,
            ctx,
        })
    }

    /// The next non-blank row and its line number; a row longer than the header is refused.
    pub(crate) fn next_row(&mut self) -> Result<Option<(usize, csv::StringRecord)>, TraceError> {
        for row in self.rows.by_ref() {
            let row = row.map_err(|e| csv_error(self.ctx, &e))?;
            if row.iter().all(str::is_empty) {
                continue;
            }
            self.counted = line_at(self.text, self.counted, row.position());
            let line = self.counted.1;
            if row.len() > self.width {
                let (expected, found) = (self.width, row.len());
                return Err(self.ctx.err(
                    line,
                    None,
                    TraceErrorKind::ExtraColumns { expected, found },
                ));
            }
            return Ok(Some((line, row)));
        }
        Ok(None)
    }

    /// The needed fields of `row` (from [`Csv::next_row`]), in `needed` order.
    pub(crate) fn fields<'r>(
        &self,
        line: usize,
        row: &'r csv::StringRecord,
    ) -> Result<[&'r str; N], TraceError> {
        let mut out = [""; N];
        for (slot, &(name, index)) in out.iter_mut().zip(&self.columns) {
            *slot = row.get(index).ok_or_else(|| {
                self.ctx
                    .err(line, Some(name), TraceErrorKind::MissingColumn)
            })?;
        }
        Ok(out)
    }
}

/// The line a record starts on, counted on from `counted` (a `(byte, line)` pair before it).
///
/// The `csv` crate's own line numbers go wrong after blank lines and with `\r\n` endings, and its byte
/// offset may point at the terminator before the record; so the offset is moved past terminators and
/// the newlines before it are counted here, incrementally.
fn line_at(text: &str, counted: (usize, usize), at: Option<&csv::Position>) -> (usize, usize) {
    let (from, line) = counted;
    let start = at
        .map_or(from, |p| p.byte() as usize)
        .clamp(from, text.len());
    let start = text[start..]
        .find(|c| c != '\r' && c != '\n')
        .map_or(text.len(), |skip| start + skip);
    let newlines = text.as_bytes()[from..start]
        .iter()
        .filter(|&&b| b == b'\n')
        .count();
    (start, line + newlines)
}

/// The reader every CSV trace goes through: a header, rows of any length (checked by [`Csv`]),
/// fields trimmed.
fn csv_reader(text: &str) -> csv::Reader<&[u8]> {
    csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes())
}

fn csv_error(ctx: Ctx<'_>, e: &csv::Error) -> TraceError {
    let reason = TraceErrorKind::Csv(e.to_string());
    match e.position() {
        Some(p) => ctx.err(p.line() as usize, None, reason),
        None => ctx.file_err(reason),
    }
}

/// Whether a CSV header line names every column in `needed` (in any order).
fn header_has(line: &str, needed: &[&str]) -> bool {
    csv_reader(line)
        .headers()
        .is_ok_and(|h| needed.iter().all(|n| h.iter().any(|c| c == *n)))
}

/// Parses a non-negative decimal integer no larger than `max`.
pub(crate) fn parse_uint(s: &str, max: u64) -> Result<u64, TraceErrorKind> {
    let (negative, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TraceErrorKind::NotAnInteger(clip(s)));
    }
    if negative && digits.bytes().any(|b| b != b'0') {
        return Err(TraceErrorKind::Negative(clip(s)));
    }
    // Only digits are left, so the one way to fail is overflow.
    match digits.parse::<u64>() {
        Ok(v) if v <= max => Ok(v),
        _ => Err(TraceErrorKind::OutOfRange {
            value: clip(s),
            max,
        }),
    }
}

/// Parses a token count (a `u32`).
pub(crate) fn parse_tokens(s: &str) -> Result<u32, TraceErrorKind> {
    parse_uint(s, u64::from(u32::MAX)).map(|v| v as u32)
}

/// Parses a finite, non-negative decimal number.
pub(crate) fn parse_nonneg_f64(s: &str) -> Result<f64, TraceErrorKind> {
    // `f64::from_str` also accepts "inf" and "NaN": refuse anything that is not a finite number.
    let v: f64 = s.parse().map_err(|_| TraceErrorKind::NotANumber(clip(s)))?;
    if !v.is_finite() {
        Err(TraceErrorKind::NotANumber(clip(s)))
    } else if v < 0.0 {
        Err(TraceErrorKind::Negative(clip(s)))
    } else {
        Ok(v)
    }
}

/// Accumulates rows into a [`Workload`], dropping zero-length requests.
pub(crate) struct Builder {
    arrivals: Vec<Arrival>,
    dropped: usize,
}

impl Builder {
    pub(crate) fn new() -> Self {
        Self {
            arrivals: Vec::new(),
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, arrival: Arrival) {
        if arrival.prompt_tokens == 0 || arrival.output_tokens == 0 {
            self.dropped += 1;
        } else {
            self.arrivals.push(arrival);
        }
    }

    pub(crate) fn finish(self, source: Source, prefix_block_tokens: Option<u32>) -> Workload {
        let mut w = Workload::new(self.arrivals, source);
        w.dropped_rows = self.dropped;
        w.prefix_block_tokens = prefix_block_tokens;
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("mem.csv")
    }

    #[test]
    fn error_display_names_file_line_and_field() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 18:15:46.6805900,374,44\n\
                    2023-11-16 18:15:50.9951690,abc,109";
        let err = parse(text, Path::new("traces/conv.csv"), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "traces/conv.csv:3: field ContextTokens: not an integer (\"abc\")"
        );
        assert_eq!(err.line, Some(3));
        assert_eq!(err.field, Some("ContextTokens"));
    }

    #[test]
    fn csv_columns_are_found_by_name_and_quoted_fields_read() {
        // Columns reordered, an extra column, quoted fields (one holding a comma), CRLF, a blank line.
        let text = "Note,GeneratedTokens,\"TIMESTAMP\",ContextTokens\r\n\
                    \"a, b\",44,2023-11-16 18:15:46.5,374\r\n\r\n\
                    x,\"109\",2023-11-16 18:15:47.5,396\r\n";
        assert_eq!(TraceFormat::sniff(text), Some(TraceFormat::Azure2023));
        let w = parse(text, p(), None).unwrap();
        let got: Vec<_> = w
            .arrivals
            .iter()
            .map(|a| (a.at_ms, a.prompt_tokens, a.output_tokens))
            .collect();
        assert_eq!(got, [(0.0, 374, 44), (1000.0, 396, 109)]);
        // A row cut short names the first needed column it lacks, on the right line.
        let err = parse(&format!("{text}y,7\r\n"), p(), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "mem.csv:5: field TIMESTAMP: missing column"
        );
    }

    #[test]
    fn sniff_recognises_each_format_and_rejects_others() {
        assert_eq!(
            TraceFormat::sniff("TIMESTAMP,ContextTokens,GeneratedTokens\r\nx"),
            Some(TraceFormat::Azure2023)
        );
        assert_eq!(
            TraceFormat::sniff(
                "\n  \nTimestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            ),
            Some(TraceFormat::BurstGpt)
        );
        assert_eq!(
            TraceFormat::sniff("{\"timestamp\": 0}\n"),
            Some(TraceFormat::Mooncake)
        );
        assert_eq!(TraceFormat::sniff("a,b,c\n"), None);
        assert_eq!(TraceFormat::sniff("TIMESTAMP,ContextTokens\n"), None);
        assert_eq!(TraceFormat::sniff(""), None);
    }

    #[test]
    fn unknown_format_and_empty_file_are_typed_errors() {
        let err = parse("time,prompt\n1,2\n", p(), None).unwrap_err();
        assert_eq!(err.line, Some(1));
        assert!(matches!(err.reason, TraceErrorKind::UnknownFormat(ref l) if l == "time,prompt"));
        let err = parse(" \n\n", p(), None).unwrap_err();
        assert_eq!((err.line, err.reason), (None, TraceErrorKind::Empty));
    }

    #[test]
    fn explicit_format_with_wrong_header_is_bad_header() {
        let text = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,1,2,3,API log";
        let err = parse(text, p(), Some(TraceFormat::Azure2023)).unwrap_err();
        assert_eq!(err.line, Some(1));
        assert!(
            matches!(err.reason, TraceErrorKind::BadHeader { .. }),
            "{err}"
        );
    }

    #[test]
    fn format_names_round_trip() {
        for f in TraceFormat::ALL {
            assert_eq!(f.name().parse::<TraceFormat>(), Ok(f));
            assert_eq!(f.to_string(), f.name());
        }
        assert_eq!("Azure".parse::<TraceFormat>(), Ok(TraceFormat::Azure2023));
        let err = "sharegpt".parse::<TraceFormat>().unwrap_err();
        assert!(err.to_string().contains("sharegpt"));
    }

    #[test]
    fn load_of_missing_file_is_io_error_without_line() {
        let err = load("/nonexistent/dir/trace.csv").unwrap_err();
        assert_eq!(err.line, None);
        assert!(matches!(
            err.reason,
            TraceErrorKind::Io {
                kind: io::ErrorKind::NotFound,
                ..
            }
        ));
        assert!(
            err.to_string()
                .starts_with("/nonexistent/dir/trace.csv: cannot read: "),
            "{err}"
        );
    }

    #[test]
    fn invalid_utf8_reports_its_line() {
        let dir = std::env::temp_dir().join(format!("kvsched-utf8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("bad.csv");
        std::fs::write(
            &file,
            b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,1\xff,2\n",
        )
        .unwrap();
        let err = load(&file).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((err.line, err.reason), (Some(2), TraceErrorKind::NotUtf8));
    }

    #[test]
    fn integer_parsing_distinguishes_reasons() {
        assert_eq!(parse_tokens("42"), Ok(42));
        assert_eq!(
            parse_tokens("abc"),
            Err(TraceErrorKind::NotAnInteger("abc".into()))
        );
        assert_eq!(
            parse_tokens("1.5"),
            Err(TraceErrorKind::NotAnInteger("1.5".into()))
        );
        assert_eq!(
            parse_tokens("-3"),
            Err(TraceErrorKind::Negative("-3".into()))
        );
        assert_eq!(
            parse_tokens("4294967296"),
            Err(TraceErrorKind::OutOfRange {
                value: "4294967296".into(),
                max: u64::from(u32::MAX)
            })
        );
        assert!(matches!(
            parse_tokens("99999999999999999999999999999999999999999"),
            Err(TraceErrorKind::OutOfRange { .. })
        ));
        assert_eq!(parse_tokens("+7"), Ok(7));
        assert_eq!(parse_tokens("-0"), Ok(0));
        assert!(matches!(
            parse_tokens(""),
            Err(TraceErrorKind::NotAnInteger(_))
        ));
        assert!(matches!(
            parse_nonneg_f64("inf"),
            Err(TraceErrorKind::NotANumber(_))
        ));
        assert!(matches!(
            parse_nonneg_f64("-0.5"),
            Err(TraceErrorKind::Negative(_))
        ));
        assert_eq!(parse_nonneg_f64("2.5"), Ok(2.5));
    }

    #[test]
    fn clip_cuts_long_values_on_char_boundaries() {
        let long = "é".repeat(100);
        let c = clip(&long);
        assert_eq!(c.chars().count(), 61);
        assert!(c.ends_with('…'));
        assert_eq!(clip("short"), "short");
    }

    #[test]
    fn workload_sorts_and_reports_span_and_rate() {
        let a = |t: f64| Arrival {
            at_ms: t,
            prompt_tokens: 1,
            output_tokens: 1,
            adapter: None,
            prefix_blocks: vec![],
        };
        let mut w = Workload::new(
            vec![a(2000.0), a(0.0), a(1000.0)],
            Source::Trace {
                path: "x".into(),
                format: TraceFormat::Mooncake,
            },
        );
        assert_eq!(
            w.arrivals.iter().map(|a| a.at_ms).collect::<Vec<_>>(),
            [0.0, 1000.0, 2000.0]
        );
        assert_eq!(w.span_ms(), 2000.0);
        assert_eq!(w.mean_rate_per_s(), Some(1.0));
        w.scale_time(0.5);
        assert_eq!(w.span_ms(), 1000.0);
        w.scale_time(-1.0);
        assert_eq!(w.span_ms(), 1000.0);
        assert_eq!(w.source.to_string(), "mooncake trace x");
    }
}
