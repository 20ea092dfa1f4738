//! The bad-input matrix (DESIGN.md §5): every public entry point fed invalid input returns a typed error
//! and leaves the state byte-for-byte unchanged — the scheduler (`Scheduler::fingerprint`: request table
//! with slot versions and free list, arrival order, counters, adapter desk), its KV pool
//! (`KvPool::fingerprint`: free stacks, page tables, slots, move log, counters) and its adapter cache
//! (`AdapterPool: PartialEq`), all compared before and after each refused call. The cases are listed in
//! docs/RELIABILITY.md.

use kvsched_core::adapter::{PeftBackend, TaskRef};
use kvsched_core::adapter_pool::AdapterPool;
use kvsched_core::config::{ChunkPolicy, Chunking, Config, Window};
use kvsched_core::error::{Error, PeftError};
use kvsched_core::ids::{RequestId, TaskId, TaskSlot};
use kvsched_core::kv::{KvBackend, PageMove};
use kvsched_core::kv_set::KvSet;
use kvsched_core::output::SchedulerOutput;
use kvsched_core::page_pool::{KvPool, KvPoolConfig, KvStorage, Seq};
use kvsched_core::request::{Ownership, RequestSpec};
use kvsched_core::scheduler::{Adopt, Handle, Scheduler};
use kvsched_core::storage::Owned;
use kvsched_core::Phase;

const N: usize = 8;
const T: usize = 4;
type Sched<'a> = Scheduler<KvPool<'a, Owned>, AdapterPool<T>, N, T>;
type Out = SchedulerOutput<N>;

/// A pool of `cfg` that owns its buffers.
fn owned(cfg: KvPoolConfig) -> KvPool<'static, Owned> {
    KvPool::owned(cfg).unwrap()
}

const POOL: KvPoolConfig = KvPoolConfig {
    tokens_per_block: 4,
    gpu_pages: 8,
    host_pages: 8,
    slots: N as u32,
    max_blocks: 8,
};

/// Everything a refused call must leave alone.
#[derive(Debug, PartialEq)]
struct Snapshot {
    sched: u64,
    kv: u64,
    adapters: AdapterPool<T>,
    requests: Vec<(u64, Ownership, RequestSpec, bool)>,
}

fn snap(s: &Sched<'_>) -> Snapshot {
    Snapshot {
        sched: s.fingerprint(),
        kv: s.kv().fingerprint(),
        adapters: s.adapters().backend().clone(),
        requests: s
            .requests()
            .map(|(_, e)| (e.spec().id.0, e.ownership(), e.spec().clone(), e.inflight()))
            .collect(),
    }
}

/// A scheduler holding requests in every kind of state: two active LoRA requests (leases held), one
/// suspended to the host tier (paused on nothing: no LoRA), and one waiting.
fn busy() -> (Sched<'static>, Vec<Handle>) {
    let mut adapters = AdapterPool::<T>::new(4, 4).unwrap();
    adapters.register(TaskId(1), 1).unwrap();
    adapters.register(TaskId(2), 1).unwrap();
    let cfg = Config {
        max_num_tokens: Some(64),
        ..Config::default()
    };
    let mut s: Sched<'_> = Scheduler::new(cfg, owned(POOL), adapters).unwrap();
    let a = s
        .submit(RequestSpec::new(1, Phase::ContextInit, 12).with_lora(1))
        .unwrap();
    let b = s
        .submit(RequestSpec::new(2, Phase::ContextInit, 12).with_lora(2))
        .unwrap();
    let c = s
        .submit(RequestSpec::new(3, Phase::ContextInit, 8))
        .unwrap();
    let mut out = Out::new();
    s.schedule(&mut out).unwrap();
    s.ensure_batch(&mut out).unwrap();
    let _ = s.take_moves();
    s.complete_step(&out).unwrap();
    // A and B grow by one page each; the 8 GPU pages are full, so C is suspended to the host.
    s.schedule(&mut out).unwrap();
    s.ensure_batch(&mut out).unwrap();
    let _ = s.take_moves();
    s.complete_step(&out).unwrap();
    let d = s
        .submit(RequestSpec::new(4, Phase::ContextInit, 4))
        .unwrap();
    let kinds: Vec<Ownership> = s.requests().map(|(_, e)| e.ownership()).collect();
    assert_eq!(
        kinds,
        [
            Ownership::Active,
            Ownership::Active,
            Ownership::Paused,
            Ownership::Waiting
        ],
        "the fixture holds every kind of state"
    );
    assert_eq!(
        s.adapters().leases(TaskSlot(0)) + s.adapters().leases(TaskSlot(1)),
        2
    );
    (s, vec![a, b, c, d])
}

