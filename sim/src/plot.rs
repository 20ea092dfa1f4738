//! SVG timelines for simulator runs, drawn with `plotters`.
//!
//! A [`Timeline`] is one shared x axis (simulated seconds, or a sweep's parameter) and a stack of
//! [`Panel`]s, one per unit — e.g. request counts (queue length, running batch), KV utilisation in %
//! (GPU tier, host tier), adapters resident on the device — each holding one or more [`Series`].
//! [`render_svg`] checks the timeline ([`Timeline::validate`]) and draws the panels on top of each
//! other at 1000 px wide (700 px tall for up to three panels), each with its axes, unit and a legend to
//! its right, under a title. Series longer than [`MAX_POINTS`] are [`downsample`]d with a min/max per
//! time bucket, so spikes survive; non-finite values leave gaps. [`write_svg_atomic`] writes the file
//! whole or not at all.
//!
//! ```
//! use kvsched_sim::plot::{render_svg, Panel, Timeline};
//!
//! let t = vec![0.0, 1.0, 2.0];
//! let timeline = Timeline::new("demo", t)
//!     .panel(Panel::new("requests", "requests").series("waiting", vec![3.0, 1.0, 0.0]))
//!     .panel(Panel::new("KV cache", "%").range(0.0, 100.0).series("GPU", vec![10.0, 55.0, 40.0]));
//! let svg = render_svg(&timeline).unwrap();
//! assert!(svg.starts_with("<svg"));
//! ```

use std::io;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

/// The most points drawn per series; longer series are downsampled.
pub const MAX_POINTS: usize = 2000;

/// Image width in pixels.
pub const WIDTH: u32 = 1000;

/// Series colours (Tableau 10), assigned in order across all panels.
const PALETTE: [(u8, u8, u8); 10] = [
    (0x4e, 0x79, 0xa7),
    (0xf2, 0x8e, 0x2b),
    (0xe1, 0x57, 0x59),
    (0x76, 0xb7, 0xb2),
    (0x59, 0xa1, 0x4f),
    (0xed, 0xc9, 0x48),
    (0xb0, 0x7a, 0xa1),
    (0xff, 0x9d, 0xa7),
    (0x9c, 0x75, 0x5f),
    (0xba, 0xb0, 0xac),
];

// Layout (pixels).
const LEFT: u32 = 78;
const RIGHT: u32 = 170;
const TOP: u32 = 62;
const BOTTOM: u32 = 52;
const PANEL_SLOT_MIN: u32 = 190;

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
    /// plotters refused to draw (its message).
    #[error("cannot draw: {0}")]
    Draw(String),
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
        /// The I/O error's message ([`crate::stats::io_reason`]: the system's, naming no path).
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
    draw(&mut out, timeline).map_err(|e| PlotError::Draw(e.to_string()))?;
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
        message: crate::stats::io_reason(&e),
    })
}

// ---------------------------------------------------------------------------------------------
// Drawing, with plotters.

