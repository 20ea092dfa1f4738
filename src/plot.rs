//! Dependency-free SVG timelines for simulator runs.
//!
//! A [`Timeline`] is one shared time axis (simulated seconds) and a stack of [`Panel`]s, one per
//! unit — e.g. request counts (queue length, running batch), KV utilisation in % (GPU tier, host
//! tier), adapters resident on the device — each holding one or more [`Series`]. [`render_svg`] draws
//! the panels on top of each other at 1000 px wide (700 px tall for up to three panels), with
//! y-axis ticks and unit label per panel, shared x-axis ticks at the bottom, a legend to the right of
//! every panel, and a title. Series longer than [`MAX_POINTS`] are [`downsample`]d with a min/max per
//! time bucket, so spikes survive. [`write_svg_atomic`] writes the file whole or not at all.
//!
//! ```
//! use kvsched::plot::{render_svg, Panel, Timeline};
//!
//! let t = vec![0.0, 1.0, 2.0];
//! let timeline = Timeline::new("demo", t)
//!     .panel(Panel::new("requests", "requests").series("waiting", vec![3.0, 1.0, 0.0]))
//!     .panel(Panel::new("KV cache", "%").range(0.0, 100.0).series("GPU", vec![10.0, 55.0, 40.0]));
//! let svg = render_svg(&timeline).unwrap();
//! assert!(svg.starts_with("<svg"));
//! ```

use std::fmt::{self, Write as _};
use std::io;
use std::path::{Path, PathBuf};

/// The most points drawn per series; longer series are downsampled.
pub const MAX_POINTS: usize = 2000;

/// Image width in pixels.
pub const WIDTH: f64 = 1000.0;

/// Series colours (Tableau 10), assigned in order across all panels.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

// Layout (pixels).
const LEFT: f64 = 78.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 62.0;
const BOTTOM: f64 = 52.0;
const PANEL_HEADER: f64 = 24.0;
const PANEL_SLOT_MIN: f64 = 190.0;

/// A set of time series sharing one time axis, drawn as stacked panels.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// Title at the top of the image.
    pub title: String,
    /// Second line under the title (e.g. the workload and policy); empty for none.
    pub subtitle: String,
    /// Sample times in simulated seconds (or the values of [`Timeline::x_label`]): finite and
    /// non-decreasing.
    pub t: Vec<f64>,
    /// The x axis's label.
    pub x_label: String,
    /// Panels, drawn top to bottom.
    pub panels: Vec<Panel>,
}

/// One stacked panel: series that share a unit and a y axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Heading above the panel.
    pub title: String,
    /// Y-axis label (e.g. `requests`, `%`, `adapters`).
    pub unit: String,
    /// Fixed y range `(min, max)`; `None` fits the data (from 0 or the minimum, whichever is lower).
    pub range: Option<(f64, f64)>,
    /// The series, one line each.
    pub series: Vec<Series>,
}

/// One line: a value per [`Timeline::t`] sample. Non-finite values leave a gap.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Values, as many as there are time samples.
    pub values: Vec<f64>,
}

impl Timeline {
    /// A timeline with no panels yet.
    #[must_use]
    pub fn new(title: impl Into<String>, t: Vec<f64>) -> Self {
        Self {
            title: title.into(),
            subtitle: String::new(),
            t,
            x_label: "simulated time (s)".into(),
            panels: Vec::new(),
        }
    }

    /// Labels the x axis with something other than simulated time (a sweep's parameter).
    #[must_use]
    pub fn x_label(mut self, label: impl Into<String>) -> Self {
        self.x_label = label.into();
        self
    }

    /// Sets the subtitle.
    #[must_use]
    pub fn subtitle(mut self, subtitle: impl Into<String>) -> Self {
        self.subtitle = subtitle.into();
        self
    }

    /// Appends a panel.
    #[must_use]
    pub fn panel(mut self, panel: Panel) -> Self {
        self.panels.push(panel);
        self
    }