/// Runs `call` on `s`, which must fail with an error `want` accepts, and leave everything unchanged.
fn refused<R: std::fmt::Debug, E: std::fmt::Debug>(
    s: &mut Sched<'_>,
    case: &str,
    want: impl Fn(&E) -> bool,
    call: impl FnOnce(&mut Sched<'_>) -> Result<R, E>,
) {
    let before = snap(s);
    match call(s) {
        Err(e) if want(&e) => {}
        other => panic!("{case}: expected a typed refusal, got {other:?}"),
    }
    assert_eq!(snap(s), before, "{case}: a refused call changed the state");
}

fn spec(id: u64, prompt: u32) -> RequestSpec {
    RequestSpec::new(id, Phase::ContextInit, prompt)
}

#[test]
fn submit_refuses_bad_requests_and_changes_nothing() {
    let (mut s, _) = busy();
    let limit = 32; // min(8 blocks, 8 GPU pages) x 4 tokens
    let too_large = |e: &Error| matches!(e, Error::RequestTooLarge { limit: 32, .. });
    refused(&mut s, "prompt larger than the pool", too_large, |s| {
        s.submit(spec(10, limit + 1))
    });
    refused(&mut s, "output larger than the pool", too_large, |s| {
        let mut r = spec(10, 4);
        r.max_new_tokens = limit;
        s.submit(r)
    });
    refused(&mut s, "drafts push it over", too_large, |s| {
        let mut r = spec(10, limit);
        r.draft = 1;
        s.submit(r)
    });
    refused(
        &mut s,
        "u32::MAX everywhere (no overflow)",
        too_large,
        |s| {
            let mut r = spec(10, u32::MAX);
            r.max_new_tokens = u32::MAX;
            r.draft = u32::MAX - 1;
            s.submit(r)
        },
    );
    for (id, what) in [(1, "an active"), (3, "a suspended"), (4, "a waiting")] {
        refused(
            &mut s,
            &format!("duplicate id of {what} request"),
            |e| *e == Error::DuplicateId(RequestId(id)),
            |s| s.submit(spec(id, 4)),
        );
    }
    refused(
        &mut s,
        "unregistered LoRA task",
        |e| *e == Error::Peft(PeftError::UnknownTask(TaskId(99))),
        |s| s.submit(spec(10, 4).with_lora(99)),
    );
    refused(
        &mut s,
        "position beyond the prompt",
        |e| matches!(e, Error::Invalid(_)),
        |s| {
            let mut r = spec(10, 4);
            r.position = 5;
            s.submit(r)
        },
    );
    refused(
        &mut s,
        "beam width 0",
        |e| matches!(e, Error::Invalid(_)),
        |s| {
            let mut r = spec(10, 4);
            r.beam = 0;
            s.submit(r)
        },
    );
    refused(
        &mut s,
        "beam width that overflows the step's tokens",
        |e| matches!(e, Error::Invalid(_)),
        |s| {
            let mut r = spec(10, 4);
            r.beam = u32::MAX;
            r.draft = 1;
            s.submit(r)
        },
    );
    // Fill the table, then one more.
    for id in 20..24 {
        s.submit(spec(id, 1)).unwrap();
    }
    refused(
        &mut s,
        "table full",
        |e| {
            matches!(
                e,
                Error::CapacityExhausted {
                    what: "request table",
                    capacity: 8
                }
            )
        },
        |s| s.submit(spec(30, 1)),
    );
    // The refusals left a working scheduler.
    let mut out = Out::new();
    s.schedule(&mut out).unwrap();
    s.ensure_batch(&mut out).unwrap();
    assert!(s.kv().check());
}

#[test]
fn stale_and_foreign_handles_are_refused() {
    let (mut s, hs) = busy();
    let removed = hs[3];
    s.remove(removed).unwrap();
    // A handle minted by a larger scheduler: its slot index does not exist here.
    let mut big: Scheduler<KvPool<'_, Owned>, AdapterPool<T>, 64, T> = Scheduler::new(
        Config::default(),
        owned(KvPoolConfig { slots: 64, ..POOL }),
        AdapterPool::new(1, 1).unwrap(),
    )
    .unwrap();
    let mut foreign = None;
    for id in 0..40 {
        foreign = Some(big.submit(spec(100 + id, 1)).unwrap());
    }
    let foreign = foreign.unwrap();
    assert!(foreign.index() as usize >= N);
    for (what, h) in [("removed", removed), ("foreign", foreign)] {
        let stale = |e: &Error| *e == Error::StaleHandle;
        refused(&mut s, &format!("get, {what} handle"), stale, |s| {
            s.get(h).map(|_| ())
        });
        refused(&mut s, &format!("remove, {what} handle"), stale, |s| {
            s.remove(h)
        });
        refused(&mut s, &format!("update, {what} handle"), stale, |s| {
            s.update(h, |r| r.beam = 2)
        });
        refused(
            &mut s,
            &format!("set_inflight, {what} handle"),
            stale,
            |s| s.set_inflight(h, true),
        );
    }
    // The slot of the removed request is reused: the old handle still does not resolve to the new one.
    let newer = s.submit(spec(50, 4)).unwrap();
    assert_eq!(newer.index(), removed.index());
    refused(
        &mut s,
        "removed handle after slot reuse",
        |e: &Error| *e == Error::StaleHandle,
        |s| s.get(removed).map(|_| ()),
    );
}

