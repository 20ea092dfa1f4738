//! Fuzz target `capi`: any byte string decodes to a sequence of C ABI calls (every `extern "C"` function
//! of `kvsched-capi`, the header's whole surface) with random arguments — engines built from random
//! configurations and freed, requests of random shapes and kinds, ids live, finished and never seen,
//! null pointers in every pointer argument, hash arrays exactly as long as their count, vLLM event
//! batches encoded into buffers exactly as long as their capacity (too short ones included). Run under
//! AddressSanitizer (cargo-fuzz's default) with libFuzzer's leak detection, any out-of-bounds read or
//! write, use after free or leak is a crash. The target checks besides:
//!
//! - every status is one of the header's codes, never `PANIC` or `POISONED`, and `NULL_POINTER`
//!   whenever the engine pointer is null; a refusal leaves a message in `kvsched_last_error`;
//! - a refused call changes nothing: its engine's fingerprint (`Engine::fingerprint`: scheduler, KV
//!   pool, adapter cache, last output and the lists handed out) is the same before and after, and the
//!   arrays earlier calls handed out (a pass's lists, page moves, KV events, a page table) are still
//!   readable and hold what they held; a call that only reads (`kvsched_page_table`,
//!   `kvsched_prefix_root`, `kvsched_len`, `kvsched_gpu_free`) changes nothing either, and after any
//!   call the arrays every other engine handed out are unchanged;
//! - what comes back is in range: listed ids are live requests, slots within `max_requests`, page
//!   table entries within their tier, moves between tiers that exist, events of known kinds; after every
//!   call each live request has a page table, the tables are disjoint but for shared prefix blocks (a
//!   page in two tables sits at the same index of both, where both name the same block key, chained
//!   with `kvsched_chain` from `kvsched_prefix_root` over the hashes submitted), and `kvsched_len` is
//!   the number of requests submitted and not yet finished or sent;
//! - an encoded batch fits the buffer it was written into, and one byte less is refused.
#![no_main]

use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

use libfuzzer_sys::fuzz_target;

use kvsched_capi::*;

/// The input, read a byte at a time (zeros once it runs out).
struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bytes<'_> {
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
    /// A value below `n` (n > 0).
    fn below(&mut self, n: u32) -> u32 {
        u32::from(self.u8()) % n
    }
    /// True one time in `n`.
    fn one_in(&mut self, n: u32) -> bool {
        self.below(n) == 0
    }
    /// Mostly a value below `small`, sometimes any u32 (edge values included).
    fn count(&mut self, small: u32) -> u32 {
        match self.u8() {
            0..=239 => self.below(small),
            240..=243 => 0,
            244..=247 => u32::MAX,
            248..=251 => u32::MAX / 2 + 1,
            _ => self.u32(),
        }
    }
}

/// What an earlier call handed out, with a copy of what it held: readable and unchanged until the next
/// call that changes its engine.
#[derive(Default)]
struct Views {
    output: Option<(KvschedOutput, Vec<Vec<KvschedEntry>>, Vec<u64>)>,
    moves: Option<(*const KvschedPageMove, usize, Vec<KvschedPageMove>)>,
    events: Option<(*const KvschedKvEvent, usize, Vec<KvschedKvEvent>)>,
    table: Option<(*const u32, usize, Vec<u32>)>,
}

/// `n` values at `p` (a valid, possibly dangling, pointer for `n` = 0).
///
/// # Safety
/// `p` points to `n` readable values (the C ABI's contract for what it hands out).
unsafe fn read<T: Copy>(p: *const T, n: usize) -> Vec<T> {
    if n == 0 {
        return Vec::new();
    }
    assert!(!p.is_null(), "a null array with {n} elements");
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
}

