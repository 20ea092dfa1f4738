//! The plain-old-data output form (upstream's SerializableSchedulerOutput, spec §5 AD01): a real pass's
//! output survives encode → bytes → decode on another "rank", list by list.

use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::{ChunkPolicy, Chunking};
use kvsched_core::ids::TaskId;
use kvsched_core::output::{Listed, SchedulerOutput};
use kvsched_core::page_pool::{KvPool, KvPoolConfig};
use kvsched_core::request::RequestSpec;
use kvsched_core::wire::{WireEntry, WireError, WireOutput};
use kvsched_core::{wire, Config, Phase, Scheduler};

#[test]
fn a_real_pass_round_trips_through_bytes() {
    let kv = KvPool::owned(KvPoolConfig {
        tokens_per_block: 16,
        gpu_pages: 64,
        host_pages: 0,
        slots: 32,
        max_blocks: 16,
    })
    .unwrap();
    let mut pool: AdapterPool<8> = AdapterPool::new(16, 16).unwrap();
    for t in 0..3 {
        pool.register(TaskId(t), 2).unwrap();
    }
    let cfg = Config {
        chunking: Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: 16,
        }),
        max_num_tokens: Some(300),
        ..Config::default()
    };
    let mut s: Box<Scheduler<_, _, 32, 8>> = Box::new(Scheduler::new(cfg, kv, pool).unwrap());
    for i in 0..12u64 {
        s.submit(RequestSpec::new(i, Phase::ContextInit, 40 + 10 * i as u32).with_lora(i % 3))
            .unwrap();
    }
    let mut out: Box<SchedulerOutput<32>> = Box::default();
    // Two passes so that generation, chunked context and (under pressure) paused lists are populated.
    s.schedule(&mut out).unwrap();
    s.ensure_batch(&mut out).unwrap();
    let _ = s.take_moves();
    s.complete_step(&out).unwrap();
    s.schedule(&mut out).unwrap();
    assert!(!out.context().is_empty() && !out.generation().is_empty() && out.has_chunking());
    let id_of = |l: Listed| s.get(l.handle()).ok().map(|e| e.spec().id);
    let mut buf = vec![0u8; wire::encoded_len(&out)];
    let n = wire::encode(&out, id_of, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    let mut back: Box<WireOutput<32>> = Box::default();
    wire::decode(&buf[..n], &mut back).unwrap();
    // Every list, entry by entry: id, slot, version, task, and the context chunks' tokens.
    let entry = |l: Listed, tokens: u32, last: bool| WireEntry {
        id: id_of(l).unwrap(),
        slot: l.slot(),
        version: l.handle().version(),
        task: l.task_slot(),
        tokens,
        last,
    };
    let context: Vec<WireEntry> = out
        .context()
        .iter()
        .map(|c| entry(c.listed, c.tokens, c.last))
        .collect();
    assert_eq!(back.context(), &context[..]);
    let others = [
        out.generation(),
        out.encoder(),
        out.paused(),
        out.recompute_paused(),
        out.disagg(),
        out.resumed(),
    ];
    for (k, list) in others.iter().enumerate() {
        let want: Vec<WireEntry> = list.iter().map(|&l| entry(l, 0, false)).collect();
        assert_eq!(&back.lists[k + 1][..], &want[..], "list {}", k + 1);
    }
    assert_eq!(&back.adapters[..], out.adapters());
    assert_eq!(back.has_chunking, out.has_chunking());

    // Bad input: a short buffer (both ways), a foreign header, a list longer than the receiver holds, and
    // an entry whose request is gone.
    assert!(matches!(
        wire::decode(&buf[..n - 1], &mut back),
        Err(WireError::Short { .. })
    ));
    assert!(matches!(
        wire::encode(&out, id_of, &mut buf[..10]),
        Err(WireError::Short { .. })
    ));
    buf[0] ^= 1;
    assert_eq!(
        wire::decode(&buf[..n], &mut back),
        Err(WireError::BadHeader)
    );
    buf[0] ^= 1;
    let mut small: Box<WireOutput<1>> = Box::default();
    assert_eq!(wire::decode(&buf[..n], &mut small), Err(WireError::TooLong));
    let gone = out.generation()[0].handle();
    s.remove(gone).unwrap();
    let before = buf.clone();
    let id_of = |l: Listed| s.get(l.handle()).ok().map(|e| e.spec().id);
    assert_eq!(wire::encode(&out, id_of, &mut buf), Err(WireError::Stale));
    assert_eq!(buf, before, "a refused encoding writes nothing");
}