#[test]
fn multimodal_encoder_and_draft_inputs_are_refused_and_change_nothing() {
    let (mut s, hs) = busy();
    let invalid = |e: &Error| matches!(e, Error::Invalid(_));
    let with_runs = |runs: &[(u32, u32)]| {
        let mut r = spec(10, 12);
        r.mm_runs.extend_from_slice(runs).unwrap();
        r
    };
    for (case, runs) in [
        ("overlapping runs", &[(0, 4), (2, 6)][..]),
        ("descending runs", &[(4, 6), (0, 2)]),
        ("an empty run", &[(2, 2)]),
        ("a run past the prompt", &[(8, 13)]),
    ] {
        refused(&mut s, &format!("submit, {case}"), invalid, |s| {
            s.submit(with_runs(runs))
        });
        refused(&mut s, &format!("update, {case}"), invalid, |s| {
            s.update(hs[3], |r| {
                r.prompt = 12;
                r.mm_runs = with_runs(runs).mm_runs;
            })
        });
    }
    // Speculative decoding: rejected drafts of a request that is gone.
    let removed = hs[3];
    s.remove(removed).unwrap();
    refused(
        &mut s,
        "rewind, removed handle",
        |e: &Error| *e == Error::StaleHandle,
        |s| s.rewind(removed, 1),
    );
    // An encoder request in the encoder window and no cross pool to hold its output: the pass refuses
    // before doing anything (spec §1.6 step 7).
    let cfg = Config {
        window: Window::Encoder,
        ..Config::default()
    };
    let mut s: Sched<'_> =
        Scheduler::new(cfg, owned(POOL), AdapterPool::new(1, 1).unwrap()).unwrap();
    let mut enc = RequestSpec::new(20, Phase::EncoderInit, 4);
    enc.encoder_len = 4;
    let h = s.submit(enc).unwrap();
    s.submit(spec(21, 4)).unwrap();
    let mut out = Out::new();
    refused(
        &mut s,
        "encoder without a cross pool",
        |e: &Error| *e == Error::CrossPoolRequired,
        |s| s.schedule(&mut out),
    );
    s.remove(h).unwrap();
    s.schedule(&mut out).unwrap();
    assert_eq!(
        out.context().len(),
        1,
        "the decoder context runs once the encoder is gone"
    );

    // With chunking, a run no chunk can hold (longer than max_context_length) is refused at submission
    // (difference 11: upstream raises mid-pass).
    let cfg = Config {
        chunking: Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: 2,
        }),
        max_context_length: Some(4),
        ..Config::default()
    };
    let mut s: Sched<'_> =
        Scheduler::new(cfg, owned(POOL), AdapterPool::new(1, 1).unwrap()).unwrap();
    refused(
        &mut s,
        "a run longer than max_context_length",
        invalid,
        |s| s.submit(with_runs(&[(2, 7)])),
    );
    s.submit(with_runs(&[(2, 6)])).unwrap();

    // An encoder request is never chunked: in the encoder window, one whose encoder output is longer
    // than max_context_length but fits the budget is refused at submission and by update (difference
    // 16: upstream fails the pass that reaches it). Over the budget as well it waits, as upstream.
    let cfg = Config {
        window: Window::Encoder,
        max_num_tokens: Some(64),
        ..cfg
    };
    let mut s: Sched<'_> =
        Scheduler::new(cfg, owned(POOL), AdapterPool::new(1, 1).unwrap()).unwrap();
    let encoder = |id, len| {
        let mut r = RequestSpec::new(id, Phase::EncoderInit, 2);
        r.encoder_len = len;
        r
    };
    refused(
        &mut s,
        "an encoder output longer than max_context_length",
        |e: &Error| matches!(e, Error::Invalid(w) if w.contains("max_context_length")),
        |s| s.submit(encoder(40, 5)),
    );
    let at_limit = s.submit(encoder(41, 4)).unwrap();
    s.submit(encoder(42, 65)).unwrap();
    refused(&mut s, "update past max_context_length", invalid, |s| {
        s.update(at_limit, |r| r.encoder_len = 5)
    });

    // A decoder's encoder output larger than the cross pool (8 pages of 4 tokens).
    let kv: KvSet<KvPool<'_, Owned>> = KvSet::with_pools(owned(POOL), None, Some(owned(POOL)));
    let mut s: Scheduler<_, AdapterPool<T>, N, T> =
        Scheduler::new(Config::default(), kv, AdapterPool::new(1, 1).unwrap()).unwrap();
    let before = (s.fingerprint(), s.kv().cross_pool().unwrap().fingerprint());
    let mut dec = spec(30, 4);
    dec.encoder_len = 33;
    assert!(matches!(
        s.submit(dec.clone()),
        Err(Error::RequestTooLarge {
            tokens: 33,
            limit: 32,
            ..
        })
    ));
    assert_eq!(
        (s.fingerprint(), s.kv().cross_pool().unwrap().fingerprint()),
        before
    );
    dec.skip_cross = true;
    s.submit(dec).unwrap();
}