/// The six entry lists of an output, copied.
///
/// # Safety
/// `o` comes from a successful `kvsched_schedule` whose engine has not changed since.
unsafe fn lists(o: &KvschedOutput) -> (Vec<Vec<KvschedEntry>>, Vec<u64>) {
    // SAFETY: the caller's contract.
    unsafe {
        (
            vec![
                read(o.context, o.n_context),
                read(o.generation, o.n_generation),
                read(o.paused, o.n_paused),
                read(o.recompute_paused, o.n_recompute_paused),
                read(o.disagg, o.n_disagg),
                read(o.resumed, o.n_resumed),
            ],
            read(o.adapter_loads, o.n_adapter_loads),
        )
    }
}

impl Views {
    /// Reads every view again: each must hold what it held.
    fn verify(&self) {
        // SAFETY: a view is kept only while its engine has not changed (it is dropped on the first
        // successful changing call), so its arrays are still valid by the header's contract.
        unsafe {
            if let Some((o, l, loads)) = &self.output {
                assert_eq!(
                    &lists(o),
                    &(l.clone(), loads.clone()),
                    "a pass's lists changed"
                );
            }
            if let Some((p, n, v)) = &self.moves {
                assert_eq!(&read(*p, *n), v, "the page moves changed");
            }
            if let Some((p, n, v)) = &self.events {
                assert_eq!(&read(*p, *n), v, "the KV events changed");
            }
            if let Some((p, n, v)) = &self.table {
                assert_eq!(&read(*p, *n), v, "a page table changed");
            }
        }
    }
}

/// A live engine and what the target knows of it.
struct Live {
    engine: *mut Engine,
    config: KvschedConfig,
    /// Requests submitted and not yet finished or sent, in submission order.
    ids: Vec<u64>,
    /// Each live request's block keys (its prompt's hashes chained from its prefix root; none without
    /// a prefix cache): two tables may share a page only where they name one block.
    keys: std::collections::HashMap<u64, Vec<u64>>,
    views: Views,
}

impl Live {
    fn forget(&mut self, id: u64) {
        self.ids.retain(|&x| x != id);
        self.keys.remove(&id);
    }

    fn fingerprint(&self) -> u64 {
        // SAFETY: a live engine's pointer from `kvsched_engine_new`, not yet freed.
        unsafe { &*self.engine }.fingerprint()
    }
}

/// Every live engine, and the target's rules over the calls made on them.
struct State {
    live: Vec<Live>,
}

