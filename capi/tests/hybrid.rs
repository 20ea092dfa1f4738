//! A hybrid recurrent model's engine through the C ABI (issue 46): `state_*` in the configuration
//! gives the engine a state group; every scheduled request's entry names its live GPU state slot;
//! `kvsched_take_state_moves` and `kvsched_take_captures` hand out the state copies and the
//! snapshots. A plain engine is unchanged (its entries have no state slot, its logs are empty).

use kvsched_capi::*;

#[path = "support/calls.rs"]
mod calls;
use calls::{last_error, request};

/// Tokens a page in these tests (and a snapshot interval).
const TPB: u32 = 16;

/// An engine of `max_requests` requests on `gpu_pages` and `host_pages` pages of 16 tokens, whole
/// prompts, no recompute pause, beside a state group of `gpu` and `host` slots, `snapshots` of
/// them at most for snapshots, a snapshot point every page.
fn config(
    max_requests: u32,
    pages: [u32; 2],
    gpu: u32,
    host: u32,
    snapshots: u32,
) -> KvschedConfig {
    KvschedConfig {
        tokens_per_block: TPB,
        gpu_pages: pages[0],
        host_pages: pages[1],
        max_blocks_per_request: 16,
        max_requests,
        max_batch: max_requests,
        chunk_unit: 0,
        recompute_pause: 0,
        state_slot_bytes: 4096,
        state_gpu_slots: gpu,
        state_host_slots: host,
        state_snapshot_slots: snapshots,
        state_snapshot_interval: TPB,
        ..kvsched_config_default()
    }
}

/// What one iteration handed out: the output's lists, then the page moves, the state moves and the
/// captures (taken in that order, before the step, as an engine does).
#[derive(Debug, Default)]
struct Step {
    context: Vec<KvschedEntry>,
    generation: Vec<KvschedEntry>,
    paused: Vec<KvschedEntry>,
    resumed: Vec<KvschedEntry>,
    moves: Vec<KvschedPageMove>,
    states: Vec<KvschedStateMove>,
    captures: Vec<KvschedCapture>,
}

/// An engine, freed when dropped.
struct Engine(*mut kvsched_capi::Engine);

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: from `kvsched_engine_new`, freed once.
        unsafe { kvsched_engine_free(self.0) }
    }
}

/// A copy of `n` entries at `p` (null when `n` is 0).
///
/// # Safety
/// `p` points to `n` values (the engine's, valid until its next call that changes it).
unsafe fn copy<T: Copy>(p: *const T, n: usize) -> Vec<T> {
    if n == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
}

impl Engine {
    fn new(c: &KvschedConfig) -> Result<Self, (KvschedStatus, String)> {
        let mut e = std::ptr::null_mut();
        // SAFETY: valid pointers.
        match unsafe { kvsched_engine_new(c, &raw mut e) } {
            KvschedStatus::Ok => Ok(Self(e)),
            s => {
                assert!(e.is_null(), "a refused engine is not built");
                Err((s, last_error()))
            }
        }
    }

    fn submit(&self, id: u64, prompt: u32, hashes: &[u64]) {
        // SAFETY: the engine is live; `hashes` holds its length.
        let s =
            unsafe { kvsched_submit(self.0, &request(id, prompt), hashes.as_ptr(), hashes.len()) };
        assert_eq!(s, KvschedStatus::Ok, "{}", last_error());
    }

    /// A pass and what it hands out, before the step runs.
    fn schedule(&self) -> Step {
        // SAFETY: the engine is live; each array is copied before the next call.
        unsafe {
            let mut out = std::mem::zeroed::<KvschedOutput>();
            assert_eq!(kvsched_schedule(self.0, &raw mut out), KvschedStatus::Ok);
            let mut step = Step {
                context: copy(out.context, out.n_context),
                generation: copy(out.generation, out.n_generation),
                paused: copy(out.paused, out.n_paused),
                resumed: copy(out.resumed, out.n_resumed),
                ..Step::default()
            };
            let (mut p, mut n) = (std::ptr::null(), 0);
            assert_eq!(
                kvsched_take_moves(self.0, &raw mut p, &raw mut n),
                KvschedStatus::Ok
            );
            step.moves = copy(p, n);
            let (mut p, mut n) = (std::ptr::null(), 0);
            let s = kvsched_take_state_moves(self.0, &raw mut p, &raw mut n);
            assert_eq!(s, KvschedStatus::Ok);
            step.states = copy(p, n);
            let (mut p, mut n) = (std::ptr::null(), 0);
            let s = kvsched_take_captures(self.0, &raw mut p, &raw mut n);
            assert_eq!(s, KvschedStatus::Ok);
            step.captures = copy(p, n);
            step
        }
    }

    fn complete(&self) {
        // SAFETY: the engine is live.
        assert_eq!(unsafe { kvsched_complete_step(self.0) }, KvschedStatus::Ok);
    }

