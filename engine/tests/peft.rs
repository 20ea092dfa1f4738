//! PEFT adapter directories: `Lora::write_peft` then `Lora::load_peft` gives back the same adapter,
//! the rows of q's and k's `lora_B` are permuted per head into GGUF's rope order (checked against
//! a hand-written order, and against both ropes), F16 and BF16 tensors load, and every adapter the
//! engine cannot apply is refused with a message naming the file and the reason.

mod common;

use std::collections::HashMap;
use std::path::Path;

use kvsched_engine::{Lora, ModelConfig};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Value};

/// A model of SmolLM2-135M's shape (the test model's), without its file.
fn smol() -> ModelConfig {
    ModelConfig {
        architecture: "llama".into(),
        name: Some("synthetic SmolLM2-135M".into()),
        blocks: 30,
        embedding: 576,
        feed_forward: 1536,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        rope_base: 100_000.0,
        rms_eps: 1e-5,
        context_length: 8192,
        vocab: 49152,
        tied_embeddings: true,
        gemma: None,
    }
}

#[test]
fn the_synthetic_shape_is_the_test_models_and_its_adapters_round_trip() {
    let Some(model) = common::model() else { return };
    let (c, s) = (model.config(), smol());
    let shape = |c: &ModelConfig| (c.blocks, c.embedding, c.heads, c.kv_heads, c.head_dim);
    assert_eq!(shape(c), shape(&s));
    let lora = Lora::seeded(c, 4, 8.0, 0.2, 21);
    let dir = tempfile::tempdir().unwrap();
    lora.write_peft(c, dir.path()).unwrap();
    assert_eq!(Lora::load_peft(c, dir.path()).unwrap(), lora);
}

/// Two blocks, two query heads and one KV head of width 4: q and o are 8 × 8, k and v 4 × 8.
fn tiny() -> ModelConfig {
    ModelConfig {
        blocks: 2,
        embedding: 8,
        feed_forward: 16,
        heads: 2,
        kv_heads: 1,
        head_dim: 4,
        context_length: 64,
        vocab: 32,
        ..smol()
    }
}

const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const O: usize = 3;
const MODULES: [&str; 4] = ["q_proj", "k_proj", "v_proj", "o_proj"];

fn name(block: usize, p: usize, m: &str) -> String {
    format!(
        "base_model.model.model.layers.{block}.self_attn.{}.{m}.weight",
        MODULES[p]
    )
}

/// The adapter's matrices from its documented byte format: `[block][projection] = (A, B)`.
fn matrices(config: &ModelConfig, lora: &Lora) -> Vec<[(Vec<f32>, Vec<f32>); 4]> {
    let bytes = lora.to_bytes();
    let floats: Vec<f32> = bytes[16..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let r = lora.rank();
    let (e, kv) = (config.embedding, config.kv_dim());
    let outs = [e, kv, kv, e];
    let mut at = 0;
    let mut take = |n: usize| {
        at += n;
        floats[at - n..at].to_vec()
    };
    (0..config.blocks)
        .map(|_| outs.map(|o| (take(r * e), take(o * r))))
        .collect()
}

/// One tensor to write: name, dtype, shape, little-endian bytes.
type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

fn f32_tensor(name: String, shape: [usize; 2], values: &[f32]) -> Tensor {
    let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    (name, Dtype::F32, shape.to_vec(), bytes)
}

fn write_tensors(dir: &Path, tensors: &[Tensor]) {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("adapter_model.safetensors"), bytes).unwrap();
}

/// The tensors of a safetensors file, as f32 (F32 files only).
fn read_tensors(file: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(file).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            assert_eq!(v.dtype(), Dtype::F32, "{n}");
            let m = v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (n, (v.shape().to_vec(), m))
        })
        .collect()
}

fn read_config(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("adapter_config.json")).unwrap()).unwrap()
}

fn write_config(dir: &Path, config: &Value) {
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
}