    /// Checks the invariants [`render_svg`] relies on.
    ///
    /// # Errors
    ///
    /// [`PlotError::NoSamples`], [`PlotError::NoPanels`], [`PlotError::EmptyPanel`],
    /// [`PlotError::BadTime`], [`PlotError::LengthMismatch`] or [`PlotError::BadRange`].
    pub fn validate(&self) -> Result<(), PlotError> {
        if self.t.is_empty() {
            return Err(PlotError::NoSamples);
        }
        if self.panels.is_empty() {
            return Err(PlotError::NoPanels);
        }
        let mut prev = f64::NEG_INFINITY;
        for (index, &t) in self.t.iter().enumerate() {
            if !t.is_finite() || t < prev {
                return Err(PlotError::BadTime { index });
            }
            prev = t;
        }
        for p in &self.panels {
            if p.series.is_empty() {
                return Err(PlotError::EmptyPanel {
                    panel: p.title.clone(),
                });
            }
            if let Some((lo, hi)) = p.range {
                if !(lo.is_finite() && hi.is_finite() && lo < hi) {
                    return Err(PlotError::BadRange {
                        panel: p.title.clone(),
                    });
                }
            }
            for s in &p.series {
                if s.values.len() != self.t.len() {
                    return Err(PlotError::LengthMismatch {
                        series: s.name.clone(),
                        expected: self.t.len(),
                        found: s.values.len(),
                    });
                }
            }
        }
        Ok(())
    }
}

impl Panel {
    /// A panel with no series and an automatic y range.
    #[must_use]
    pub fn new(title: impl Into<String>, unit: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            unit: unit.into(),
            range: None,
            series: Vec::new(),
        }
    }

    /// Fixes the y range (e.g. `0..100` for percentages).
    #[must_use]
    pub fn range(mut self, min: f64, max: f64) -> Self {
        self.range = Some((min, max));
        self
    }

    /// Appends a series.
    #[must_use]
    pub fn series(mut self, name: impl Into<String>, values: Vec<f64>) -> Self {
        self.series.push(Series {
            name: name.into(),
            values,
        });
        self
    }
}

/// Why a timeline could not be drawn or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// [`Timeline::t`] is empty.
    #[error("timeline has no time samples")]
    NoSamples,
    /// The timeline has no panels.
    #[error("timeline has no panels")]
    NoPanels,
    /// A panel has no series.
    #[error("panel {panel:?} has no series")]
    EmptyPanel {
        /// The panel's title.
        panel: String,
    },
    /// `t[index]` is not finite or is smaller than the sample before it.
    #[error("time sample {index} is not finite or goes backwards")]
    BadTime {
        /// Index into [`Timeline::t`].
        index: usize,
    },
    /// A series does not have one value per time sample.
    #[error("series {series:?} has {found} values for {expected} time samples")]
    LengthMismatch {
        /// The series' name.
        series: String,
        /// Number of time samples.
        expected: usize,
        /// Number of values.
        found: usize,
    },
    /// A fixed range is not finite with min < max.
    #[error("panel {panel:?} has a range that is not finite with min < max")]
    BadRange {
        /// The panel's title.
        panel: String,
    },
    /// The output path has no file name.
    #[error("{}: not a file path", .0.display())]
    BadPath(PathBuf),
    /// Writing the file failed; the target was left as it was.
    #[error("{}: cannot write: {message}", path.display())]
    Io {
        /// The file being written.
        path: PathBuf,
        /// The I/O error's kind.
        kind: io::ErrorKind,
        /// The I/O error's message.
        message: String,
    },
}

