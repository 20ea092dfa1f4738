//! Bad input is a typed, one-line error naming the file, before any work: a missing path, a file
//! that is not GGUF, a truncated GGUF, an unsupported architecture or quantization, a Gemma 3 file
//! missing a key or a tensor or beyond what the engine runs; and a batch the
//! step cannot run is refused whole.

mod common;

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use kvsched_engine::{
    Batch, BlockTableShape, EngineError, HostKvStore, Model, Sequence, Tokenizer,
};

fn assert_one_line_naming(error: &EngineError, path: &Path) -> String {
    let message = error.to_string();
    assert!(!message.contains('\n'), "{message:?} is more than one line");
    assert!(
        message.starts_with(&path.display().to_string()),
        "{message:?} does not start with {}",
        path.display()
    );
    message
}

#[test]
fn a_missing_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-model.gguf");
    let error = Model::load(&path).unwrap_err();
    assert!(matches!(error, EngineError::Io { .. }), "{error:?}");
    let message = assert_one_line_naming(&error, &path);
    assert!(message.contains("cannot read the model file"), "{message}");
    assert!(matches!(
        Tokenizer::load(&path),
        Err(EngineError::Io { .. })
    ));
}

#[test]
fn a_file_that_is_not_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.gguf");
    std::fs::write(&path, "hello, this is text\n").unwrap();
    let error = Model::load(&path).unwrap_err();
    assert!(matches!(error, EngineError::NotGguf { .. }), "{error:?}");
    let message = assert_one_line_naming(&error, &path);
    assert!(message.contains("not a GGUF file"), "{message}");
    std::fs::write(&path, "").unwrap();
    let error = Model::load(&path).unwrap_err();
    assert!(error.to_string().contains("the file is empty"), "{error}");
}

/// A tiny llama GGUF (one block, embedding 256): `arch`, and `token_embd` quantized as `embd`.
fn tiny_gguf(path: &Path, arch: &str, embd: GgmlDType) {
    let (vocab, e, ffn) = (8usize, 256usize, 512usize);
    let t = |shape: &[usize], dtype| {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| ((i % 17) as f32 - 8.0) / 64.0).collect();
        let t = Tensor::from_vec(data, shape, &Device::Cpu).unwrap();
        QTensor::quantize(&t, dtype).unwrap()
    };
    let mut tensors = vec![
        ("token_embd.weight".to_string(), t(&[vocab, e], embd)),
        ("output_norm.weight".to_string(), t(&[e], GgmlDType::F32)),
    ];
    for (name, shape) in [
        ("attn_norm", vec![e]),
        ("attn_q", vec![e, e]),
        ("attn_k", vec![e, e]),
        ("attn_v", vec![e, e]),
        ("attn_output", vec![e, e]),
        ("ffn_norm", vec![e]),
        ("ffn_gate", vec![ffn, e]),
        ("ffn_up", vec![ffn, e]),
        ("ffn_down", vec![e, ffn]),
    ] {
        let dtype = if shape.len() == 1 {
            GgmlDType::F32
        } else {
            GgmlDType::Q8_0
        };
        tensors.push((format!("blk.0.{name}.weight"), t(&shape, dtype)));
    }
    let metadata = [
        ("general.architecture", Value::String(arch.into())),
        ("llama.block_count", Value::U32(1)),
        ("llama.embedding_length", Value::U32(e as u32)),
        ("llama.feed_forward_length", Value::U32(ffn as u32)),
        ("llama.attention.head_count", Value::U32(4)),
        ("llama.attention.head_count_kv", Value::U32(4)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.context_length", Value::U32(64)),
    ];
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut file, &metadata, &tensors).unwrap();
}

#[test]
fn an_unsupported_architecture_or_quantization() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-gpt2.gguf");
    tiny_gguf(&path, "gpt2", GgmlDType::Q8_0);
    let error = Model::load(&path).unwrap_err();
    assert!(
        matches!(error, EngineError::Unsupported { .. }),
        "{error:?}"
    );
    let message = assert_one_line_naming(&error, &path);
    assert!(message.contains("architecture \"gpt2\""), "{message}");

    // A state-space model's architecture is named as one.
    let path = dir.path().join("tiny-mamba2.gguf");
    tiny_gguf(&path, "mamba2", GgmlDType::Q8_0);
    let error = Model::load(&path).unwrap_err();
    let message = assert_one_line_naming(&error, &path);
    assert!(
        message.contains("architecture \"mamba2\", a recurrent (state-space) model"),
        "{message}"
    );

    let path = dir.path().join("tiny-q2k.gguf");
    tiny_gguf(&path, "llama", GgmlDType::Q2K);
    let error = Model::load(&path).unwrap_err();
    assert!(
        matches!(error, EngineError::Unsupported { .. }),
        "{error:?}"
    );
    let message = assert_one_line_naming(&error, &path);
    assert!(
        message.contains("token_embd.weight is quantized as Q2K"),
        "{message}"
    );
}