/// Whether a successful call changes its engine (and so ends the validity of what it handed out).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Changes,
    Reads,
}

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string it keeps until the thread's next call.
    unsafe { CStr::from_ptr(kvsched_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn check_code(s: KvschedStatus) {
    let code = s as u32;
    assert!(
        code <= KvschedStatus::Poisoned as u32,
        "status {code} is no code of the header"
    );
    assert!(
        !matches!(s, KvschedStatus::Panic | KvschedStatus::Poisoned),
        "a panic crossed into the C ABI: {s:?} ({})",
        last_error()
    );
}

impl State {
    /// The engine a call goes to: one of the live ones, or null (also when none is live).
    fn pick(&self, b: &mut Bytes) -> Option<usize> {
        let x = b.u8();
        (x % 8 != 7 && !self.live.is_empty()).then(|| x as usize % self.live.len())
    }

    fn ptr(&self, at: Option<usize>) -> *mut Engine {
        at.map_or(null_mut(), |i| self.live[i].engine)
    }

    /// Makes `call` on engine `at` and holds it to the rules; its status.
    fn call(
        &mut self,
        at: Option<usize>,
        kind: Kind,
        call: impl FnOnce(*mut Engine) -> KvschedStatus,
    ) -> KvschedStatus {
        let before = at.map(|i| self.live[i].fingerprint());
        let s = call(self.ptr(at));
        check_code(s);
        if trace() {
            eprintln!(
                "  engine {at:?}: {s:?} {}",
                if s == KvschedStatus::Ok {
                    String::new()
                } else {
                    last_error()
                }
            );
        }
        if at.is_none() {
            assert_eq!(s, KvschedStatus::NullPointer, "a call on a null engine");
        }
        if s != KvschedStatus::Ok {
            assert!(!last_error().is_empty(), "{s:?} without a message");
        }
        let changed = s == KvschedStatus::Ok && kind == Kind::Changes;
        if let (Some(i), Some(fp)) = (at, before) {
            if changed {
                self.live[i].views = Views::default();
            } else {
                assert_eq!(
                    self.live[i].fingerprint(),
                    fp,
                    "{s:?} changed the engine ({})",
                    if kind == Kind::Changes {
                        "a changing call refused"
                    } else {
                        "a reading call"
                    }
                );
            }
        }
        // What every engine handed out is still there (a call on one engine changes no other).
        for l in &self.live {
            l.views.verify();
        }
        s
    }

    /// A request id: mostly a live one, else a small one (maybe finished, maybe never seen) or a far one.
    fn id(&self, at: Option<usize>, b: &mut Bytes) -> u64 {
        let x = b.u8();
        match (at.map(|i| &self.live[i].ids), x) {
            (Some(ids), 0..=159) if !ids.is_empty() => ids[x as usize % ids.len()],
            (_, 0..=247) => u64::from(x % 16),
            _ => b.u64() | 1 << 40,
        }
    }

    /// After every call: each live engine counts the requests the target counts, and each has a page
    /// table within its tiers.
    fn audit(&mut self) {
        for l in &mut self.live {
            // SAFETY: a live engine.
            let len = unsafe { kvsched_len(l.engine) };
            assert_eq!(
                len,
                l.ids.len(),
                "kvsched_len against the requests submitted and not removed"
            );
            // page -> (request, index in its table)
            let mut owner = std::collections::HashMap::new();
            for &id in &l.ids {
                let (mut p, mut n) = (null(), 0usize);
                // SAFETY: a live engine and two locals.
                let s = unsafe { kvsched_page_table(l.engine, id, &raw mut p, &raw mut n) };
                assert_eq!(
                    s,
                    KvschedStatus::Ok,
                    "live request {id} has no page table: {}",
                    last_error()
                );
                // SAFETY: just handed out by a successful call.
                let t = unsafe { read(p, n) };
                check_table(&l.config, &t);
                let mine = &l.keys[&id];
                for (j, &page) in t.iter().enumerate().filter(|&(_, &p)| p != u32::MAX) {
                    if let Some(&(k, jk)) = owner.get(&page) {
                        let theirs: &Vec<u64> = &l.keys[&k];
                        assert!(
                            j == jk && mine.get(j).is_some() && mine.get(j) == theirs.get(j),
                            "page {page:#x} is entry {j} of request {id} and entry {jk} of request \
                             {k}, not one prefix block"
                        );
                        if trace() {
                            eprintln!("  page {page:#x}: block {j} of requests {k} and {id}");
                        }
                    } else {
                        owner.insert(page, (id, j));
                    }
                }
            }
            l.views.verify();
        }
    }
}

fn check_table(c: &KvschedConfig, t: &[u32]) {
    assert!(
        t.len() <= c.max_blocks_per_request as usize,
        "a page table longer than a request may hold"
    );
    for &p in t {
        if p == u32::MAX {
            continue; // a page a sliding window gave up
        }
        if p & 1 << 31 != 0 {
            assert!(
                p & !(1 << 31) < c.host_pages,
                "host page {p:#x} out of the host tier"
            );
        } else {
            assert!(p < c.gpu_pages, "GPU page {p} out of the GPU tier");
        }
    }
}

/// A configuration: mostly small and valid, sometimes at its edges (every capacity that sizes memory
/// kept small enough for the fuzzer's memory limit).
fn config(b: &mut Bytes) -> KvschedConfig {
    let mut c = kvsched_config_default();
    c.tokens_per_block = [1, 2, 4, 8, 16, 32, 0, 3][b.below(8) as usize];
    if b.one_in(16) {
        c.tokens_per_block = b.u32();
    }
    c.gpu_pages = b.count(64);
    c.gpu_pages = c.gpu_pages.min(4096);
    c.host_pages = b.count(32).min(4096);
    c.max_blocks_per_request = b.count(24).min(256);
    c.max_requests = match b.u8() {
        0..=239 => 1 + b.below(8),
        240..=247 => 0,
        248..=251 => KVSCHED_MAX_REQUESTS,
        _ => KVSCHED_MAX_REQUESTS + 1,
    };
    c.max_batch = b.count(8);
    c.max_num_tokens = [0, 16, 64, 256, 1024][b.below(5) as usize];
    if b.one_in(16) {
        c.max_num_tokens = b.u32();
    }
    c.chunk_unit = [0, 8, 16, 64][b.below(4) as usize];
    if b.one_in(16) {
        c.chunk_unit = b.u32();
    }
    c.recompute_pause = b.u8() % 3;
    c.prefix_cache = b.u8() % 3;
    c.adapter_device_pages = b.count(8);
    c.adapter_host_pages = b.count(16);
    c.kv_events = [0, 0, 4, 64][b.below(4) as usize];
    if b.one_in(4) {
        c.shares[0] = KvschedShare {
            requests: b.below(4),
            kv_tokens: b.count(256),
            adapter_pages: b.below(4),
        };
    }
    c
}

/// A request: mostly one that fits its engine (a plain prompt of up to a page table's tokens, no
/// adapter or one of the few the target registers), sometimes any shape.
fn request(s: &State, at: Option<usize>, b: &mut Bytes) -> KvschedRequest {
    let fits = at.map_or(64, |i| {
        let c = &s.live[i].config;
        c.max_blocks_per_request
            .saturating_mul(c.tokens_per_block)
            .clamp(1, 4096)
    });
    let wild = b.one_in(8);
    KvschedRequest {
        id: s.id(at, b),
        lora_task: u64::from(b.below(4)),
        prompt: if wild {
            b.count(4096)
        } else {
            1 + b.below(255) * fits / 512
        },
        max_new_tokens: if wild {
            b.count(64)
        } else {
            b.below(255) * fits / 1024
        },
        beam: if wild { b.below(4) } else { 1 },
        draft: if wild { b.below(4) } else { 0 },
        cache_salt: u64::from(b.below(3)),
        arrival: u64::from(b.u16()),
        has_lora: match b.u8() {
            0..=159 => 0,
            160..=251 => 1,
            x => x,
        },
        kind: match b.u8() {
            0..=191 => 0,
            192..=215 => 1,
            216..=247 => 2,
            x => x,
        },
        priority: b.u8(),
        service_class: if wild { b.u8() } else { b.below(4) as u8 },
    }
}

/// An event batch for `kvsched_encode_kv_events`, its arrays owned here (each exactly its count long).
struct Batch {
    events: Vec<KvschedVllmEvent>,
    _hashes: Vec<Box<[u64]>>,
    _tokens: Vec<Box<[u32]>>,
    _names: Vec<CString>,
}

fn batch(b: &mut Bytes) -> Batch {
    let mut out = Batch {
        events: Vec::new(),
        _hashes: Vec::new(),
        _tokens: Vec::new(),
        _names: Vec::new(),
    };
    for _ in 0..b.below(4) {
        let n_blocks = b.below(4) as usize;
        let block_size = b.below(5);
        let hashes: Box<[u64]> = (0..n_blocks).map(|_| u64::from(b.u16())).collect();
        let mut n_tokens = n_blocks * block_size as usize;
        if b.one_in(8) {
            n_tokens = n_tokens.saturating_sub(1);
        }
        let tokens: Box<[u32]> = (0..n_tokens).map(|_| u32::from(b.u16())).collect();
        let name = match b.below(4) {
            0 => Some(CString::new("adapter-a").unwrap()),
            1 => Some(CString::new(vec![0xff, 0xfe, b'x']).unwrap()), // not UTF-8
            _ => None,
        };
        let null_hashes = n_blocks > 0 && b.one_in(8);
        let null_tokens = n_tokens > 0 && b.one_in(8);
        out.events.push(KvschedVllmEvent {
            block_hashes: if null_hashes { null() } else { hashes.as_ptr() },
            n_blocks,
            token_ids: if null_tokens { null() } else { tokens.as_ptr() },
            n_tokens,
            lora_name: name
                .as_ref()
                .map_or(null(), |n| n.as_ptr().cast::<c_char>()),
            parent: u64::from(b.u16()),
            lora_id: u64::from(b.u8()),
            block_size,
            kind: b.below(4) as u8,
            host: b.below(3) as u8,
            has_parent: b.u8() % 2,
            has_lora_id: b.u8() % 2,
        });
        out._hashes.push(hashes);
        out._tokens.push(tokens);
        out._names.extend(name);
    }
    out
}

/// Encodes `events` into a buffer of exactly `cap` bytes (null for `cap` = 0 sometimes); the status and
/// the length written.
fn encode(
    events: &[KvschedVllmEvent],
    null_events: bool,
    cap: usize,
    written_null: bool,
) -> (KvschedStatus, usize) {
    let mut buf = vec![0xa5u8; cap].into_boxed_slice();
    let out = if cap == 0 {
        null_mut()
    } else {
        buf.as_mut_ptr()
    };
    let mut written = usize::MAX;
    let ev = if null_events { null() } else { events.as_ptr() };
    // SAFETY: `events` holds `events.len()` events whose arrays are valid for their counts (or null,
    // which the call refuses), `buf` `cap` bytes, `written` a local (or null).
    let s = unsafe {
        kvsched_encode_kv_events(
            ev,
            events.len(),
            1.5,
            0,
            out,
            cap,
            if written_null {
                null_mut()
            } else {
                &raw mut written
            },
        )
    };
    check_code(s);
    if written_null {
        assert_eq!(s, KvschedStatus::NullPointer);
        return (s, 0);
    }
    match s {
        KvschedStatus::Ok => assert!(written <= cap, "{written} bytes written into {cap}"),
        // A buffer too small: the refusal says how many bytes the batch takes.
        KvschedStatus::Capacity => assert!(written > cap, "{written} bytes asked of {cap}"),
        _ => assert_eq!(written, 0, "a refused encoding reports bytes written"),
    }
    if s != KvschedStatus::Ok {
        assert!(!last_error().is_empty());
    }
    (s, written)
}

/// `KVSCHED_FUZZ_TRACE=1` prints each call and its status (to read what a seed or a crash does).
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("KVSCHED_FUZZ_TRACE").is_some())
}