    fn finish(&self, id: u64) {
        // SAFETY: the engine is live.
        assert_eq!(unsafe { kvsched_finish(self.0, id) }, KvschedStatus::Ok);
    }
}

/// The state slots of `entries`, by id.
fn slots(entries: &[KvschedEntry]) -> Vec<(u64, u32)> {
    entries.iter().map(|x| (x.id, x.state_slot)).collect()
}

#[test]
fn a_hybrid_engine_names_each_scheduled_requests_state_slot() {
    let e = Engine::new(&config(4, [64, 64], 4, 4, 0)).expect("a valid hybrid engine");
    for id in 1..=3 {
        e.submit(id, 40, &[]);
    }
    let first = e.schedule();
    assert_eq!(first.context.len(), 3);
    let mut live: Vec<u32> = first.context.iter().map(|x| x.state_slot).collect();
    live.sort_unstable();
    live.dedup();
    assert_eq!(live.len(), 3, "distinct slots: {:?}", slots(&first.context));
    assert!(live.iter().all(|&g| g < 4), "GPU slots: {live:?}");
    assert!(
        first.states.is_empty() && first.captures.is_empty(),
        "{first:?}"
    );
    e.complete();
    // They decode on the slots their prompts were computed in.
    let next = e.schedule();
    assert_eq!(slots(&next.generation), slots(&first.context));
    e.complete();
    // A finished request gives its slot back: the next request may take it.
    e.finish(2);
    e.submit(4, 40, &[]);
    let after = e.schedule();
    let four = after.context.iter().find(|x| x.id == 4).expect("scheduled");
    let others: Vec<u32> = after.generation.iter().map(|x| x.state_slot).collect();
    assert!(
        four.state_slot < 4 && !others.contains(&four.state_slot),
        "{after:?}"
    );
    // SAFETY: the engine is live; `shared` is a local.
    unsafe {
        let (mut shared, before) = (0, (*e.0).fingerprint());
        let s = kvsched_fork(e.0, 1, &request(9, 32), &raw mut shared);
        assert_eq!(s, KvschedStatus::Invalid);
        assert!(last_error().contains("cannot fork"), "{}", last_error());
        assert_eq!(
            (*e.0).fingerprint(),
            before,
            "the refused fork changed nothing"
        );
    }
}

#[test]
fn a_plain_engine_has_no_state_slots_and_no_state_logs() {
    let e = Engine::new(&KvschedConfig {
        max_requests: 4,
        ..kvsched_config_default()
    })
    .expect("the default engine");
    e.submit(1, 40, &[]);
    let step = e.schedule();
    assert_eq!(slots(&step.context), [(1, KVSCHED_NO_STATE_SLOT)]);
    assert!(step.states.is_empty() && step.captures.is_empty());
    // SAFETY: null out-pointers are refused before the engine is read.
    unsafe {
        let mut n = 0;
        let s = kvsched_take_state_moves(e.0, std::ptr::null_mut(), &raw mut n);
        assert_eq!(s, KvschedStatus::NullPointer);
        let mut p = std::ptr::null();
        let s = kvsched_take_captures(std::ptr::null_mut(), &raw mut p, &raw mut n);
        assert_eq!(s, KvschedStatus::NullPointer);
    }
}

/// Runs iterations until `done` says so (at most 200): every request decodes `tokens` steps after
/// its prompt, then finishes. Returns every iteration's handout.
fn run(e: &Engine, tokens: usize, mut done: impl FnMut(&[Step]) -> bool) -> Vec<Step> {
    let mut decoded = std::collections::HashMap::<u64, usize>::new();
    let mut steps = Vec::new();
    while steps.len() < 200 {
        let step = e.schedule();
        e.complete();
        for x in &step.generation {
            *decoded.entry(x.id).or_default() += 1;
        }
        decoded.retain(|&id, n| {
            let ends = *n == tokens;
            if ends {
                e.finish(id);
            }
            !ends
        });
        steps.push(step);
        if done(&steps) {
            break;
        }
    }
    steps
}