/// A tiny rank-2 adapter written by `write_peft` into a fresh directory.
fn tiny_dir() -> (tempfile::TempDir, Lora) {
    let dir = tempfile::tempdir().unwrap();
    let lora = Lora::seeded(&tiny(), 2, 3.0, 0.5, 5);
    lora.write_peft(&tiny(), dir.path()).unwrap();
    (dir, lora)
}

#[test]
fn write_then_load_gives_back_the_same_adapter() {
    let config = smol();
    let dir = tempfile::tempdir().unwrap();
    let lora = Lora::seeded(&config, 8, 16.0, 0.1, 3);
    lora.write_peft(&config, dir.path()).unwrap();
    let back = Lora::load_peft(&config, dir.path()).unwrap();
    assert_eq!(back, lora);
    assert_eq!(back.to_bytes(), lora.to_bytes());
    let file = dir.path().join("adapter_model.safetensors");
    assert_eq!(Lora::load_peft(&config, &file).unwrap(), lora);

    let peft = read_config(dir.path());
    assert_eq!(peft["peft_type"], "LORA");
    assert_eq!(peft["r"], 8);
    assert_eq!(peft["lora_alpha"].as_f64(), Some(16.0));
    assert_eq!(peft["bias"], "none");
    assert_eq!(peft["base_model_name_or_path"], "");
    assert_eq!(peft["target_modules"], json!(MODULES));
    let tensors = read_tensors(&file);
    assert_eq!(tensors.len(), 30 * 4 * 2);
    let shape = |n: String| tensors[&n].0.clone();
    assert_eq!(shape(name(29, Q, "lora_A")), [8, 576]);
    assert_eq!(shape(name(29, Q, "lora_B")), [576, 8]);
    assert_eq!(shape(name(0, K, "lora_B")), [192, 8]);
    assert_eq!(shape(name(7, O, "lora_B")), [576, 8]);

    // A scale that is not a round number (7 / 3), on the tiny model.
    let odd = Lora::seeded(&tiny(), 3, 7.0, 0.5, 9);
    let dir = tempfile::tempdir().unwrap();
    odd.write_peft(&tiny(), &dir.path().join("made/here"))
        .unwrap();
    assert_eq!(
        Lora::load_peft(&tiny(), &dir.path().join("made/here")).unwrap(),
        odd
    );
    // write_peft refuses a model the adapter is not for, and a scale JSON cannot hold.
    let err = odd
        .write_peft(&tiny8(), dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("a model of another shape"), "{err}");
    let inf = Lora::seeded(&tiny(), 3, f32::INFINITY, 0.5, 9);
    let err = inf.write_peft(&tiny(), dir.path()).unwrap_err().to_string();
    assert!(err.contains("the scale inf is not finite"), "{err}");
    let other = Lora::seeded(&tiny(), 3, 7.0, 0.5, 10);
    assert_ne!(
        Lora::load_peft(&tiny(), &dir.path().join("made/here")).unwrap(),
        other
    );
}

/// Two blocks, two heads of width 8 (query and KV): every projection 16 × 16.
fn tiny8() -> ModelConfig {
    ModelConfig {
        embedding: 16,
        kv_heads: 2,
        head_dim: 8,
        ..tiny()
    }
}

/// The hand-made rank-2 adapter of the permutation tests, in Hugging Face's order, written to
/// `dir`: B's entry (row, c) is `100 row + c` (plus 1000 per projection, 10 000 per block), A's
/// entry (c, i) is `c - i / 10`.
fn hand_adapter(config: &ModelConfig, dir: &Path) -> Vec<[(Vec<f32>, Vec<f32>); 4]> {
    let (e, kv) = (config.embedding, config.kv_dim());
    let outs = [e, kv, kv, e];
    let mut want = Vec::new();
    let mut tensors = Vec::new();
    for block in 0..config.blocks {
        let mut pairs: [(Vec<f32>, Vec<f32>); 4] = Default::default();
        for p in 0..4 {
            let a: Vec<f32> = (0..2 * e)
                .map(|x| (x / e) as f32 - (x % e) as f32 / 10.0)
                .collect();
            let base = (10_000 * block + 1000 * p) as f32;
            let b: Vec<f32> = (0..outs[p] * 2)
                .map(|x| base + (100 * (x / 2) + x % 2) as f32)
                .collect();
            tensors.push(f32_tensor(name(block, p, "lora_A"), [2, e], &a));
            tensors.push(f32_tensor(name(block, p, "lora_B"), [outs[p], 2], &b));
            pairs[p] = (a, b);
        }
        want.push(pairs);
    }
    write_tensors(dir, &tensors);
    let peft = json!({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": MODULES,
        "bias": "none", "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"});
    write_config(dir, &peft);
    want
}