#[test]
fn update_refuses_inconsistent_changes() {
    let (mut s, hs) = busy();
    let invalid = |e: &Error| matches!(e, Error::Invalid(_));
    for (i, &h) in hs.iter().enumerate() {
        refused(
            &mut s,
            &format!("update position past the prompt ({i})"),
            invalid,
            |s| s.update(h, |r| r.position = r.prompt + 1),
        );
        refused(&mut s, &format!("update beam 0 ({i})"), invalid, |s| {
            s.update(h, |r| r.beam = 0)
        });
        refused(
            &mut s,
            &format!("update beam overflow ({i})"),
            invalid,
            |s| {
                s.update(h, |r| {
                    r.beam = u32::MAX;
                    r.draft = 1;
                })
            },
        );
        refused(
            &mut s,
            &format!("update drafts past the pool ({i})"),
            |e| matches!(e, Error::RequestTooLarge { .. }),
            |s| s.update(h, |r| r.draft = 1000),
        );
        refused(
            &mut s,
            &format!("update prompt past the pool ({i})"),
            |e| matches!(e, Error::RequestTooLarge { .. }),
            |s| s.update(h, |r| r.prompt = u32::MAX),
        );
    }
    // Id and LoRA task cannot change: such an update is applied without them (not an error).
    s.update(hs[0], |r| {
        r.id = RequestId(77);
        r.lora = None;
    })
    .unwrap();
    let e = s.get(hs[0]).unwrap();
    assert_eq!(
        (e.spec().id, e.spec().lora),
        (RequestId(1), Some(TaskId(1)))
    );
}

