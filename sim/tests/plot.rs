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

/// The run's KV panel splits the GPU tier's pages three ways — held by requests, cached by the
/// prefix cache and held by none, free — which add up to the whole tier at every sample; a replay
/// with prefix reuse shows its cache, which outgrows what the requests hold.
#[test]
fn the_kv_panel_splits_the_pool_into_held_cached_and_free() {
    let w = generate(&SyntheticSpec::slora(4.0, 1.0, 60.0, 3)).unwrap();
    let o = kvsched_sim::SimOptions {
        progress: false,
        ..kvsched_sim::SimOptions::default()
    };
    let tl = kvsched_sim::run(&o, w).unwrap().timeline();
    let gpu = tl
        .panels
        .iter()
        .find(|p| p.title == "GPU KV pool")
        .expect("a GPU KV pool panel");
    let names: Vec<&str> = gpu.series.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["held by requests", "prefix cache", "free"]);
    let [held, cached, free] = [0, 1, 2].map(|k| &gpu.series[k].values);
    for i in 0..tl.t.len() {
        let sum = held[i] + cached[i] + free[i];
        assert!((sum - 100.0).abs() < 1e-6, "sample {i}: {sum}");
    }
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    assert!(max(cached) > max(held), "{} vs {}", max(cached), max(held));
    // The host tier holds nothing in this run; its panel is still drawn while the tier has pages.
    assert!(tl.panels.iter().any(|p| p.title == "host KV pool"));
}