/// Loads the hand-made adapter for `config` and checks B's rows of q and k are in the hand-written
/// GGUF orders (v's and o's, and every A, as written), and that `write_peft` writes the
/// Hugging Face order back.
fn check_row_order(config: &ModelConfig, q_rows: &[usize], k_rows: &[usize]) {
    let dir = tempfile::tempdir().unwrap();
    let hf = hand_adapter(config, dir.path());
    let lora = Lora::load_peft(config, dir.path()).unwrap();
    assert_eq!((lora.rank(), lora.scale()), (2, 2.0));
    let got = matrices(config, &lora);
    let (v_rows, o_rows): (Vec<usize>, Vec<usize>) = (
        (0..config.kv_dim()).collect(),
        (0..config.embedding).collect(),
    );
    for block in 0..2 {
        let row = |p: usize, r: usize| {
            let base = (10_000 * block + 1000 * p) as f32;
            [base + (100 * r) as f32, base + (100 * r + 1) as f32]
        };
        let rows = |p: usize, order: &[usize]| -> Vec<f32> {
            order.iter().flat_map(|&r| row(p, r)).collect()
        };
        assert_eq!(got[block][Q].1, rows(Q, q_rows), "block {block} q");
        assert_eq!(got[block][K].1, rows(K, k_rows), "block {block} k");
        assert_eq!(got[block][V].1, rows(V, &v_rows), "block {block} v");
        assert_eq!(got[block][O].1, rows(O, &o_rows), "block {block} o");
        for p in 0..4 {
            assert_eq!(got[block][p].0, hf[block][p].0, "A keeps its order");
        }
    }
    // Written back, the rows are in Hugging Face's order again: the very tensors written by hand.
    let out = tempfile::tempdir().unwrap();
    lora.write_peft(config, out.path()).unwrap();
    let written = read_tensors(&out.path().join("adapter_model.safetensors"));
    for (block, pairs) in hf.iter().enumerate() {
        for (p, (a, b)) in pairs.iter().enumerate() {
            assert_eq!(&written[&name(block, p, "lora_A")].1, a);
            assert_eq!(
                &written[&name(block, p, "lora_B")].1,
                b,
                "block {block} {p}"
            );
        }
    }
}

#[test]
fn q_and_k_rows_of_b_are_permuted_per_head_into_gguf_order() {
    // GGUF row 2i + s of a head holds Hugging Face row s * head_dim/2 + i of it. Head width 4:
    // within each head the order 0, 2, 1, 3; q has two heads, k one (the KV head).
    check_row_order(&tiny(), &[0, 2, 1, 3, 4, 6, 5, 7], &[0, 2, 1, 3]);
    // Head width 8 (where the permutation is not its own inverse): 0, 4, 1, 5, 2, 6, 3, 7; k has
    // two heads here.
    let two_heads = [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15];
    check_row_order(&tiny8(), &two_heads, &two_heads);
}

/// Hugging Face's rope on one head: pairs (x[i], x[i + half]).
fn rope_halves(x: &mut [f32], angles: &[f32]) {
    let half = x.len() / 2;
    for (i, t) in angles.iter().enumerate() {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * t.cos() - b * t.sin();
        x[i + half] = a * t.sin() + b * t.cos();
    }
}

/// GGUF's (this engine's) rope on one head: pairs (x[2i], x[2i + 1]).
fn rope_adjacent(x: &mut [f32], angles: &[f32]) {
    for (i, t) in angles.iter().enumerate() {
        let (a, b) = (x[2 * i], x[2 * i + 1]);
        x[2 * i] = a * t.cos() - b * t.sin();
        x[2 * i + 1] = a * t.sin() + b * t.cos();
    }
}