/// Reduces `(t[i], values[i])` to at most `max_points` points (at least 2) that keep the shape:
/// the time span is cut into `max_points / 2` equal buckets and each bucket contributes its minimum
/// and maximum, in time order, so a one-sample spike is never lost. Non-finite values are skipped; a
/// bucket with only non-finite values yields one NaN point, which draws as a gap. Series no longer
/// than `max_points` are returned whole. `t` must be sorted; extra elements of the longer slice are
/// ignored.
#[must_use]
pub fn downsample(t: &[f64], values: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let n = t.len().min(values.len());
    let max_points = max_points.max(2);
    if n <= max_points {
        return t
            .iter()
            .copied()
            .zip(values.iter().copied())
            .take(n)
            .collect();
    }
    let buckets = max_points / 2;
    let (t0, t1) = (t[0], t[n - 1]);
    let span = t1 - t0;
    let bucket_of = |x: f64| -> usize {
        if span > 0.0 {
            (((x - t0) / span * buckets as f64) as usize).min(buckets - 1)
        } else {
            0
        }
    };
    let mut out = Vec::with_capacity(max_points);
    let mut i = 0;
    while i < n {
        let b = bucket_of(t[i]);
        let start = i;
        // (index of min, index of max) among finite values in this bucket.
        let mut extremes: Option<(usize, usize)> = None;
        while i < n && bucket_of(t[i]) == b {
            let v = values[i];
            if v.is_finite() {
                extremes = Some(match extremes {
                    None => (i, i),
                    Some((lo, hi)) => (
                        if v < values[lo] { i } else { lo },
                        if v > values[hi] { i } else { hi },
                    ),
                });
            }
            i += 1;
        }
        match extremes {
            None => out.push((t[start], f64::NAN)),
            Some((lo, hi)) => {
                let (a, b) = (lo.min(hi), lo.max(hi));
                out.push((t[a], values[a]));
                if b != a {
                    out.push((t[b], values[b]));
                }
            }
        }
    }
    debug_assert!(out.len() <= max_points);
    out
}

/// Draws the timeline as a standalone SVG document.
///
/// # Errors
///
/// Whatever [`Timeline::validate`] reports.
pub fn render_svg(timeline: &Timeline) -> Result<String, PlotError> {
    timeline.validate()?;
    let mut out = String::with_capacity(64 * 1024);
    // `fmt::Write` for `String` never returns an error, so there is nothing to report here.
    let _infallible: fmt::Result = draw(&mut out, timeline);
    Ok(out)
}

