//! The plain-old-data output form (upstream's SerializableSchedulerOutput, spec §5 AD01): a real pass's
//! output survives encode → bytes → decode on another "rank", list by list.

use kvsched::memory::KvMemory;
use kvsched_core::adapter::AdapterPool;
use kvsched_core::config::{ChunkPolicy, Chunking};
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::KvPoolConfig;
use kvsched_core::request::{RequestSpec, TaskId};
use kvsched_core::{wire, Config, Phase, Scheduler};

#[test]
fn a_real_pass_round_trips_through_bytes() {
    let mut mem = KvMemory::new(KvPoolConfig {
        tokens_per_block: 16,
        gpu_pages: 64,
        host_pages: 0,
        slots: 32,
        max_blocks: 16,
    });
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
    let mut s: Box<Scheduler<_, _, 32, 8>> =
        Box::new(Scheduler::new(cfg, mem.pool().unwrap(), pool).unwrap());
    for i in 0..12u64 {
        s.submit(RequestSpec::new(i, Phase::ContextInit, 40 + 10 * i as u32).with_lora(i % 3))
            .unwrap();
    }
    let mut out: Box<SchedulerOutput<32>> = Box::default();
    // Two passes so that generation, chunked context and (under pressure) paused lists are populated.
    s.schedule(&mut out).unwrap();
    s.ensure_batch(&mut out).unwrap();
    s.complete_step(&out);
    s.schedule(&mut out).unwrap();
    assert!(!out.context.is_empty() && !out.generation.is_empty() && out.has_chunking);
    let mut buf = vec![0u8; wire::encoded_len(&out)];
    let n = wire::encode(&out, &mut buf).unwrap();
    let mut back: Box<SchedulerOutput<32>> = Box::default();
    wire::decode(&buf[..n], &mut back).unwrap();
    assert_eq!(back.context, out.context);
    assert_eq!(back.generation, out.generation);
    assert_eq!(back.paused, out.paused);
    assert_eq!(back.recompute_paused, out.recompute_paused);
    assert_eq!(back.encoder, out.encoder);
    assert_eq!(back.disagg, out.disagg);
    assert_eq!(back.resumed, out.resumed);
    assert_eq!(back.adapters, out.adapters);
    assert_eq!(back.has_chunking, out.has_chunking);
    assert_eq!(back.num_fitting(), out.num_fitting());
}