fn delta(a: &[f32], b: &[f32], rank: usize, x: &[f32]) -> Vec<f32> {
    let t: Vec<f32> = a
        .chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(w, v)| w * v).sum())
        .collect();
    b.chunks_exact(rank)
        .map(|row| row.iter().zip(&t).map(|(w, v)| w * v).sum())
        .collect()
}

#[test]
fn the_permuted_adapter_gives_the_hugging_face_attention_scores() {
    // The score of each query head against its KV head, at positions 3 (q) and 1 (k), from the
    // adapter's q and k deltas: Hugging Face's layout and rope against the loaded layout and the
    // engine's rope.
    for config in [tiny(), tiny8()] {
        attention_scores_agree(&config);
    }
}

fn attention_scores_agree(config: &ModelConfig) {
    let dir = tempfile::tempdir().unwrap();
    let hf = hand_adapter(config, dir.path());
    let got = matrices(config, &Lora::load_peft(config, dir.path()).unwrap());
    let (e, hd) = (config.embedding, config.head_dim);
    let group = config.heads / config.kv_heads;
    let x: Vec<f32> = (0..e).map(|i| (i as f32 * 0.7).sin()).collect();
    let angles = |pos: f32| -> Vec<f32> {
        (0..hd / 2)
            .map(|i| pos / 100f32.powf(i as f32 / (hd / 2) as f32))
            .collect()
    };
    for block in 0..2 {
        let score = |pairs: &[(Vec<f32>, Vec<f32>); 4], rope: fn(&mut [f32], &[f32])| {
            let mut q = delta(&pairs[Q].0, &pairs[Q].1, 2, &x);
            let mut k = delta(&pairs[K].0, &pairs[K].1, 2, &x);
            q.chunks_exact_mut(hd).for_each(|h| rope(h, &angles(3.0)));
            k.chunks_exact_mut(hd).for_each(|h| rope(h, &angles(1.0)));
            q.chunks_exact(hd)
                .enumerate()
                .map(|(h, qh)| {
                    let kh = &k[h / group * hd..(h / group + 1) * hd];
                    qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f32>()
                })
                .collect::<Vec<f32>>()
        };
        let (want, have) = (
            score(&hf[block], rope_halves),
            score(&got[block], rope_adjacent),
        );
        for (w, h) in want.iter().zip(&have) {
            assert!(
                (w - h).abs() <= 1e-3 * w.abs().max(1.0),
                "{want:?} {have:?}"
            );
        }
        // Unpermuted, the engine's rope gives other scores: the permutation matters.
        let wrong = score(&hf[block], rope_adjacent);
        assert!(
            wrong.iter().zip(&want).any(|(a, b)| (a - b).abs() > 1.0),
            "{wrong:?}"
        );
    }
}