/// Renders `timeline` and writes it to `path` atomically: the SVG goes to a temporary file in the same
/// directory (`.NAME.PID-N.svg.tmp`), is flushed to disk, then renamed over `path`. On any error the
/// temporary file is removed and `path` is left untouched.
///
/// # Errors
///
/// [`Timeline::validate`]'s errors (nothing is written), [`PlotError::BadPath`] when `path` has no
/// file name, and [`PlotError::Io`] when creating, writing or renaming fails.
pub fn write_svg_atomic(path: impl AsRef<Path>, timeline: &Timeline) -> Result<(), PlotError> {
    let path = path.as_ref();
    let svg = render_svg(timeline)?;
    write_atomic(path, svg.as_bytes())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PlotError> {
    if path.file_name().is_none() {
        return Err(PlotError::BadPath(path.to_path_buf()));
    }
    crate::stats::write_atomic(path, bytes).map_err(|e| PlotError::Io {
        path: path.to_path_buf(),
        kind: e.kind(),
        message: e.to_string(),
    })
}

// ---------------------------------------------------------------------------------------------
// Drawing.

/// Escapes text for XML content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0 text.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A "nice" step (1, 2 or 5 × 10^k) giving about `target` intervals over `span`.
fn nice_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// Tick positions: multiples of `step` within `[lo, hi]` (with a little slack for rounding).
fn ticks(lo: f64, hi: f64, step: f64) -> Vec<f64> {
    let first = (lo / step - 1e-9).ceil();
    let last = (hi / step + 1e-9).floor();
    if !(first.is_finite() && last.is_finite()) || last - first > 100.0 {
        return vec![lo, hi];
    }
    let mut out = Vec::new();
    let mut k = first;
    while k <= last {
        out.push(k * step);
        k += 1.0;
    }
    out
}

/// A tick label: enough decimals for `step`, `k` / `M` suffixes for large magnitudes.
fn tick_label(v: f64, step: f64) -> String {
    let (scale, suffix) = if step >= 1e6 {
        (1e6, "M")
    } else if step >= 1e3 && v.abs() >= 1e4 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    let s = step / scale;
    let decimals = if s >= 1.0 {
        0
    } else {
        ((-s.log10()).ceil() as usize).min(6)
    };
    let text = format!("{:.*}{suffix}", decimals, v / scale);
    // "-0" and "-0.0" read badly.
    if text
        .trim_start_matches('-')
        .chars()
        .all(|c| c == '0' || c == '.')
    {
        text.trim_start_matches('-').to_owned()
    } else {
        text
    }
}

/// The y range of a panel: its fixed range, or 0 (or the data minimum if lower) up to a nice
/// ceiling above the data maximum.
fn y_range(panel: &Panel) -> (f64, f64, f64) {
    if let Some((lo, hi)) = panel.range {
        return (lo, hi, nice_step(hi - lo, 4.0));
    }
    let finite = panel
        .series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .filter(|v| v.is_finite());
    let (mut lo, mut hi) = finite.fold((0.0f64, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if hi <= lo {
        hi = lo + 1.0;
    }
    let step = nice_step(hi - lo, 4.0);
    lo = (lo / step).floor() * step;
    hi = (hi / step).ceil() * step;
    (lo, hi, step)
}

fn draw(out: &mut String, tl: &Timeline) -> fmt::Result {
    let panels = tl.panels.len() as f64;
    let height = (TOP + BOTTOM + panels * PANEL_SLOT_MIN).max(700.0);
    let slot = (height - TOP - BOTTOM) / panels;
    let plot_w = WIDTH - LEFT - RIGHT;
    let (t0, mut t1) = (tl.t[0], tl.t[tl.t.len() - 1]);
    if t1 <= t0 {
        t1 = t0 + 1.0;
    }
    let x_of = |t: f64| LEFT + (t - t0) / (t1 - t0) * plot_w;
    let x_step = nice_step(t1 - t0, 8.0);
    let x_ticks = ticks(t0, t1, x_step);

    writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    )?;
    writeln!(out, "<title>{}</title>", esc(&tl.title))?;
    writeln!(
        out,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white"/>"#
    )?;
    writeln!(
        out,
        r#"<text x="{LEFT}" y="26" font-size="18" font-weight="bold">{}</text>"#,
        esc(&tl.title)
    )?;
    if !tl.subtitle.is_empty() {
        writeln!(
            out,
            r##"<text x="{LEFT}" y="46" fill="#555">{}</text>"##,
            esc(&tl.subtitle)
        )?;
    }

    let mut colour = 0usize;
    for (pi, panel) in tl.panels.iter().enumerate() {
        let top = TOP + pi as f64 * slot + PANEL_HEADER;
        let h = slot - PANEL_HEADER - 8.0;
        let bottom = top + h;
        let (y0, y1, y_step) = y_range(panel);
        let y_of = |v: f64| bottom - (v - y0) / (y1 - y0) * h;

        writeln!(out, r#"<g class="panel">"#)?;
        writeln!(
            out,
            r#"<clipPath id="clip{pi}"><rect x="{LEFT}" y="{top:.1}" width="{plot_w}" height="{h:.1}"/></clipPath>"#
        )?;
        writeln!(
            out,
            r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">{}</text>"#,
            top - 8.0,
            esc(&panel.title)
        )?;
        // Grid and y ticks.
        for v in ticks(y0, y1, y_step) {
            let y = y_of(v);
            writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##,
                LEFT + plot_w
            )?;
            writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                LEFT - 6.0,
                y + 4.0,
                esc(&tick_label(v, y_step))
            )?;
        }
        // Vertical grid at the shared x ticks.
        for &t in &x_ticks {
            let x = x_of(t);
            writeln!(
                out,
                r##"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="#f0f0f0"/>"##
            )?;
        }
        // Unit label, rotated along the y axis.
        let cy = top + h / 2.0;
        writeln!(
            out,
            r#"<text x="20" y="{cy:.1}" text-anchor="middle" transform="rotate(-90 20 {cy:.1})">{}</text>"#,
            esc(&panel.unit)
        )?;
        // Series.
        for (si, s) in panel.series.iter().enumerate() {
            let c = PALETTE[(colour + si) % PALETTE.len()];
            let pts = downsample(&tl.t, &s.values, MAX_POINTS);
            let mut d = String::with_capacity(pts.len() * 14);
            let mut pen_down = false;
            for (t, v) in pts {
                if v.is_finite() {
                    write!(
                        d,
                        "{}{:.1},{:.1}",
                        if pen_down { " L" } else { " M" },
                        x_of(t),
                        y_of(v)
                    )?;
                    pen_down = true;
                } else {
                    pen_down = false;
                }
            }
            writeln!(
                out,
                r#"<path d="{}" fill="none" stroke="{c}" stroke-width="1.6" stroke-linejoin="round" clip-path="url(#clip{pi})"><title>{}</title></path>"#,
                d.trim_start(),
                esc(&s.name)
            )?;
            // Legend entry.
            let ly = top + 10.0 + si as f64 * 18.0;
            let lx = LEFT + plot_w + 14.0;
            writeln!(
                out,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="3"/>"#,
                lx + 18.0
            )?;
            writeln!(
                out,
                r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 24.0,
                ly + 4.0,
                esc(&s.name)
            )?;
        }
        colour += panel.series.len();
        // Frame on top of the lines.
        writeln!(
            out,
            r##"<rect x="{LEFT}" y="{top:.1}" width="{plot_w}" height="{h:.1}" fill="none" stroke="#888"/>"##
        )?;
        writeln!(out, "</g>")?;
    }

    // Shared x axis under the last panel.
    let axis_y = height - BOTTOM - 8.0;
    for &t in &x_ticks {
        let x = x_of(t);
        writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{axis_y:.1}" x2="{x:.1}" y2="{:.1}" stroke="#888"/>"##,
            axis_y + 5.0
        )?;
        writeln!(
            out,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            axis_y + 18.0,
            esc(&tick_label(t, x_step))
        )?;
    }
    writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        height - 10.0,
        esc(&tl.x_label)
    )?;
    writeln!(out, "</svg>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// Minimal XML well-formedness check: balanced, properly nested tags, no stray `<` or `&`.
    fn assert_well_formed(svg: &str) {
        assert!(svg.starts_with("<svg"), "document must start with <svg");
        let mut stack: Vec<&str> = Vec::new();
        let mut rest = svg;
        while let Some(open) = rest.find('<') {
            let text = &rest[..open];
            assert!(!text.contains('>'), "stray '>' in text {text:?}");
            check_entities(text);
            let close = rest[open..].find('>').expect("unterminated tag") + open;
            let tag = &rest[open + 1..close];
            assert!(!tag.contains('<'), "'<' inside tag {tag:?}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop(), Some(name.trim()), "mismatched </{name}>");
            } else if !tag.ends_with('/') {
                stack.push(tag.split_whitespace().next().expect("empty tag"));
            }
            // Attribute values must be quoted pairs.
            assert_eq!(
                tag.matches('"').count() % 2,
                0,
                "unbalanced quotes in {tag:?}"
            );
            check_entities(tag);
            rest = &rest[close + 1..];
            if stack.is_empty() {
                assert!(rest.trim().is_empty(), "content after the root element");
            }
        }
        assert!(stack.is_empty(), "unclosed tags {stack:?}");
    }

    fn check_entities(s: &str) {
        for (i, _) in s.match_indices('&') {
            let ent = &s[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|e| ent.starts_with(e)),
                "bare & in {s:?}"
            );
        }
    }

    fn sample_timeline(n: usize) -> Timeline {
        let t: Vec<f64> = (0..n).map(|i| i as f64 * 0.05).collect();
        let wave = |k: f64| {
            t.iter()
                .map(|&x| ((x * k).sin() * 0.5 + 0.5) * 40.0)
                .collect::<Vec<f64>>()
        };
        Timeline::new("kvsched simulate <conv> & co", t.clone())
            .subtitle("azure2023 trace data/azure_conv_head.csv")
            .panel(
                Panel::new("requests", "requests")
                    .series("queue length", wave(0.3))
                    .series("running batch", wave(0.7)),
            )
            .panel(
                Panel::new("KV cache", "%")
                    .range(0.0, 100.0)
                    .series("KV GPU", wave(0.1))
                    .series("KV host", wave(0.2)),
            )
            .panel(Panel::new("LoRA", "adapters").series("adapters on device", wave(0.05)))
    }

    #[test]
    fn svg_is_well_formed_and_names_every_series() {
        let tl = sample_timeline(500);
        let svg = render_svg(&tl).unwrap();
        assert_well_formed(&svg);
        for name in [
            "queue length",
            "running batch",
            "KV GPU",
            "KV host",
            "adapters on device",
        ] {
            assert!(
                svg.contains(&format!(">{name}</text>")),
                "legend misses {name}"
            );
        }
        assert!(svg.contains("kvsched simulate &lt;conv&gt; &amp; co"));
        assert!(svg.contains("simulated time (s)"));
        assert!(svg.contains(r#"height="700""#));
        assert_eq!(svg.matches("<path ").count(), 5);
    }

    #[test]
    fn long_series_are_downsampled_to_max_points() {
        let tl = sample_timeline(50_000);
        let svg = render_svg(&tl).unwrap();
        assert_well_formed(&svg);
        for path in svg.split("<path d=\"").skip(1) {
            let d = &path[..path.find('"').unwrap()];
            let points = d.matches(['M', 'L']).count();
            assert!(points <= MAX_POINTS, "{points} points");
            assert!(points > MAX_POINTS / 2);
        }
        assert!(svg.len() < 400_000, "{} bytes", svg.len());
    }

    #[test]
    fn downsample_keeps_spikes_and_order() {
        let t: Vec<f64> = (0..100_000).map(f64::from).collect();
        let mut v = vec![1.0; 100_000];
        v[31_337] = 1000.0;
        v[77_777] = -5.0;
        let d = downsample(&t, &v, 2000);
        assert!(d.len() <= 2000);
        assert!(d.contains(&(31_337.0, 1000.0)));
        assert!(d.contains(&(77_777.0, -5.0)));
        assert!(d.windows(2).all(|w| w[0].0 < w[1].0));
        // Short series come back whole.
        assert_eq!(
            downsample(&t[..3], &v[..3], 2000),
            [(0.0, 1.0), (1.0, 1.0), (2.0, 1.0)]
        );
        // An all-NaN stretch stays a gap.
        let mut g = vec![2.0; 10_000];
        g[..5_000].fill(f64::NAN);
        let d = downsample(&t[..10_000], &g, 100);
        assert!(d[0].1.is_nan() && d.last().unwrap().1 == 2.0);
    }

    #[test]
    fn gaps_and_flat_or_single_sample_series_render() {
        let tl = Timeline::new("gaps", vec![0.0, 1.0, 2.0, 3.0]).panel(
            Panel::new("p", "u")
                .series("with gap", vec![1.0, f64::NAN, 2.0, 3.0])
                .series("flat", vec![0.0; 4]),
        );
        let svg = render_svg(&tl).unwrap();
        assert_well_formed(&svg);
        assert!(svg.contains(r#"d="M78.0,"#), "a path starts with a move");
        let single =
            Timeline::new("one", vec![5.0]).panel(Panel::new("p", "u").series("x", vec![7.0]));
        assert_well_formed(&render_svg(&single).unwrap());
    }

    #[test]
    fn many_panels_grow_the_image() {
        let mut tl = Timeline::new("many", vec![0.0, 1.0]);
        for i in 0..5 {
            tl = tl.panel(Panel::new(format!("p{i}"), "u").series(format!("s{i}"), vec![0.0, 1.0]));
        }
        let svg = render_svg(&tl).unwrap();
        assert_well_formed(&svg);
        assert!(svg.contains(&format!(
            r#"height="{}""#,
            TOP + BOTTOM + 5.0 * PANEL_SLOT_MIN
        )));
    }

    #[test]
    fn invalid_timelines_are_typed_errors() {
        let ok = || {
            Timeline::new("x", vec![0.0, 1.0])
                .panel(Panel::new("p", "u").series("s", vec![1.0, 2.0]))
        };
        assert_eq!(
            render_svg(&Timeline::new("x", vec![])),
            Err(PlotError::NoSamples)
        );
        assert_eq!(
            render_svg(&Timeline::new("x", vec![0.0])),
            Err(PlotError::NoPanels)
        );
        let mut tl = ok();
        tl.t[1] = -1.0;
        assert_eq!(render_svg(&tl), Err(PlotError::BadTime { index: 1 }));
        tl.t[1] = f64::NAN;
        assert_eq!(render_svg(&tl), Err(PlotError::BadTime { index: 1 }));
        let mut tl = ok();
        tl.panels[0].series[0].values.pop();
        assert_eq!(
            render_svg(&tl),
            Err(PlotError::LengthMismatch {
                series: "s".into(),
                expected: 2,
                found: 1
            })
        );
        let tl = ok().panel(Panel::new("empty", "u"));
        assert_eq!(
            render_svg(&tl),
            Err(PlotError::EmptyPanel {
                panel: "empty".into()
            })
        );
        let tl = ok().panel(
            Panel::new("r", "%")
                .range(100.0, 0.0)
                .series("s", vec![0.0, 0.0]),
        );
        assert_eq!(
            render_svg(&tl),
            Err(PlotError::BadRange { panel: "r".into() })
        );
    }

    #[test]
    fn tick_labels_are_round() {
        assert_eq!(nice_step(100.0, 4.0), 50.0);
        assert_eq!(nice_step(3.0, 8.0), 0.5);
        assert_eq!(tick_label(0.30000000000000004, 0.1), "0.3");
        assert_eq!(tick_label(-0.0, 1.0), "0");
        assert_eq!(tick_label(20_000.0, 5_000.0), "20k");
        assert_eq!(tick_label(2_000.0, 1_000.0), "2000");
        assert_eq!(tick_label(3e6, 1e6), "3M");
        assert_eq!(ticks(0.0, 100.0, 25.0), [0.0, 25.0, 50.0, 75.0, 100.0]);
    }

    #[test]
    fn atomic_write_leaves_only_the_target() {
        let dir = std::env::temp_dir().join(format!(
            "kvsched-plot-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let target = dir.join("timeline.svg");
        write_svg_atomic(&target, &sample_timeline(100)).unwrap();
        // Overwrite in place.
        write_svg_atomic(&target, &sample_timeline(200)).unwrap();
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["timeline.svg"]);
        let svg = fs::read_to_string(&target).unwrap();
        assert_well_formed(&svg);
        assert_eq!(svg, render_svg(&sample_timeline(200)).unwrap());

        // An invalid timeline writes nothing and keeps the old file.
        let bad = Timeline::new("bad", vec![]);
        assert_eq!(write_svg_atomic(&target, &bad), Err(PlotError::NoSamples));
        assert_eq!(fs::read_to_string(&target).unwrap(), svg);

        // A missing directory is an I/O error and leaves no temp file behind.
        let err = write_svg_atomic(dir.join("missing/x.svg"), &sample_timeline(10)).unwrap_err();
        assert!(
            matches!(
                err,
                PlotError::Io {
                    kind: io::ErrorKind::NotFound,
                    ..
                }
            ),
            "{err}"
        );
        // Renaming onto a directory fails after the temp file was written: it must be cleaned up.
        fs::create_dir(dir.join("occupied.svg")).unwrap();
        fs::write(dir.join("occupied.svg/keep"), b"x").unwrap();
        assert!(matches!(
            write_svg_atomic(dir.join("occupied.svg"), &sample_timeline(10)),
            Err(PlotError::Io { .. })
        ));
        let mut names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["occupied.svg", "timeline.svg"]);
        assert_eq!(
            write_svg_atomic(Path::new("/"), &sample_timeline(10)),
            Err(PlotError::BadPath("/".into()))
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