#[test]
fn adopt_refuses_without_matching_backend_state() {
    let (mut s, _) = busy();
    let invalid = |e: &Error| matches!(e, Error::Invalid(_));
    refused(&mut s, "adopt as active without a cache", invalid, |s| {
        s.adopt(RequestSpec::generation(60, 4), Adopt::Active)
    });
    refused(&mut s, "adopt as suspended without a cache", invalid, |s| {
        s.adopt(RequestSpec::generation(60, 4), Adopt::Suspended)
    });
    refused(
        &mut s,
        "adopt with an unknown task",
        |e| matches!(e, Error::Peft(PeftError::UnknownTask(_))),
        |s| s.adopt(RequestSpec::generation(60, 4).with_lora(9), Adopt::Waiting),
    );
}

/// An adoption refused by the adapter cache after the table slot was taken gives the slot back without
/// bumping its version (the handle never left the call).
#[test]
fn adopt_refused_by_the_adapter_cache_leaves_the_table_as_it_was() {
    let mut adapters = AdapterPool::<T>::new(2, 2).unwrap();
    adapters.register(TaskId(1), 2).unwrap();
    adapters.register(TaskId(2), 2).unwrap();
    // Slot 1 gets a cache before the scheduler takes the pool, as a restoring caller would do.
    let mut pool = owned(KvPoolConfig {
        host_pages: 0,
        ..POOL
    });
    let r = kvsched_core::kv::KvRef {
        slot: 1,
        id: RequestId(2),
    };
    let prep = kvsched_core::kv::ContextPrep::first(4);
    pool.prepare_context(r, prep).unwrap();
    assert!(pool.resize_context(r, 4, true));
    let mut s: Sched<'_> = Scheduler::new(Config::default(), pool, adapters).unwrap();
    // Request 1 holds task 1 (the host cache's 2 pages), so task 2 cannot be loaded.
    s.submit(RequestSpec::new(1, Phase::ContextInit, 4).with_lora(1))
        .unwrap();
    let mut out = Out::new();
    s.schedule(&mut out).unwrap();
    assert_eq!(out.context().len(), 1);
    let table = s.fingerprint();
    let kv = s.kv().fingerprint();
    let adapters = s.adapters().backend().clone();
    let err = s
        .adopt(RequestSpec::generation(2, 4).with_lora(2), Adopt::Active)
        .unwrap_err();
    assert_eq!(err, Error::Peft(PeftError::HostCacheFull(TaskId(2))));
    assert_eq!(
        s.fingerprint(),
        table,
        "table slot version and free list unchanged"
    );
    assert_eq!(s.kv().fingerprint(), kv);
    assert_eq!(*s.adapters().backend(), adapters);
}