const OPS: [&str; 20] = [
    "engine_new",
    "engine_free",
    "register_adapter",
    "submit",
    "schedule",
    "take_moves",
    "complete_step",
    "page_table",
    "finish",
    "set_inflight",
    "end_send",
    "start_receive",
    "end_receive",
    "take_kv_events",
    "prefix_root",
    "chain",
    "encode_kv_events",
    "len/gpu_free",
    "last_error",
    "views",
];

/// A new engine (at most 3 live at once; a fourth is built and freed at once).
fn new_engine(s: &mut State, b: &mut Bytes) {
    let c = config(b);
    let (null_config, null_out) = (b.one_in(16), b.one_in(16));
    let mut e: *mut Engine = std::ptr::NonNull::dangling().as_ptr(); // not null: the call must reset it
                                                                     // SAFETY: a local configuration and a local out pointer (or null, which is refused).
    let st = unsafe {
        kvsched_engine_new(
            if null_config { null() } else { &raw const c },
            if null_out { null_mut() } else { &raw mut e },
        )
    };
    check_code(st);
    if null_config || null_out {
        assert_eq!(st, KvschedStatus::NullPointer);
    } else if st == KvschedStatus::Ok {
        assert!(!e.is_null());
        if s.live.len() < 3 {
            s.live.push(Live {
                engine: e,
                config: c,
                ids: Vec::new(),
                keys: std::collections::HashMap::new(),
                views: Views::default(),
            });
        } else {
            // SAFETY: just built, not kept.
            unsafe { kvsched_engine_free(e) };
        }
    } else {
        assert!(e.is_null(), "a refused kvsched_engine_new left *out set");
        assert!(!last_error().is_empty());
    }
}