#[test]
fn f16_and_bf16_tensors_load() {
    let dir = tempfile::tempdir().unwrap();
    let hf = hand_adapter(&tiny(), dir.path());
    let want = Lora::load_peft(&tiny(), dir.path()).unwrap();
    // The same values, A in F16 and B in BF16 (all of them exact in both: small integers, or
    // tenths rounded the same way the loader must widen them).
    let mut tensors = Vec::new();
    let mut rounded = Vec::new();
    for (block, pairs) in hf.iter().enumerate() {
        for (p, (a, b)) in pairs.iter().enumerate() {
            let a16: Vec<half::f16> = a.iter().map(|&v| half::f16::from_f32(v)).collect();
            let b16: Vec<half::bf16> = b.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let (ra, rb): (Vec<f32>, Vec<f32>) = (
                a16.iter().map(|v| v.to_f32()).collect(),
                b16.iter().map(|v| v.to_f32()).collect(),
            );
            let bytes_a = a16.iter().flat_map(|v| v.to_le_bytes()).collect();
            let bytes_b = b16.iter().flat_map(|v| v.to_le_bytes()).collect();
            tensors.push((name(block, p, "lora_A"), Dtype::F16, vec![2, 8], bytes_a));
            tensors.push((
                name(block, p, "lora_B"),
                Dtype::BF16,
                vec![b.len() / 2, 2],
                bytes_b,
            ));
            rounded.push(f32_tensor(name(block, p, "lora_A"), [2, 8], &ra));
            rounded.push(f32_tensor(name(block, p, "lora_B"), [b.len() / 2, 2], &rb));
        }
    }
    write_tensors(dir.path(), &tensors);
    let half_lora = Lora::load_peft(&tiny(), dir.path()).unwrap();
    write_tensors(dir.path(), &rounded);
    assert_eq!(half_lora, Lora::load_peft(&tiny(), dir.path()).unwrap());
    // BF16 keeps 8 significant bits: between 8192 and 16 384 its steps are 64, so block 1's o
    // row 7 (13 700) is 13 696 there and B differs from the F32 adapter; F16 rounds A's tenths.
    assert_ne!(half_lora, want);
    let (got, exact) = (matrices(&tiny(), &half_lora), matrices(&tiny(), &want));
    assert_eq!(got[0][Q].1[..2], [0.0, 1.0], "0 and 1 are exact");
    assert_eq!(exact[1][O].1[14], 13_700.0);
    assert_eq!(got[1][O].1[14], 13_696.0, "bf16(13 700)");
    assert_eq!(exact[0][Q].0[1], -0.1);
    assert!((got[0][Q].0[1] - -0.1).abs() < 1e-4 && got[0][Q].0[1] != -0.1);
}

/// `load_peft`'s error on `dir`, checked to be an adapter error naming `file` (in `dir`).
fn refusal(config: &ModelConfig, dir: &Path, file: &str) -> String {
    let err = Lora::load_peft(config, dir).expect_err("the adapter is refused");
    assert!(
        matches!(err, kvsched_engine::EngineError::Adapter(_)),
        "{err:?}"
    );
    let message = err.to_string();
    let path = if file.is_empty() {
        dir.display().to_string()
    } else {
        dir.join(file).display().to_string()
    };
    assert!(message.contains(&path), "{message} does not name {path}");
    message
}

/// The tiny adapter with its configuration changed by `edit`, loaded: its error message.
fn refused_config(edit: impl FnOnce(&mut Value)) -> String {
    let (dir, _) = tiny_dir();
    let mut peft = read_config(dir.path());
    edit(&mut peft);
    write_config(dir.path(), &peft);
    refusal(&tiny(), dir.path(), "adapter_config.json")
}

fn assert_says(message: &str, what: &str) {
    assert!(message.contains(what), "{message:?} does not say {what:?}");
}