#[test]
fn a_truncated_synthetic_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    tiny_gguf(&path, "llama", GgmlDType::Q8_0);
    let bytes = std::fs::read(&path).unwrap();
    for keep in [bytes.len() - 100, 40] {
        let cut = dir.path().join(format!("tiny-cut-{keep}.gguf"));
        std::fs::write(&cut, &bytes[..keep]).unwrap();
        let error = Model::load(&cut).unwrap_err();
        assert!(
            matches!(error, EngineError::Corrupt { .. }),
            "{keep}: {error:?}"
        );
        assert_one_line_naming(&error, &cut);
    }
}

#[test]
fn a_truncated_copy_of_the_model() {
    let Some(model) = common::model_path() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(&model).unwrap();
    // Cut inside the tensor data, and inside the metadata (the vocabulary).
    for (keep, says) in [
        (bytes.len() / 2, "needs bytes"),
        (64 * 1024, "corrupt or truncated"),
    ] {
        let cut = dir.path().join(format!("cut-at-{keep}.gguf"));
        std::fs::write(&cut, &bytes[..keep]).unwrap();
        let start = std::time::Instant::now();
        let error = Model::load(&cut).unwrap_err();
        assert!(matches!(error, EngineError::Corrupt { .. }), "{error:?}");
        let message = assert_one_line_naming(&error, &cut);
        assert!(message.contains(says), "{message}");
        // Refused from the header and the tensor table, before any weight is read.
        assert!(start.elapsed().as_secs_f64() < 5.0, "{:?}", start.elapsed());
    }
}

fn seq<'a>(tokens: &'a [u32], start: usize, pages: &'a [u32]) -> Sequence<'a> {
    Sequence {
        tokens,
        start,
        pages,
        local_pages: None,
        logits: true,
        adapter: None,
    }
}

#[test]
fn a_batch_the_step_cannot_run_is_refused_whole() {
    let Some(model) = common::model() else { return };
    let layout = model.kv_layout(16);
    let mut kv = HostKvStore::new(layout.pool_shape(8, 0), BlockTableShape::new(2, 8)).unwrap();
    let tokens: Vec<u32> = (100..120).collect();
    let cases: Vec<(Vec<Sequence>, &str)> = vec![
        (vec![], "no sequences"),
        (vec![seq(&tokens[..0], 0, &[0])], "has no tokens"),
        (vec![seq(&tokens, 0, &[0])], "need 2 pages"),
        (vec![seq(&tokens, 0, &[0, 8])], "outside the 8 GPU pages"),
        (vec![seq(&tokens, 0, &[3, 3])], "appears twice"),
        (
            vec![seq(&tokens, 0, &[0, 1]), seq(&tokens[..1], 16, &[2, 1])],
            "written by sequences",
        ),
        (
            vec![seq(&tokens, 0, &[0, 1]), seq(&tokens[..1], 16, &[1, 2])],
            "is in sequence 1's table",
        ),
        (vec![seq(&[60_000], 0, &[0])], "outside the vocabulary"),
        (
            vec![seq(&tokens, 8190, &[0; 513])],
            "exceed the context length",
        ),
        (
            vec![Sequence {
                local_pages: Some(&[2, 3]),
                ..seq(&tokens, 0, &[0, 1])
            }],
            "the model has no sliding-window layer",
        ),
    ];
    for (sequences, says) in cases {
        let batch = Batch { sequences };
        let error = model.step(&batch, &mut kv, None).unwrap_err();
        assert!(matches!(error, EngineError::Batch(_)), "{error:?}");
        assert!(
            error.to_string().contains(says),
            "{error} (expected {says:?})"
        );
    }
    let wrong = HostKvStore::new(
        kvsched_engine::PoolShape::new(layout.page_bytes(), 8, 0),
        BlockTableShape::new(1, 8),
    );
    let batch = Batch {
        sequences: vec![seq(&tokens, 0, &[0, 1])],
    };
    let error = model.step(&batch, &mut wrong.unwrap(), None).unwrap_err();
    assert!(error.to_string().contains("layers a page"), "{error}");
}