/// `kvsched_submit`: a request, its hashes, null pointers sometimes.
fn submit(s: &mut State, b: &mut Bytes) {
    let at = s.pick(b);
    let r = request(s, at, b);
    let n = b.below(9) as usize;
    let hashes: Box<[u64]> = (0..n).map(|_| u64::from(b.below(6))).collect();
    let (null_request, null_hashes) = (b.one_in(16), n > 0 && b.one_in(16));
    let st = s.call(at, Kind::Changes, |e| {
        // SAFETY: a live engine or null; a local request and `n` hashes (or null pointers).
        unsafe {
            kvsched_submit(
                e,
                if null_request { null() } else { &raw const r },
                if null_hashes { null() } else { hashes.as_ptr() },
                n,
            )
        }
    });
    if null_request || null_hashes {
        assert_eq!(st, KvschedStatus::NullPointer);
    }
    if st == KvschedStatus::Ok {
        let l = &mut s.live[at.unwrap()];
        assert!(!l.ids.contains(&r.id), "a duplicate id was accepted");
        l.ids.push(r.id);
        let keys = if l.config.prefix_cache == 0 {
            Vec::new()
        } else {
            let mut root = 0u64;
            // SAFETY: a live engine and a local.
            let st = unsafe { kvsched_prefix_root(l.engine, r.id, &raw mut root) };
            assert_eq!(st, KvschedStatus::Ok, "no prefix root for a live request");
            hashes
                .iter()
                .scan(root, |key, &h| {
                    *key = kvsched_chain(*key, h);
                    Some(*key)
                })
                .collect()
        };
        l.keys.insert(r.id, keys);
    }
}