#[test]
fn configurations_the_engine_cannot_apply_are_refused() {
    let m = refused_config(|c| c["use_dora"] = json!(true));
    assert_says(&m, "use_dora is true: DoRA");
    let m = refused_config(|c| {
        c["target_modules"] = json!(["q_proj", "gate_proj", "v_proj", "up_proj", "down_proj"]);
    });
    assert_says(&m, "target_modules names gate_proj, up_proj, down_proj");
    assert_says(&m, "q_proj, k_proj, v_proj and o_proj only");
    let m = refused_config(|c| c["target_modules"] = json!("all-linear"));
    assert_says(&m, "\"all-linear\", the MLP's too");
    let m = refused_config(|c| c["target_modules"] = json!(".*attn.*"));
    assert_says(&m, "target_modules is the pattern \".*attn.*\"");
    let m = refused_config(|c| c["target_modules"] = json!([]));
    assert_says(&m, "target_modules names no module");
    let m = refused_config(|c| c["target_modules"] = json!({"q_proj": true}));
    assert_says(
        &m,
        "target_modules is {\"q_proj\":true}, not a list of names",
    );
    let m = refused_config(|c| c["rank_pattern"] = json!({"q_proj": 4}));
    assert_says(&m, "rank_pattern is {\"q_proj\":4}: per-module ranks");
    let m = refused_config(|c| c["alpha_pattern"] = json!({"v_proj": 32}));
    assert_says(&m, "alpha_pattern is {\"v_proj\":32}: per-module alphas");
    let m = refused_config(|c| c["modules_to_save"] = json!(["lm_head"]));
    assert_says(&m, "modules_to_save is [\"lm_head\"]");
    let m = refused_config(|c| c["layers_to_transform"] = json!([0]));
    assert_says(&m, "layers_to_transform is [0]");
    let m = refused_config(|c| c["alora_invocation_tokens"] = json!([128, 9]));
    assert_says(&m, "alora_invocation_tokens is [128,9]: activated LoRA");
    let m = refused_config(|c| c["target_modules"] = json!(["q_proj", 3]));
    assert_says(&m, "target_modules holds a value that is not a name");
    let m = refused_config(|c| c["bias"] = json!("lora_only"));
    assert_says(&m, "bias is \"lora_only\": trained biases");
    let m = refused_config(|c| c["peft_type"] = json!("LOHA"));
    assert_says(&m, "peft_type is \"LOHA\", not \"LORA\"");
    let m = refused_config(|c| c["r"] = json!(0));
    assert_says(&m, "r is 0, not a rank from 1 to 1024");
    let m = refused_config(|c| {
        c.as_object_mut().unwrap().remove("lora_alpha");
    });
    assert_says(&m, "lora_alpha is null, not a number");
    let m = refused_config(|c| *c = json!([1, 2]));
    assert_says(&m, "not a JSON object");
    let (dir, _) = tiny_dir();
    std::fs::write(dir.path().join("adapter_config.json"), "{\"r\": 2,").unwrap();
    assert_says(
        &refusal(&tiny(), dir.path(), "adapter_config.json"),
        "not a JSON file",
    );
    std::fs::remove_file(dir.path().join("adapter_config.json")).unwrap();
    assert_says(
        &refusal(&tiny(), dir.path(), "adapter_config.json"),
        "cannot read the file",
    );
}

#[test]
fn what_the_configuration_may_say_and_the_engine_applies() {
    // Empty patterns, a base model's name, rsLoRA (scale alpha / sqrt(r)), dotted module names.
    let (dir, lora) = tiny_dir();
    let mut peft = read_config(dir.path());
    peft["rank_pattern"] = json!({});
    peft["alpha_pattern"] = json!({});
    peft["base_model_name_or_path"] = json!("HuggingFaceTB/SmolLM2-135M-Instruct");
    peft["target_modules"] = json!(["self_attn.q_proj", "k_proj", "v_proj", "o_proj", "q_proj"]);
    peft["use_dora"] = json!(false);
    write_config(dir.path(), &peft);
    assert_eq!(Lora::load_peft(&tiny(), dir.path()).unwrap(), lora);
    peft["use_rslora"] = json!(true);
    write_config(dir.path(), &peft);
    let rs = Lora::load_peft(&tiny(), dir.path()).unwrap();
    assert_eq!(rs.scale(), (3.0 / 2f64.sqrt()) as f32);
    assert_eq!(lora.scale(), 1.5);
    assert_eq!(
        rs.to_bytes()[16..],
        lora.to_bytes()[16..],
        "only the scale differs"
    );
}

#[test]
fn an_untargeted_projection_contributes_nothing() {
    let (dir, lora) = tiny_dir();
    let full = matrices(&tiny(), &lora);
    let mut peft = read_config(dir.path());
    peft["target_modules"] = json!(["q_proj", "v_proj"]);
    write_config(dir.path(), &peft);
    // The file still holds k's and o's tensors, which the configuration does not name.
    let m = refusal(&tiny(), dir.path(), "adapter_model.safetensors");
    assert_says(
        &m,
        "self_attn.k_proj.lora_A.weight: target_modules does not name it",
    );
    let file = dir.path().join("adapter_model.safetensors");
    let kept: Vec<Tensor> = read_tensors(&file)
        .into_iter()
        .filter(|(n, _)| n.contains("q_proj") || n.contains("v_proj"))
        .map(|(n, (s, v))| f32_tensor(n, [s[0], s[1]], &v))
        .collect();
    write_tensors(dir.path(), &kept);
    let got = matrices(&tiny(), &Lora::load_peft(&tiny(), dir.path()).unwrap());
    for block in 0..2 {
        for p in [Q, V] {
            assert_eq!(got[block][p], full[block][p]);
        }
        for p in [K, O] {
            assert!(got[block][p]
                .0
                .iter()
                .chain(&got[block][p].1)
                .all(|&x| x == 0.0));
            assert_eq!(got[block][p].1.len(), full[block][p].1.len());
        }
    }
}