/// An output cannot be forged (its lists are private: `tests/ui`), so the refusals left are of
/// outputs the scheduler did not make for its last pass, and of entries whose request went away.
#[test]
fn complete_step_refuses_stale_outputs_and_skips_removed_requests() {
    let (mut s, _) = busy();
    refused(
        &mut s,
        "complete_step with an output no pass filled",
        |e| *e == Error::StaleOutput,
        |s| s.complete_step(&Out::new()),
    );
    let mut out = Out::new();
    s.schedule(&mut out).unwrap();
    s.ensure_batch(&mut out).unwrap();
    let _ = s.take_moves();
    let mut old = Out::new();
    s.schedule(&mut old).unwrap();
    refused(
        &mut s,
        "complete_step with an earlier pass's output",
        |e| *e == Error::StaleOutput,
        |s| s.complete_step(&out),
    );
    s.complete_step(&old).unwrap();
    refused(
        &mut s,
        "complete_step twice",
        |e| *e == Error::StaleOutput,
        |s| s.complete_step(&old),
    );
    // A listed request goes away and its slot is reused before the step completes: the newer request
    // is not touched.
    let mut s: Sched<'_> = Scheduler::new(
        Config::default(),
        owned(POOL),
        AdapterPool::new(4, 4).unwrap(),
    )
    .unwrap();
    let gone = s.submit(spec(50, 8)).unwrap();
    s.schedule(&mut out).unwrap();
    assert_eq!(out.context()[0].listed.handle(), gone);
    s.remove(gone).unwrap();
    let newer = s.submit(spec(51, 8)).unwrap();
    assert_eq!(newer.index(), gone.index());
    s.complete_step(&out).unwrap();
    let e = s.get(newer).unwrap();
    assert_eq!((e.spec().position, e.spec().phase), (0, Phase::ContextInit));
}

fn storage_case(cfg: KvPoolConfig, lens: [usize; 5], case: &str) {
    let [g, h, t, s, m] = lens;
    let mut gpu = vec![7u32; g];
    let mut host = vec![7u32; h];
    let mut tables = vec![7u32; t];
    let mut seqs = vec![
        Seq {
            capacity: 7,
            ..Seq::default()
        };
        s
    ];
    let mut moves = vec![
        PageMove {
            src: 7,
            ..PageMove::default()
        };
        m
    ];
    let err = KvPool::new(
        cfg,
        KvStorage {
            gpu_free: &mut gpu,
            host_free: &mut host,
            tables: &mut tables,
            seqs: &mut seqs,
            moves: &mut moves,
            prefix: None,
        },
    )
    .map(|_| ())
    .unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{case}: {err:?}");
    assert!(
        gpu.iter().chain(&host).chain(&tables).all(|&x| x == 7),
        "{case}: buffers written"
    );
    assert!(
        seqs.iter().all(|x| x.capacity == 7) && moves.iter().all(|x| x.src == 7),
        "{case}"
    );
}

fn lens(c: &KvPoolConfig) -> [usize; 5] {
    [
        c.gpu_pages as usize,
        c.host_pages as usize,
        c.table_len(),
        c.slots as usize,
        c.move_log_len(),
    ]
}

#[test]
fn kv_pool_refuses_zero_absurd_and_mismatched_geometry() {
    let small = KvPoolConfig {
        tokens_per_block: 4,
        gpu_pages: 4,
        host_pages: 2,
        slots: 2,
        max_blocks: 2,
    };
    for (case, cfg) in [
        (
            "zero tokens per block",
            KvPoolConfig {
                tokens_per_block: 0,
                ..small
            },
        ),
        (
            "zero GPU pages",
            KvPoolConfig {
                gpu_pages: 0,
                ..small
            },
        ),
        ("zero slots", KvPoolConfig { slots: 0, ..small }),
        (
            "zero max blocks",
            KvPoolConfig {
                max_blocks: 0,
                ..small
            },
        ),
        (
            "a request could hold more than u32::MAX tokens",
            KvPoolConfig {
                tokens_per_block: u32::MAX,
                ..small
            },
        ),
    ] {
        storage_case(cfg, lens(&cfg), case);
        assert!(cfg.validate().is_err(), "{case}: validate");
    }
    let huge = KvPoolConfig {
        slots: 65537,
        max_blocks: 1,
        ..small
    };
    assert!(
        matches!(huge.validate(), Err(Error::Invalid(_))),
        "more slots than a u16 names"
    );
    let huge = KvPoolConfig {
        gpu_pages: u32::MAX,
        host_pages: u32::MAX,
        ..small
    };
    assert_eq!(
        huge.move_log_len(),
        2 * u32::MAX as usize,
        "buffer lengths do not overflow"
    );
    let l = lens(&small);
    for (i, what) in [
        "GPU free stack",
        "host free stack",
        "tables",
        "slots",
        "move log",
    ]
    .iter()
    .enumerate()
    {
        for delta in [-1i64, 1] {
            let mut bad = l;
            bad[i] = (bad[i] as i64 + delta) as usize;
            storage_case(small, bad, &format!("{what} {delta:+}"));
        }
    }
    // An owned pool validates before it allocates.
    assert!(KvPool::owned(KvPoolConfig {
        gpu_pages: u32::MAX,
        slots: u32::MAX,
        ..small
    })
    .is_err());
    assert!(KvPool::owned(small).is_ok());
}