/// `kvsched_schedule`: a pass and its adapter plan; the lists it hands out are checked and kept.
fn schedule(s: &mut State, b: &mut Bytes) {
    let at = s.pick(b);
    let null_out = b.one_in(16);
    // SAFETY: an all-zero output is a valid value (null pointers, zero counts).
    let mut o: KvschedOutput = unsafe { std::mem::zeroed() };
    let st = s.call(at, Kind::Changes, |e| {
        // SAFETY: a live engine or null; a local output (or null).
        unsafe { kvsched_schedule(e, if null_out { null_mut() } else { &raw mut o }) }
    });
    if st == KvschedStatus::Ok {
        let l = &mut s.live[at.unwrap()];
        // SAFETY: just handed out.
        let (lists, loads) = unsafe { lists(&o) };
        for e in lists.iter().flatten() {
            assert!(l.ids.contains(&e.id), "listed request {} is not live", e.id);
            assert!(
                u32::from(e.slot) < l.config.max_requests,
                "slot {} beyond max_requests",
                e.slot
            );
            assert!(e.has_lora <= 1 && e.last <= 1);
        }
        l.views.output = Some((o, lists, loads));
    }
}

/// `kvsched_take_moves`: the page moves, each between tiers that exist.
fn take_moves(s: &mut State, b: &mut Bytes) {
    let at = s.pick(b);
    let (null_moves, null_n) = (b.one_in(16), b.one_in(16));
    let (mut p, mut n) = (null(), 0usize);
    let st = s.call(at, Kind::Changes, |e| {
        // SAFETY: a live engine or null; locals (or null).
        unsafe {
            kvsched_take_moves(
                e,
                if null_moves { null_mut() } else { &raw mut p },
                if null_n { null_mut() } else { &raw mut n },
            )
        }
    });
    if st == KvschedStatus::Ok {
        let l = &mut s.live[at.unwrap()];
        // SAFETY: just handed out.
        let moves = unsafe { read(p, n) };
        let c = &l.config;
        for m in &moves {
            let (src_cap, dst_cap) = match m.from_host {
                1 => (c.host_pages, c.gpu_pages),
                0 => (c.gpu_pages, c.host_pages),
                f => panic!("a move's from_host is {f}"),
            };
            assert!(
                m.src < src_cap && m.dst < dst_cap,
                "move {m:?} out of its tiers"
            );
        }
        l.views.moves = Some((p, n, moves));
    }
}

