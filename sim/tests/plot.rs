//! The plots end to end: a synthetic workload's arrivals drawn as a timeline and written to disk.
#![cfg(feature = "plot")]

use kvsched_sim::plot::{render_svg, write_svg_atomic, Panel, Timeline};
use kvsched_workload::synthetic::{generate, SyntheticSpec};

#[test]
fn synthetic_workload_plots_to_an_svg_file() {
    let w = generate(&SyntheticSpec::slora(5.0, 2.0, 60.0, 9)).unwrap();
    assert_eq!(w.len(), 300);
    // Arrivals per second as a stand-in for simulator samples.
    let t: Vec<f64> = (0..=60).map(f64::from).collect();
    let per_s: Vec<f64> = t
        .iter()
        .map(|&s| {
            w.arrivals
                .iter()
                .filter(|a| a.at_ms > (s - 1.0) * 1000.0 && a.at_ms <= s * 1000.0)
                .count() as f64
        })
        .collect();
    let pct: Vec<f64> = per_s.iter().map(|v| (v * 10.0).min(100.0)).collect();
    let tl = Timeline::new("synthetic", t)
        .subtitle(w.source.to_string())
        .panel(Panel::new("requests", "requests").series("arrivals per second", per_s))
        .panel(
            Panel::new("KV cache", "%")
                .range(0.0, 100.0)
                .series("KV GPU", pct),
        );
    let dir = std::env::temp_dir().join(format!("kvsched-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("timeline.svg");
    write_svg_atomic(&out, &tl).unwrap();
    let written = std::fs::read_to_string(&out).unwrap();
    assert_eq!(written, render_svg(&tl).unwrap());
    assert!(written.contains("arrivals per second") && written.contains("KV GPU"));
    let entries: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(entries.len(), 1, "temporary file left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}