/// The y range of a panel: its fixed range, or from 0 (or the data minimum if lower) to a little
/// above the data maximum.
fn y_range(panel: &Panel) -> (f64, f64) {
    if let Some(range) = panel.range {
        return range;
    }
    let finite = panel
        .series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .filter(|v| v.is_finite());
    let (lo, hi) = finite.fold((0.0f64, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if hi <= lo {
        (lo, lo + 1.0)
    } else {
        (lo, hi + (hi - lo) * 0.05)
    }
}

/// The stretches of a series between non-finite values (the gaps).
fn segments(points: &[(f64, f64)]) -> impl Iterator<Item = &[(f64, f64)]> {
    points
        .split(|(_, v)| !v.is_finite())
        .filter(|run| !run.is_empty())
}

type DrawResult = Result<(), DrawingAreaErrorKind<std::io::Error>>;

fn draw(svg: &mut String, tl: &Timeline) -> DrawResult {
    let height = (TOP + BOTTOM + tl.panels.len() as u32 * PANEL_SLOT_MIN).max(700);
    let root = SVGBackend::with_string(svg, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(TOP);
    head.draw_text(
        &tl.title,
        &("sans-serif", 20)
            .into_font()
            .style(FontStyle::Bold)
            .color(&BLACK),
        (LEFT as i32, 10),
    )?;
    head.draw_text(
        &tl.subtitle,
        &("sans-serif", 13).into_font().color(&RGBColor(85, 85, 85)),
        (LEFT as i32, 36),
    )?;
    let panels = tl.panels.len();
    let mut colour = 0;
    for (i, (area, panel)) in body
        .split_evenly((panels, 1))
        .iter()
        .zip(&tl.panels)
        .enumerate()
    {
        draw_panel(area, tl, panel, i + 1 == panels, &mut colour)?;
    }
    root.present()
}

/// One panel in `area`: its axes (the x axis's labels on the `last` one only), its series in the
/// palette's next colours (from `colour`), and its legend to the right.
fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    tl: &Timeline,
    panel: &Panel,
    last: bool,
    colour: &mut usize,
) -> DrawResult {
    let (t0, t1) = match (tl.t.first(), tl.t.last()) {
        (Some(&t0), Some(&t1)) if t1 > t0 => (t0, t1),
        (Some(&t0), _) => (t0, t0 + 1.0),
        _ => (0.0, 1.0),
    };
    let (y0, y1) = y_range(panel);
    let mut chart = ChartBuilder::on(area)
        .caption(
            &panel.title,
            ("sans-serif", 16).into_font().style(FontStyle::Bold),
        )
        .margin_right(RIGHT)
        .margin_bottom(if last { 4 } else { 8 })
        .x_label_area_size(if last { BOTTOM } else { 22 })
        .y_label_area_size(LEFT - 8)
        .build_cartesian_2d(t0..t1, y0..y1)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_labels(9)
        .y_labels(5)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 14))
        .y_desc(&panel.unit)
        .light_line_style(RGBColor(240, 240, 240));
    if last {
        mesh.x_desc(&tl.x_label);
    }
    mesh.draw()?;
    let first = *colour;
    for s in &panel.series {
        let style = series_colour(*colour).stroke_width(2);
        *colour += 1;
        let points = downsample(&tl.t, &s.values, MAX_POINTS);
        for run in segments(&points) {
            chart.draw_series(LineSeries::new(run.iter().copied(), style))?;
        }
    }
    // The legend to the right of the plotting area, in the margin kept for it (drawn on the panel's
    // area: the chart's own legend is clipped to the plotting area).
    let (px, py) = chart.plotting_area().get_base_pixel();
    let (ax, ay) = area.get_base_pixel();
    let x = px - ax + chart.plotting_area().dim_in_pixel().0 as i32 + 14;
    for (k, s) in panel.series.iter().enumerate() {
        let y = py - ay + 10 + 20 * k as i32;
        let swatch = [(x, y - 5), (x + SWATCH.0, y - 5 + SWATCH.1)];
        area.draw(&Rectangle::new(swatch, series_colour(first + k).filled()))?;
        let font = ("sans-serif", 14).into_font().color(&BLACK);
        area.draw(&Text::new(s.name.as_str(), (x + SWATCH.0 + 6, y - 7), font))?;
    }
    Ok(())
}

/// A legend swatch's width and height, pixels.
const SWATCH: (i32, i32) = (18, 10);

/// The `k`-th series' colour (across all panels).
fn series_colour(k: usize) -> RGBColor {
    let (r, g, b) = PALETTE[k % PALETTE.len()];
    RGBColor(r, g, b)
}