/// The tiny adapter's tensors changed by `edit`, loaded into `config`: its error message.
fn refused_tensors(config: &ModelConfig, edit: impl FnOnce(&mut Vec<Tensor>)) -> String {
    let (dir, _) = tiny_dir();
    let file = dir.path().join("adapter_model.safetensors");
    let mut tensors: Vec<Tensor> = read_tensors(&file)
        .into_iter()
        .map(|(n, (s, v))| f32_tensor(n, [s[0], s[1]], &v))
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    edit(&mut tensors);
    write_tensors(dir.path(), &tensors);
    refusal(config, dir.path(), "adapter_model.safetensors")
}

#[test]
fn weights_the_engine_cannot_apply_are_refused() {
    let missing = name(1, K, "lora_A");
    let m = refused_tensors(&tiny(), |t| t.retain(|t| t.0 != missing));
    assert_says(&m, &format!("tensor {missing} is missing"));
    let mlp = "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight".to_string();
    let m = refused_tensors(&tiny(), |t| {
        t.push(f32_tensor(mlp.clone(), [2, 8], &[0.0; 16]));
    });
    assert_says(
        &m,
        &format!("tensor {mlp}: it is not a lora_A or lora_B weight"),
    );
    let past = name(2, Q, "lora_A");
    let m = refused_tensors(&tiny(), |t| {
        t.push(f32_tensor(past.clone(), [2, 8], &[0.0; 16]));
    });
    assert_says(
        &m,
        &format!("tensor {past}: its block is past the model's last"),
    );
    // Another model: KV heads of 2 make k's B 8 × 2, the file's is 4 × 2.
    let wider = ModelConfig {
        kv_heads: 2,
        ..tiny()
    };
    let m = refused_tensors(&wider, |_| {});
    assert_says(
        &m,
        &format!(
            "tensor {} has shape [4, 2], the model and r = 2 need [8, 2]",
            name(0, K, "lora_B")
        ),
    );
    let a = name(0, V, "lora_A");
    let m = refused_tensors(&tiny(), |t| {
        let at = t.iter().position(|t| t.0 == a).unwrap();
        t[at] = (a.clone(), Dtype::F64, vec![2, 8], vec![0; 128]);
    });
    assert_says(
        &m,
        &format!("tensor {a} is F64; F32, F16 or BF16 is needed"),
    );
    let m = refused_tensors(&tiny(), |t| {
        let at = t.iter().position(|t| t.0 == a).unwrap();
        t[at] = f32_tensor(a.clone(), [2, 8], &[f32::NAN; 16]);
    });
    assert_says(
        &m,
        &format!("tensor {a} holds a value that is not a finite number"),
    );
}

#[test]
fn a_rank_the_tensors_do_not_have_and_unreadable_weights_are_refused() {
    let (dir, _) = tiny_dir();
    let mut peft = read_config(dir.path());
    peft["r"] = json!(4);
    write_config(dir.path(), &peft);
    let m = refusal(&tiny(), dir.path(), "adapter_model.safetensors");
    assert_says(&m, "has shape [2, 8], the model and r = 4 need [4, 8]");
    // Not a safetensors file, and no file at all.
    std::fs::write(
        dir.path().join("adapter_model.safetensors"),
        b"PK\x03\x04 zip",
    )
    .unwrap();
    let m = refusal(&tiny(), dir.path(), "adapter_model.safetensors");
    assert_says(&m, "not a safetensors file");
    let nowhere = dir.path().join("nowhere");
    let m = refusal(&tiny(), &nowhere, "");
    assert_says(&m, "nowhere: cannot read the file");
}