/// `kvsched_page_table`: a reading call; the table is checked and kept.
fn page_table(s: &mut State, b: &mut Bytes) {
    let at = s.pick(b);
    let id = s.id(at, b);
    let (null_pages, null_n) = (b.one_in(16), b.one_in(16));
    let (mut p, mut n) = (null(), 0usize);
    let st = s.call(at, Kind::Reads, |e| {
        // SAFETY: a live engine or null; locals (or null).
        unsafe {
            kvsched_page_table(
                e,
                id,
                if null_pages { null_mut() } else { &raw mut p },
                if null_n { null_mut() } else { &raw mut n },
            )
        }
    });
    if st == KvschedStatus::Ok {
        let l = &mut s.live[at.unwrap()];
        assert!(
            l.ids.contains(&id),
            "a page table for {id}, which is not live"
        );
        // SAFETY: just handed out.
        let t = unsafe { read(p, n) };
        check_table(&l.config, &t);
        l.views.table = Some((p, n, t));
    }
}

/// `kvsched_take_kv_events`: the events, of known kinds, at most the log's capacity.
fn take_kv_events(s: &mut State, b: &mut Bytes) {
    let at = s.pick(b);
    let (null_events, null_n) = (b.one_in(16), b.one_in(16));
    let (mut p, mut n) = (null(), 0usize);
    let st = s.call(at, Kind::Changes, |e| {
        // SAFETY: a live engine or null; locals (or null).
        unsafe {
            kvsched_take_kv_events(
                e,
                if null_events { null_mut() } else { &raw mut p },
                if null_n { null_mut() } else { &raw mut n },
            )
        }
    });
    if st == KvschedStatus::Ok {
        let l = &mut s.live[at.unwrap()];
        // SAFETY: just handed out.
        let events = unsafe { read(p, n) };
        assert!(
            n <= l.config.kv_events as usize,
            "{n} events from a log of {}",
            l.config.kv_events
        );
        for ev in &events {
            assert!(
                ev.kind <= KVSCHED_KV_CLEARED && ev.host <= 1,
                "event {ev:?}"
            );
        }
        l.views.events = Some((p, n, events));
    }
}

/// `kvsched_encode_kv_events`: a random batch into a random buffer; a batch that encodes fits its own length
/// and not one byte less, and a refusal for room asks for exactly that length.
fn encode_batch(b: &mut Bytes) {
    let batch = batch(b);
    let null_events = !batch.events.is_empty() && b.one_in(16);
    let written_null = b.one_in(32);
    let cap = b.below(160) as usize;
    let (st, asked) = encode(&batch.events, null_events, cap, written_null);
    if null_events && !written_null {
        assert_eq!(st, KvschedStatus::NullPointer);
    }
    if st == KvschedStatus::Ok || st == KvschedStatus::Capacity {
        // The batch's own length fits, one byte less does not.
        let (st, len) = encode(&batch.events, false, 4096, false);
        assert_eq!(
            st,
            KvschedStatus::Ok,
            "a valid batch refused: {}",
            last_error()
        );
        assert_eq!(
            encode(&batch.events, false, len, false),
            (KvschedStatus::Ok, len)
        );
        if st == KvschedStatus::Capacity {
            assert_eq!(asked, len, "the size a refusal asks is the batch's");
        }
        if len > 0 {
            assert_eq!(
                encode(&batch.events, false, len - 1, false).0,
                KvschedStatus::Capacity
            );
        }
    }
}

/// `kvsched_len` and `kvsched_gpu_free`: they read, and agree with what the target knows.
fn len_and_free(s: &mut State, b: &mut Bytes) {
    let at = s.pick(b);
    let before: Vec<u64> = s.live.iter().map(Live::fingerprint).collect();
    let e = s.ptr(at);
    // SAFETY: a live engine or null.
    let (len, free) = unsafe { (kvsched_len(e), kvsched_gpu_free(e)) };
    match at {
        None => assert_eq!((len, free), (0, 0)),
        Some(i) => {
            assert_eq!(len, s.live[i].ids.len());
            assert!(free <= s.live[i].config.gpu_pages);
        }
    }
    let after: Vec<u64> = s.live.iter().map(Live::fingerprint).collect();
    assert_eq!(
        before, after,
        "kvsched_len or kvsched_gpu_free changed an engine"
    );
}