/// An axis tick's label: a whole number without a fraction (`60000`, not `60000.0`), else the
/// fewest decimals (up to 3) that show it.
fn tick(v: &f64) -> String {
    let v = *v;
    if (v - v.round()).abs() <= 1e-9 * v.abs().max(1.0) {
        return format!("{:.0}", v.round() + 0.0);
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
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

    /// The number of points of each series line or legend mark (the 2-pixel `<polyline>`s), in
    /// document order; axes and ticks are 1 pixel wide.
    fn polylines(svg: &str) -> Vec<usize> {
        svg.split("<polyline ")
            .skip(1)
            .filter(|l| l.contains(r#"stroke-width="2""#))
            .map(|l| {
                let at = l.find("points=\"").expect("points") + 8;
                l[at..at + l[at..].find('"').unwrap()]
                    .split_whitespace()
                    .count()
            })
            .collect()
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
                svg.contains(&format!(">\n{name}\n</text>")),
                "legend misses {name}"
            );
        }
        assert!(svg.contains("kvsched simulate &lt;conv&gt; &amp; co"));
        assert!(svg.contains("simulated time (s)"));
        assert!(svg.contains(r#"height="700""#));
        // One line per series (the legend's swatches are rectangles).
        assert_eq!(polylines(&svg).len(), 5);
    }

    #[test]
    fn long_series_are_downsampled_to_max_points() {
        let tl = sample_timeline(50_000);
        let svg = render_svg(&tl).unwrap();
        assert_well_formed(&svg);
        let lines = polylines(&svg);
        assert_eq!(lines.len(), 5);
        for points in lines.into_iter().filter(|&p| p > 2) {
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

    /// The value of attribute `name` in the tag `tag` (its text between `<` and `>`).
    fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        Some(&tag[at..at + tag[at..].find('"')?])
    }

    #[test]
    fn every_legend_entry_has_a_visible_swatch_in_its_series_colour_and_ticks_are_integers() {
        let t: Vec<f64> = (0..=120).map(|i| f64::from(i) * 500.0).collect();
        let ramp = |k: f64| t.iter().map(|&x| x * k).collect::<Vec<f64>>();
        let tl = Timeline::new("legend", t.clone())
            .panel(
                Panel::new("requests", "requests")
                    .series("queue", ramp(0.001))
                    .series("running batch", ramp(0.002)),
            )
            .panel(
                Panel::new("latency", "ms")
                    .series("p50", ramp(1.0))
                    .series("p99", ramp(2.0)),
            );
        let svg = render_svg(&tl).unwrap();
        let tags: Vec<&str> = svg
            .split('<')
            .skip(1)
            .map(|t| &t[..t.find('>').unwrap()])
            .collect();
        let texts: Vec<(&str, &str)> = svg
            .split("<text")
            .skip(1)
            .map(|t| {
                let tag = &t[..t.find('>').unwrap()];
                let body = &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()];
                (tag, body.trim())
            })
            .collect();
        let names = ["queue", "running batch", "p50", "p99"];
        for (k, name) in names.iter().enumerate() {
            let (r, g, b) = PALETTE[k];
            let colour = format!("#{r:02X}{g:02X}{b:02X}");
            let (label, _) = texts
                .iter()
                .find(|(_, body)| body == name)
                .expect("a label");
            let (lx, ly): (i32, i32) = (
                attr(label, "x").unwrap().parse().unwrap(),
                attr(label, "y").unwrap().parse().unwrap(),
            );
            // A filled rectangle of the series' colour, of some size, just left of its label.
            let swatch = tags.iter().filter(|t| t.starts_with("rect ")).find(|t| {
                let n = |a: &str| attr(t, a).and_then(|v| v.parse::<i32>().ok()).unwrap_or(-1);
                attr(t, "fill") == Some(colour.as_str())
                    && n("width") >= 8
                    && n("height") >= 4
                    && (lx - 40..lx).contains(&n("x"))
                    && (n("y") - ly).abs() <= 16
            });
            assert!(
                swatch.is_some(),
                "{name}: no swatch of {colour} by its label at ({lx}, {ly})"
            );
        }
        // Tick labels: whole numbers print without a fraction.
        let ticks: Vec<&str> = texts
            .iter()
            .map(|(_, b)| *b)
            .filter(|b| b.parse::<f64>().is_ok())
            .collect();
        assert!(ticks.contains(&"60000"), "{ticks:?}");
        for tick in &ticks {
            assert!(!tick.ends_with(".0"), "tick {tick}: {ticks:?}");
        }
        assert_eq!(super::tick(&0.25), "0.25");
        assert_eq!(super::tick(&-0.0), "0");
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
        // The gap splits its series into lines of 1 and 2 points; the flat one has 4.
        let mut lines = polylines(&svg);
        lines.sort_unstable();
        assert_eq!(lines, [1, 2, 4]);
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
            TOP + BOTTOM + 5 * PANEL_SLOT_MIN
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