#[test]
fn adapter_cache_refuses_bad_sizes_and_registrations() {
    for (d, h) in [(0, 4), (4, 0), (0, 0)] {
        assert!(
            matches!(AdapterPool::<T>::new(d, h), Err(Error::Invalid(_))),
            "{d} x {h} pages"
        );
    }
    let mut p = AdapterPool::<2>::new(4, 3).unwrap();
    p.register(TaskId(1), 3).unwrap();
    let cases: [(&str, u64, u32, PeftError); 5] = [
        (
            "zero pages",
            5,
            0,
            PeftError::AdapterTooLarge {
                task: TaskId(5),
                pages: 0,
                capacity: 3,
            },
        ),
        (
            "larger than the host cache",
            5,
            4,
            PeftError::AdapterTooLarge {
                task: TaskId(5),
                pages: 4,
                capacity: 3,
            },
        ),
        (
            "absurd",
            5,
            u32::MAX,
            PeftError::AdapterTooLarge {
                task: TaskId(5),
                pages: u32::MAX,
                capacity: 3,
            },
        ),
        ("duplicate task", 1, 1, PeftError::DuplicateTask(TaskId(1))),
        (
            "duplicate task, other size",
            1,
            2,
            PeftError::DuplicateTask(TaskId(1)),
        ),
    ];
    for (case, id, pages, want) in cases {
        let before = p.clone();
        assert_eq!(p.register(TaskId(id), pages), Err(want), "{case}");
        assert_eq!(p, before, "{case}: state changed");
    }
    p.register(TaskId(2), 1).unwrap();
    let before = p.clone();
    assert_eq!(p.register(TaskId(3), 1), Err(PeftError::TaskTableFull));
    assert_eq!(p, before, "table full: state changed");
    // Unknown task slots on the backend calls.
    let mut q = p.clone();
    let ghost = TaskRef {
        id: TaskId(9),
        slot: TaskSlot(7),
    };
    assert_eq!(
        q.add_request(RequestId(1), ghost, false),
        Err(PeftError::UnknownTask(TaskId(9)))
    );
    assert!(!q.can_admit(ghost));
    assert_eq!(q, p);
}

#[test]
fn config_validate_refuses_zero_settings() {
    let chunk0 = Config {
        chunking: Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: 0,
        }),
        ..Config::default()
    };
    let stall0 = Config {
        deadlock_threshold: 0,
        ..Config::default()
    };
    let vtc0 = Config {
        admission: kvsched_core::config::Admission::Vtc {
            input_weight: 0,
            output_weight: 0,
        },
        ..Config::default()
    };
    // Without chunking a chunk is a whole prompt: a context limit below the budget (or beside an
    // unlimited one) could only leave prompts between the two unschedulable (difference 16).
    let short_context = Config {
        max_num_tokens: Some(1024),
        max_context_length: Some(512),
        ..Config::default()
    };
    let unlimited_budget = Config {
        max_num_tokens: None,
        max_context_length: Some(512),
        ..Config::default()
    };
    for (case, cfg) in [
        ("chunk unit 0", chunk0),
        ("deadlock threshold 0", stall0),
        ("VTC weights both 0", vtc0),
        (
            "max_context_length below the budget, unchunked",
            short_context,
        ),
        (
            "max_context_length, unlimited budget, unchunked",
            unlimited_budget,
        ),
    ] {
        assert!(matches!(cfg.validate(), Err(Error::Invalid(_))), "{case}");
        let s: Result<Sched<'_>, _> =
            Scheduler::new(cfg, owned(POOL), AdapterPool::new(1, 1).unwrap());
        assert!(
            matches!(s.map(|_| ()), Err(Error::Invalid(_))),
            "{case}: Scheduler::new"
        );
    }
    // Zero budgets are valid (upstream accepts them; the conformance suite runs them): nothing is
    // scheduled, and deadlock detection reports the stall.
    let zero = Config {
        max_num_requests: 0,
        max_num_tokens: Some(0),
        ..Config::default()
    };
    assert!(zero.validate().is_ok());
    // A context limit below the budget is a chunk size limit with chunking, and no limit at all at
    // or above it.
    let chunked = Config {
        chunking: Some(Chunking {
            policy: ChunkPolicy::FirstComeFirstServed,
            unit: 4,
        }),
        ..short_context
    };
    assert!(chunked.validate().is_ok());
    let equal = Config {
        max_context_length: Some(1024),
        ..short_context
    };
    assert!(equal.validate().is_ok());
    let e = short_context.validate().unwrap_err().to_string();
    assert!(e.contains("max_context_length"), "{e}");
}

