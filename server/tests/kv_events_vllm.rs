//! kvsched's KV events in vLLM's wire format (`kvsched_core::kv_events::vllm`) against vLLM's own
//! structs: the pinned vLLM wheel (fetched once into the model cache beside the test models, checked
//! by sha256; its `kv_events.py` is loaded at test time, no vLLM code is in the repository) and
//! msgspec, in a virtualenv under the build folder (server/tests/python/kv_events_vllm.py). Every
//! kind of event, the integer and header widths that change at their limits, both media, an adapter
//! and none: vLLM's decoder reads each batch as written, and msgspec writes the same bytes for it.

#[path = "support/vllm.rs"]
mod vllm;

use std::path::PathBuf;
use std::process::Command;

use vllm::{python, run, wheel};

use kvsched_core::kv::Tier;
use kvsched_core::kv_events::vllm::{encode_batch, BufferFull, VllmEvent};

fn encode(events: &[VllmEvent<'_>], ts: f64, rank: u32) -> Vec<u8> {
    let mut buf = vec![0; 1 << 16];
    let n = encode_batch(&mut buf, ts, events, rank).expect("room");
    buf.truncate(n);
    buf
}

#[test]
fn vllm_decodes_every_kind_of_event_as_msgspec_writes_it() {
    let tokens: Vec<u32> = (0..48)
        .map(|t| [0, 127, 128, 255, 256, 65_535, 65_536, 262_143][t % 8])
        .collect();
    let many: Vec<u64> = (0..20).map(|k| 1u64 << (3 * k)).collect();
    let name = "an-adapter-whose-served-name-is-long-enough";
    let batches = [
        encode(
            &[
                VllmEvent::Stored {
                    block_hashes: &[u64::MAX, 1, 300],
                    parent: None,
                    token_ids: &tokens,
                    block_size: 16,
                    lora_id: None,
                    tier: Tier::Gpu,
                    lora_name: None,
                },
                VllmEvent::Removed {
                    block_hashes: &[5],
                    tier: Tier::Host,
                },
                VllmEvent::Cleared,
            ],
            1.5,
            0,
        ),
        encode(
            &[VllmEvent::Stored {
                block_hashes: &many,
                parent: Some((1 << 63) + 5),
                token_ids: &tokens[..16],
                block_size: 16,
                lora_id: Some(70_000),
                tier: Tier::Host,
                lora_name: Some(name),
            }],
            1_733_000_000.125,
            3,
        ),
        encode(&[], 0.0, 70_000),
    ];
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let input = dir.join("kv_events_vllm.hex");
    let hex: Vec<String> = batches
        .iter()
        .map(|b| {
            b.iter().fold(String::new(), |mut s, x| {
                use std::fmt::Write;
                let _ = write!(s, "{x:02x}");
                s
            })
        })
        .collect();
    std::fs::write(&input, hex.join("\n") + "\n").unwrap();
    let py = python();
    let wheel = wheel(&py);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/kv_events_vllm.py");
    let out = run(
        Command::new(&py).arg(script).arg(wheel).arg(&input),
        "the vLLM check",
    );
    let lines: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(out.contains("3 batches alike"), "{out}");
    let first = &lines[0]["events"];
    assert_eq!(first[0]["type"], "BlockStored");
    assert_eq!(first[0]["block_hashes"][0], u64::MAX);
    assert_eq!(first[0]["parent_block_hash"], serde_json::Value::Null);
    assert_eq!(first[0]["token_ids"].as_array().map(Vec::len), Some(48));
    assert_eq!(first[0]["medium"], "GPU");
    assert_eq!(
        (&first[1]["type"], &first[1]["medium"]),
        (&"BlockRemoved".into(), &"CPU".into())
    );
    assert_eq!(first[2]["type"], "AllBlocksCleared");
    let second = &lines[1];
    assert_eq!(
        (second["ts"].as_f64(), second["rank"].as_u64()),
        (Some(1_733_000_000.125), Some(3))
    );
    let stored = &second["events"][0];
    assert_eq!(stored["parent_block_hash"], (1u64 << 63) + 5);
    assert_eq!(stored["block_hashes"].as_array().map(Vec::len), Some(20));
    assert_eq!(
        (&stored["lora_id"], &stored["lora_name"]),
        (&70_000.into(), &name.into())
    );
    assert_eq!(lines[2]["events"].as_array().map(Vec::len), Some(0));
}

#[test]
fn a_buffer_too_small_is_refused_with_the_size_it_needs() {
    let e = [VllmEvent::Removed {
        block_hashes: &[1, 2, 3],
        tier: Tier::Gpu,
    }];
    let whole = encode(&e, 2.0, 0).len();
    let mut buf = vec![0; whole];
    assert_eq!(encode_batch(&mut buf, 2.0, &e, 0), Ok(whole));
    for n in 0..whole {
        assert_eq!(
            encode_batch(&mut buf[..n], 2.0, &e, 0),
            Err(BufferFull { needed: whole }),
            "{n} bytes: the refusal says how many the batch takes"
        );
    }
}