#[test]
fn a_suspension_moves_the_state_to_the_host_and_a_resumption_brings_it_back() {
    // Six GPU pages: two prompts of 40 tokens take three each; the first page either needs for its
    // decode suspends the other to the host tier (no recompute pause).
    let e = Engine::new(&config(2, [6, 32], 2, 2, 0)).expect("a valid hybrid engine");
    e.submit(1, 40, &[]);
    e.submit(2, 40, &[]);
    let steps = run(&e, 30, |s| s.iter().any(|s| !s.resumed.is_empty()));
    let (at, out) = steps
        .iter()
        .enumerate()
        .find(|(_, s)| !s.paused.is_empty())
        .expect("a suspension");
    let x = out.paused[0];
    assert_eq!(
        x.state_slot, KVSCHED_NO_STATE_SLOT,
        "a paused request has no live slot"
    );
    let was = steps[..at]
        .iter()
        .rev()
        .find_map(|s| s.generation.iter().find(|g| g.id == x.id))
        .expect("it decoded before")
        .state_slot;
    let to_host = out
        .states
        .iter()
        .find(|m| m.request == x.id)
        .expect("its state moved");
    assert_eq!((to_host.op, to_host.src), (KVSCHED_STATE_TO_HOST, was));
    assert!(out
        .moves
        .iter()
        .any(|m| m.request == x.id && m.from_host == 0));
    // Back: the host slot it went to comes up into the GPU slot its entry names.
    let back = steps.last().expect("steps");
    let r = back
        .resumed
        .iter()
        .find(|r| r.id == x.id)
        .expect("it resumed");
    let to_gpu = back
        .states
        .iter()
        .find(|m| m.request == x.id)
        .expect("its state moved back");
    assert_eq!(
        (to_gpu.op, to_gpu.src, to_gpu.dst),
        (KVSCHED_STATE_TO_GPU, to_host.dst, r.state_slot)
    );
    assert!(back
        .moves
        .iter()
        .any(|m| m.request == x.id && m.from_host == 1));
    let scheduled = back.generation.iter().chain(&back.context);
    assert_eq!(
        scheduled
            .filter(|g| g.id == x.id)
            .map(|g| g.state_slot)
            .collect::<Vec<_>>(),
        [r.state_slot]
    );
}

#[test]
fn a_prefix_hit_restores_a_snapshot_that_a_capture_wrote() {
    let e = Engine::new(&config(2, [64, 0], 4, 0, 2)).expect("a valid hybrid engine");
    // 70 tokens: 4 full pages, hashed; its scan passes the snapshot point at 64.
    e.submit(1, 70, &[11, 12, 13, 14]);
    let first = e.schedule();
    let live = first.context[0].state_slot;
    assert_eq!(first.captures.len(), 1, "{first:?}");
    let c = first.captures[0];
    assert_eq!((c.request, c.position), (1, 64));
    assert!(c.slot < 4 && c.slot != live, "a slot of its own: {c:?}");
    e.complete();
    e.schedule();
    e.complete();
    e.finish(1);
    // The same 64 tokens, then 16 of its own: it resumes from the snapshot.
    e.submit(2, 80, &[11, 12, 13, 14, 15]);
    let hit = e.schedule();
    let x = hit.context[0];
    assert_eq!((x.id, x.tokens), (2, 16), "the chunk after the hit");
    let restore = hit
        .states
        .iter()
        .find(|m| m.request == 2)
        .expect("a restore");
    assert_eq!(
        (restore.op, restore.src, restore.dst),
        (KVSCHED_STATE_RESTORE, c.slot, x.state_slot)
    );
    // Its own deepest point is captured in turn.
    let mine: Vec<(u64, u32)> = hit
        .captures
        .iter()
        .map(|c| (c.request, c.position))
        .collect();
    assert_eq!(mine, [(2, 80)]);
    assert!(hit.captures[0].slot != c.slot && hit.captures[0].slot != x.state_slot);
}

#[test]
fn bad_state_settings_are_refused_with_a_message() {
    let ok = config(4, [64, 64], 4, 4, 1);
    for (c, why) in [
        (
            KvschedConfig {
                state_snapshot_slots: 4,
                ..ok
            },
            "snapshots must leave",
        ),
        (
            KvschedConfig {
                state_snapshot_interval: 24,
                ..ok
            },
            "whole number of attention blocks",
        ),
        (
            KvschedConfig {
                state_slot_bytes: 0,
                ..ok
            },
            "at least one byte",
        ),
        (
            KvschedConfig {
                state_gpu_slots: 2,
                state_host_slots: 1,
                ..ok
            },
            "more live requests",
        ),
        (
            KvschedConfig {
                state_gpu_slots: 0,
                ..ok
            },
            "state_gpu_slots = 0",
        ),
        (
            KvschedConfig {
                state_host_slots: 2000,
                ..ok
            },
            "at most 1024",
        ),
    ] {
        match Engine::new(&c) {
            Err((s, m)) => {
                assert_eq!(s, KvschedStatus::Invalid, "{why}");
                assert!(m.contains(why), "{why}: {m}");
            }
            Ok(_) => panic!("{why}: built"),
        }
    }
    assert!(Engine::new(&ok).is_ok());
}

#[test]
fn a_hybrid_engine_is_built_and_driven_on_a_small_stack() {
    // The hybrid backend's state pool and arrays are built in place on the heap (`Boxed`), so a
    // caller's thread of 256 KiB will do, as for a
    // plain engine.
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            let e = Engine::new(&config(1024, [4096, 0], 1024, 0, 8)).expect("a valid engine");
            e.submit(1, 64, &[1, 2, 3, 4]);
            let step = e.schedule();
            assert_eq!(step.context.len(), 1);
            assert!(step.context[0].state_slot < 1024);
            e.complete();
        })
        .expect("a thread")
        .join()
        .expect("no overflow, no panic");
}
