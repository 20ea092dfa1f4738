//! candle's Q8_0 matmul gives a row the same bits alone and inside a batch: what the paged step's
//! identity rests on. A candle upgrade that breaks it fails here, loudly.

mod common;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use common::Rng;
use kvsched_engine::Weight;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Row `r` of `f(x)` for 8 rows, against `f` of that row alone and of the first 3 rows.
fn assert_row_invariant(what: &str, k: usize, n: usize, f: impl Fn(&[f32]) -> Vec<f32>) {
    let mut rng = Rng(0x5eed ^ (k * 31 + n) as u64);
    let x: Vec<f32> = (0..8 * k).map(|_| rng.unit() * 2.0).collect();
    let batch = f(&x);
    assert_eq!(batch.len(), 8 * n);
    let three = f(&x[..3 * k]);
    for r in 0..8 {
        let alone = f(&x[r * k..(r + 1) * k]);
        assert_eq!(
            bits(&alone),
            bits(&batch[r * n..(r + 1) * n]),
            "{what}: row {r} alone differs from row {r} in a batch of 8"
        );
        if r < 3 {
            assert_eq!(
                bits(&three[r * n..(r + 1) * n]),
                bits(&alone),
                "{what}: batch of 3"
            );
        }
    }
}

#[test]
fn q8_0_matmul_rows_are_batch_invariant_synthetic() {
    kvsched_engine::init_threads(1);
    // The model's shapes: k = 576 takes candle's vec-dot path, multiples of 256 its repacked
    // tiles (where the CPU has VNNI; the engine pads 576 to 768 there).
    for (k, n) in [
        (576, 192),
        (576, 960),
        (768, 960),
        (768, 3072),
        (1536, 576),
        (768, 3072),
    ] {
        let mut rng = Rng(k as u64 * 7 + n as u64);
        let w: Vec<f32> = (0..n * k).map(|_| rng.unit() * 0.1).collect();
        let w = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let q = QMatMul::QTensor(QTensor::quantize(&w, GgmlDType::Q8_0).unwrap().into());
        assert_row_invariant(&format!("Q8_0 {n}x{k}"), k, n, |x| {
            let rows = x.len() / k;
            let x = Tensor::from_slice(x, (rows, k), &Device::Cpu).unwrap();
            q.forward(&x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        });
    }
}

#[test]
fn the_models_matmuls_are_batch_invariant() {
    let Some(model) = common::model() else { return };
    let c = model.config();
    let (e, f) = (c.embedding, c.feed_forward);
    for (weight, k, n) in [
        (Weight::Qkv, e, e + 2 * c.kv_dim()),
        (Weight::O, e, e),
        (Weight::GateUp, e, 2 * f),
        (Weight::Down, f, e),
        (Weight::Output, e, c.vocab),
    ] {
        assert_row_invariant(&format!("{weight:?}"), k, n, |x| {
            model.linear(c.blocks - 1, weight, x).unwrap()
        });
    }
}