fn step(s: &mut State, b: &mut Bytes) {
    let op = b.below(20);
    if trace() {
        eprintln!("{}", OPS[op as usize]);
    }
    match op {
        0 => new_engine(s, b),
        // Free an engine (or null, which is ignored).
        1 => match s.pick(b) {
            // SAFETY: a live engine, dropped from the list: never used again.
            Some(i) => unsafe { kvsched_engine_free(s.live.remove(i).engine) },
            // SAFETY: null is ignored.
            None => unsafe { kvsched_engine_free(null_mut()) },
        },
        2 => {
            let at = s.pick(b);
            let (task, pages) = (u64::from(b.below(5)), b.count(6));
            // SAFETY: a live engine or null.
            s.call(at, Kind::Changes, |e| unsafe {
                kvsched_register_adapter(e, task, pages)
            });
        }
        3 => submit(s, b),
        4 => schedule(s, b),
        5 => take_moves(s, b),
        6 => {
            let at = s.pick(b);
            // SAFETY: a live engine or null.
            s.call(at, Kind::Changes, |e| unsafe { kvsched_complete_step(e) });
        }
        7 => page_table(s, b),
        8 => {
            let at = s.pick(b);
            let id = s.id(at, b);
            // SAFETY: a live engine or null.
            if s.call(at, Kind::Changes, |e| unsafe { kvsched_finish(e, id) }) == KvschedStatus::Ok
            {
                s.live[at.unwrap()].forget(id);
            }
        }
        9 => {
            let at = s.pick(b);
            let (id, flag) = (s.id(at, b), b.u8() % 3);
            // SAFETY: a live engine or null.
            s.call(at, Kind::Changes, |e| unsafe {
                kvsched_set_inflight(e, id, flag)
            });
        }
        10 => {
            let at = s.pick(b);
            let (id, flag) = (s.id(at, b), b.u8() % 3);
            // SAFETY: a live engine or null.
            if s.call(at, Kind::Changes, |e| unsafe {
                kvsched_end_send(e, id, flag)
            }) == KvschedStatus::Ok
            {
                s.live[at.unwrap()].forget(id);
            }
        }
        11 => {
            let at = s.pick(b);
            let id = s.id(at, b);
            // SAFETY: a live engine or null.
            s.call(at, Kind::Changes, |e| unsafe {
                kvsched_start_receive(e, id)
            });
        }
        12 => {
            let at = s.pick(b);
            let (id, flag) = (s.id(at, b), b.u8() % 3);
            // SAFETY: a live engine or null.
            s.call(at, Kind::Changes, |e| unsafe {
                kvsched_end_receive(e, id, flag)
            });
        }
        13 => take_kv_events(s, b),
        14 => {
            let at = s.pick(b);
            let id = s.id(at, b);
            let null_root = b.one_in(16);
            let mut root = 0u64;
            let st = s.call(at, Kind::Reads, |e| {
                // SAFETY: a live engine or null; a local (or null).
                unsafe {
                    kvsched_prefix_root(e, id, if null_root { null_mut() } else { &raw mut root })
                }
            });
            if st == KvschedStatus::Ok {
                assert!(s.live[at.unwrap()].ids.contains(&id));
            }
        }
        15 => {
            let (p, h) = (b.u64(), b.u64());
            assert_eq!(
                kvsched_chain(p, h),
                kvsched_chain(p, h),
                "kvsched_chain is a function"
            );
        }
        16 => encode_batch(b),
        17 => len_and_free(s, b),
        18 => {
            let _ = last_error();
        }
        // Read every view again (a no-op call that must find them as they were).
        _ => {
            for l in &s.live {
                l.views.verify();
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes { data, at: 0 };
    let mut s = State { live: Vec::new() };
    while !b.done() {
        step(&mut s, &mut b);
        s.audit();
    }
    for l in s.live.drain(..) {
        // SAFETY: a live engine, freed once.
        unsafe { kvsched_engine_free(l.engine) };
    }
});