/// An edit of a synthetic file's metadata and tensors.
type Edit = Box<dyn FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, QTensor)>)>;

/// A one-block Gemma 3 file (head width 64, 4 query heads on an embedding of 128), its metadata
/// and tensors edited by `edit` before it is written.
fn tiny_gemma3(
    path: &Path,
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, QTensor)>),
) {
    let (vocab, e, q, hd, ffn) = (8usize, 128usize, 256usize, 64usize, 256usize);
    let t = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| ((i % 13) as f32 - 6.0) / 32.0).collect();
        let dtype = if shape.len() == 1 {
            GgmlDType::F32
        } else {
            GgmlDType::Q8_0
        };
        QTensor::quantize(&Tensor::from_vec(data, shape, &Device::Cpu).unwrap(), dtype).unwrap()
    };
    let mut tensors = vec![
        ("token_embd.weight".to_string(), t(&[vocab, e])),
        ("output_norm.weight".to_string(), t(&[e])),
    ];
    for (name, shape) in [
        ("attn_norm", vec![e]),
        ("attn_q", vec![q, e]),
        ("attn_k", vec![hd, e]),
        ("attn_v", vec![hd, e]),
        ("attn_output", vec![e, q]),
        ("attn_q_norm", vec![hd]),
        ("attn_k_norm", vec![hd]),
        ("post_attention_norm", vec![e]),
        ("ffn_norm", vec![e]),
        ("ffn_gate", vec![ffn, e]),
        ("ffn_up", vec![ffn, e]),
        ("ffn_down", vec![e, ffn]),
        ("post_ffw_norm", vec![e]),
    ] {
        tensors.push((format!("blk.0.{name}.weight"), t(&shape)));
    }
    let mut metadata: Vec<(String, Value)> = [
        ("general.architecture", Value::String("gemma3".into())),
        ("gemma3.block_count", Value::U32(1)),
        ("gemma3.embedding_length", Value::U32(e as u32)),
        ("gemma3.feed_forward_length", Value::U32(ffn as u32)),
        ("gemma3.attention.head_count", Value::U32(4)),
        ("gemma3.attention.head_count_kv", Value::U32(1)),
        ("gemma3.attention.key_length", Value::U32(hd as u32)),
        ("gemma3.attention.value_length", Value::U32(hd as u32)),
        ("gemma3.attention.sliding_window", Value::U32(16)),
        ("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ("gemma3.context_length", Value::U32(64)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    edit(&mut metadata, &mut tensors);
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut file, &metadata, &tensors).unwrap();
}

#[test]
fn gemma3_files_missing_or_beyond_what_the_engine_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-gemma3.gguf");
    let cases: [(&str, Edit, bool); 4] = [
        (
            "metadata key gemma3.attention.sliding_window is missing",
            Box::new(|m, _| m.retain(|(k, _)| k != "gemma3.attention.sliding_window")),
            false,
        ),
        (
            "gemma3.attn_logit_softcapping (Gemma 2's attention soft-capping)",
            Box::new(|m, _| m.push(("gemma3.attn_logit_softcapping".into(), Value::F32(50.0)))),
            true,
        ),
        (
            "tensor blk.0.attn_q_norm.weight is missing",
            Box::new(|_, t| t.retain(|(k, _)| k != "blk.0.attn_q_norm.weight")),
            false,
        ),
        (
            "head dimension 64 (values 32)",
            Box::new(|m, _| {
                m.retain(|(k, _)| k != "gemma3.attention.value_length");
                m.push(("gemma3.attention.value_length".into(), Value::U32(32)));
            }),
            true,
        ),
    ];
    for (says, edit, unsupported) in cases {
        tiny_gemma3(&path, edit);
        let error = Model::load(&path).unwrap_err();
        if unsupported {
            assert!(
                matches!(error, EngineError::Unsupported { .. }),
                "{error:?}"
            );
        } else {
            assert!(matches!(error, EngineError::Corrupt { .. }), "{error:?}");
        }
        let message = assert_one_line_naming(&error, &path);
        assert!(message.contains(says), "{message} (expected {says:?})");
    }
}