#[test]
fn unified_paging_refuses_a_lora_request_that_cannot_fit_beside_its_adapter() {
    let unified = owned(POOL).with_unified_adapters(T).unwrap();
    let mut adapters = AdapterPool::<T>::unified(POOL.gpu_pages, 8).unwrap();
    adapters.register(TaskId(1), 3).unwrap();
    let mut s: Sched<'_> = Scheduler::new(Config::default(), unified, adapters).unwrap();
    // 8 pages of 4 tokens: 32 tokens fit alone, 20 beside the 3-page adapter.
    let mut lora = spec(1, 21);
    lora.lora = Some(TaskId(1));
    refused(
        &mut s,
        "a LoRA prompt beside its adapter",
        |e| {
            matches!(
                e,
                Error::RequestTooLarge {
                    tokens: 21,
                    limit: 20,
                    ..
                }
            )
        },
        |s| s.submit(lora.clone()),
    );
    // The same prompt without the adapter fits; so does a LoRA prompt beside it.
    s.submit(spec(2, 21)).unwrap();
    lora.prompt = 20;
    s.submit(lora).unwrap();
}

/// A KV backend with fewer request slots than the scheduler's table: a submission past its slots is
/// refused (the capacity named is the backend's) and changes nothing, and once a request leaves, the
/// next one is accepted and scheduled. (Before, the table accepted it into a slot the pool does not
/// have: it was never scheduled, and the pool's `table` of that slot panicked.)
#[test]
fn a_submission_past_the_backends_slots_is_refused() {
    let adapters = AdapterPool::<T>::new(4, 4).unwrap();
    let pool = owned(KvPoolConfig { slots: 2, ..POOL });
    let mut s: Sched<'_> = Scheduler::new(Config::default(), pool, adapters).unwrap();
    let a = s
        .submit(RequestSpec::new(1, Phase::ContextInit, 4))
        .unwrap();
    s.submit(RequestSpec::new(2, Phase::ContextInit, 4))
        .unwrap();
    let before = snap(&s);
    assert_eq!(
        s.submit(RequestSpec::new(3, Phase::ContextInit, 4)),
        Err(Error::CapacityExhausted {
            what: "request table",
            capacity: 2
        })
    );
    assert_eq!(snap(&s), before, "a refused submission changes nothing");
    s.remove(a).unwrap();
    let c = s
        .submit(RequestSpec::new(3, Phase::ContextInit, 4))
        .unwrap();
    assert!(c.index() < 2, "the new request takes a slot the pool has");
    let mut out = Out::new();
    s.schedule(&mut out).unwrap();
    let ids: Vec<u16> = out.context().iter().map(|c| c.listed.slot()).collect();
    assert!(
        ids.contains(&c.index()),
        "the accepted request is scheduled: {ids:?}"
    );
    assert_eq!(s.kv().table(c.index()).len(), 1);
}
