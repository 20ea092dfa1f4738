//! The engine's KV events (`Engine::take_kv_events`, `EngineConfig::kv_events`) on the real model:
//! a prompt's committed blocks are stored on the GPU with their tokens, chained keys and parents (none
//! for the first); the same prompt again stores nothing (its blocks are hits); a prompt that needs the
//! pages evicts the cached blocks deepest first (removed), or, with a host tier, demotes them
//! (removed from the GPU, stored on the host with the same tokens and parent), and a hit on the
//! host tier reloads them.

mod common;

use kvsched_core::kv::{chain, Tier};
use kvsched_core::kv_events::KvEventKind;
use kvsched_engine::{block_hashes, Engine, EngineConfig, EngineError, KvBlockEvent, Sampler};

const TPB: u32 = 16;

fn config(gpu_pages: u32, host_pages: u32) -> EngineConfig {
    EngineConfig {
        tokens_per_block: TPB,
        gpu_pages,
        host_pages,
        max_blocks: 64,
        prefix_cache: true,
        kv_events: true,
        ..EngineConfig::default()
    }
}

fn prompt(len: u32, seed: u32) -> Vec<u32> {
    (0..len)
        .map(|i| 100 + (i * 7 + seed * 131) % 5000)
        .collect()
}

fn serve(e: &mut Engine<'_>, p: &[u32]) -> Vec<KvBlockEvent> {
    e.submit(p, 2, None, Sampler::greedy()).unwrap();
    e.run().unwrap();
    e.take_kv_events()
}

fn kinds(events: &[KvBlockEvent]) -> Vec<(KvEventKind, Tier)> {
    events.iter().map(|e| (e.kind, e.tier)).collect()
}

/// `stored` are the GPU stores of `p`'s full blocks, in order: chained keys, parents, tokens.
fn assert_prompt_stored(p: &[u32], stored: &[&KvBlockEvent]) {
    let h = block_hashes(p, TPB as usize);
    assert_eq!(stored.len(), h.len(), "every full block of the prompt");
    for (k, e) in stored.iter().enumerate() {
        assert_eq!(
            (e.kind, e.tier, e.adapter),
            (KvEventKind::Stored, Tier::Gpu, None)
        );
        let at = k * TPB as usize;
        assert_eq!(e.tokens, p[at..at + TPB as usize], "block {k}'s tokens");
        if k == 0 {
            assert_eq!(e.parent, None, "a first block has no parent");
        } else {
            assert_eq!(e.parent, Some(stored[k - 1].hash));
            assert_eq!(e.hash, chain(stored[k - 1].hash, h[k]), "block {k}'s key");
        }
    }
}

#[test]
fn blocks_are_stored_with_their_tokens_and_evicted_deepest_first() {
    let Some(m) = common::model() else { return };
    let mut e = Engine::new(m, config(12, 0)).unwrap();
    let a = prompt(70, 1);
    let first = serve(&mut e, &a);
    assert_prompt_stored(&a, &first.iter().collect::<Vec<_>>());
    assert!(
        serve(&mut e, &a).is_empty(),
        "a repeated prompt's blocks are hits"
    );
    // 10 pages for a 150-token prompt: two of the four cached blocks go, the deepest first.
    let c = prompt(150, 2);
    let events = serve(&mut e, &c);
    let removed: Vec<u64> = events
        .iter()
        .filter(|e| e.kind == KvEventKind::Removed)
        .map(|e| e.hash)
        .collect();
    assert_eq!(removed, vec![first[3].hash, first[2].hash]);
    let stored: Vec<&KvBlockEvent> = events
        .iter()
        .filter(|e| e.kind == KvEventKind::Stored)
        .collect();
    assert_prompt_stored(&c, &stored);
}

#[test]
fn a_host_tier_demotes_and_a_hit_reloads_with_the_same_tokens() {
    let Some(m) = common::model() else { return };
    let mut e = Engine::new(m, config(12, 16)).unwrap();
    let a = prompt(70, 1);
    let first = serve(&mut e, &a);
    let c = prompt(150, 2);
    let events = serve(&mut e, &c);
    let moved: Vec<&KvBlockEvent> = events.iter().filter(|e| e.tier == Tier::Host).collect();
    assert_eq!(
        kinds(&events[..4]),
        [
            (KvEventKind::Removed, Tier::Gpu),
            (KvEventKind::Stored, Tier::Host),
            (KvEventKind::Removed, Tier::Gpu),
            (KvEventKind::Stored, Tier::Host),
        ]
    );
    // Block 3 then block 2, each with its tokens and parent kept.
    for (e, k) in moved.iter().zip([3, 2]) {
        assert_eq!(
            (e.hash, &e.tokens, e.parent),
            (first[k].hash, &first[k].tokens, first[k].parent)
        );
    }
    let events = serve(&mut e, &a);
    for k in [2, 3] {
        let reload = events
            .iter()
            .position(|e| {
                e.kind == KvEventKind::Stored && e.tier == Tier::Gpu && e.hash == first[k].hash
            })
            .expect("reloaded");
        assert_eq!(events[reload].tokens, first[k].tokens);
        assert_eq!(
            (events[reload - 1].kind, events[reload - 1].tier),
            (KvEventKind::Removed, Tier::Host)
        );
    }
}

#[test]
fn kv_events_need_the_prefix_cache() {
    let Some(m) = common::model() else { return };
    let cfg = EngineConfig {
        prefix_cache: false,
        ..config(12, 0)
    };
    match Engine::new(m, cfg) {
        Err(EngineError::Config(why)) => assert!(why.contains("prefix cache"), "{why}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}
