//! KV events published the way vLLM publishes them (`--kv-events`), for KV-aware routers: ZMQ PUB
//! frames `[topic, sequence number (8 bytes, big-endian, from 0), payload]`, the payload a batch in
//! vLLM 0.33's wire format ([`kvsched_core::kv_events::vllm`]); and, with `--kv-events-replay`, a
//! ROUTER socket that answers a request for a sequence number with every kept batch from it on
//! (`[seq, payload]` each, then `[-1, ""]`), as vLLM's `ZmqEventPublisher` does.
//!
//! The engine thread turns each step's [`KvBlockEvent`]s into one batch: consecutive stores of one
//! chain (same tier and adapter, each the parent of the next) become one `BlockStored`,
//! consecutive removals from one tier one `BlockRemoved`; an adapter's served name is its
//! `lora_name`. The sockets live on a thread of their own (a current-thread runtime), which the
//! engine thread hands payloads to; it keeps the last [`REPLAY`] batches.

use std::collections::{HashMap, VecDeque};

use kvsched_core::kv::Tier;
use kvsched_core::kv_events::vllm::{encode_batch, VllmEvent};
use kvsched_core::kv_events::KvEventKind;
use kvsched_engine::KvBlockEvent;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::error::StartError;

/// Batches kept for replay.
pub const REPLAY: usize = 10_000;

/// Where the events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The PUB socket's endpoint (bound), e.g. `tcp://127.0.0.1:5557`.
    pub endpoint: String,
    /// The replay ROUTER socket's endpoint (bound); `None`: no replay.
    pub replay: Option<String>,
    /// The topic frame.
    pub topic: String,
}

/// The engine thread's side: encodes batches and hands them to the sockets' thread.
#[derive(Debug)]
pub struct Publisher {
    payloads: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    names: HashMap<u64, String>,
    block_size: u32,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A run of events that one wire event carries.
struct Run {
    kind: KvEventKind,
    tier: Tier,
    adapter: Option<u64>,
    parent: Option<u64>,
    hashes: Vec<u64>,
    tokens: Vec<u32>,
}

impl Publisher {
    /// Binds the sockets (refused: an endpoint that does not bind) and starts their thread.
    /// `names`: each adapter's served name by id; `block_size`: tokens a block.
    pub fn start(
        cfg: &KvEventsConfig,
        names: HashMap<u64, String>,
        block_size: u32,
    ) -> Result<Self, StartError> {
        let (payloads, rx) = tokio::sync::mpsc::unbounded_channel();
        let (ready, bound) = std::sync::mpsc::channel();
        let cfg = cfg.clone();
        let thread = std::thread::Builder::new()
            .name("kvsched-kv-events".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match rt {
                    Ok(rt) => rt.block_on(sockets(cfg, rx, ready)),
                    Err(e) => {
                        let _ = ready.send(Err(StartError::Thread("KV events", e)));
                    }
                }
            })
            .map_err(|e| StartError::Thread("KV events", e))?;
        bound
            .recv()
            .map_err(|_| StartError::KvEvents("the KV events thread ended".into()))??;
        Ok(Self {
            payloads,
            names,
            block_size,
            thread: Some(thread),
        })
    }

    /// Names an adapter loaded at run time: its blocks' events carry the name from now on (ids are
    /// never reused, so an unloaded adapter's name stays for its blocks still to be removed).
    pub fn name_adapter(&mut self, id: u64, name: String) {
        self.names.insert(id, name);
    }

    /// Publishes one step's events as one batch (nothing for none).
    pub fn publish(&self, events: &[KvBlockEvent]) {
        if events.is_empty() {
            return;
        }
        let runs = runs(events);
        let wire: Vec<VllmEvent<'_>> = runs.iter().map(|r| self.wire(r)).collect();
        let size = 64
            + runs
                .iter()
                .map(|r| 48 + 9 * r.hashes.len() + 5 * r.tokens.len())
                .sum::<usize>();
        let mut buf = vec![0; size];
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        if let Ok(n) = encode_batch(&mut buf, ts, &wire, 0) {
            buf.truncate(n);
            let _ = self.payloads.send(buf);
        }
    }

    fn wire<'r>(&'r self, r: &'r Run) -> VllmEvent<'r> {
        match r.kind {
            KvEventKind::Stored => VllmEvent::Stored {
                block_hashes: &r.hashes,
                parent: r.parent,
                token_ids: &r.tokens,
                block_size: self.block_size,
                lora_id: r.adapter,
                tier: r.tier,
                lora_name: r
                    .adapter
                    .and_then(|a| self.names.get(&a))
                    .map(String::as_str),
            },
            KvEventKind::Removed => VllmEvent::Removed {
                block_hashes: &r.hashes,
                tier: r.tier,
            },
            KvEventKind::Cleared => VllmEvent::Cleared,
        }
    }
}

impl Drop for Publisher {
    /// Closes the channel; the sockets' thread sends what it has and ends.
    fn drop(&mut self) {
        let (closed, _) = tokio::sync::mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.payloads, closed));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The events as runs ([the module docs](self)).
fn runs(events: &[KvBlockEvent]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for e in events {
        if let Some(last) = runs.last_mut() {
            let joins = last.kind == e.kind
                && last.tier == e.tier
                && match e.kind {
                    KvEventKind::Stored => {
                        last.adapter == e.adapter && e.parent == last.hashes.last().copied()
                    }
                    KvEventKind::Removed => true,
                    KvEventKind::Cleared => false,
                };
            if joins {
                last.hashes.push(e.hash);
                last.tokens.extend_from_slice(&e.tokens);
                continue;
            }
        }
        runs.push(Run {
            kind: e.kind,
            tier: e.tier,
            adapter: e.adapter,
            parent: e.parent,
            hashes: if e.kind == KvEventKind::Cleared {
                Vec::new()
            } else {
                vec![e.hash]
            },
            tokens: e.tokens.clone(),
        });
    }
    runs
}

/// The sockets' loop: binds, says so on `ready`, then publishes each payload and answers replay
/// requests until the payloads' channel closes.
async fn sockets(
    cfg: KvEventsConfig,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    ready: std::sync::mpsc::Sender<Result<(), StartError>>,
) {
    let mut publisher = zeromq::PubSocket::new();
    if let Err(e) = publisher.bind(&cfg.endpoint).await {
        let _ = ready.send(Err(StartError::KvEvents(format!(
            "--kv-events {}: {e}",
            cfg.endpoint
        ))));
        return;
    }
    let mut replay = match &cfg.replay {
        Some(at) => {
            let mut r = zeromq::RouterSocket::new();
            if let Err(e) = r.bind(at).await {
                let _ = ready.send(Err(StartError::KvEvents(format!(
                    "--kv-events-replay {at}: {e}"
                ))));
                return;
            }
            Some(r)
        }
        None => None,
    };
    let _ = ready.send(Ok(()));
    let topic = bytes::Bytes::from(cfg.topic.into_bytes());
    let mut kept: VecDeque<(u64, bytes::Bytes)> = VecDeque::new();
    let mut seq = 0u64;
    loop {
        tokio::select! {
            payload = rx.recv() => {
                let Some(payload) = payload else { return };
                let payload = bytes::Bytes::from(payload);
                let frames = vec![topic.clone(), seq_frame(seq), payload.clone()];
                if let Ok(m) = ZmqMessage::try_from(frames) {
                    let _ = publisher.send(m).await;
                }
                if kept.len() == REPLAY {
                    kept.pop_front();
                }
                kept.push_back((seq, payload));
                seq += 1;
            }
            request = recv(replay.as_mut()) => {
                if let (Some(r), Ok(m)) = (replay.as_mut(), request) {
                    answer(r, m, &kept).await;
                }
            }
        }
    }
}

fn seq_frame(seq: u64) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(&seq.to_be_bytes())
}

/// The next replay request, or never without a replay socket.
async fn recv(replay: Option<&mut zeromq::RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match replay {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// `[identity, "", start]`: every kept batch from `start` on, then the end marker.
async fn answer(r: &mut zeromq::RouterSocket, m: ZmqMessage, kept: &VecDeque<(u64, bytes::Bytes)>) {
    let frames = m.into_vec();
    let [id, _, start] = frames.as_slice() else {
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
        return;
    };
    let empty = bytes::Bytes::new();
    for (s, payload) in kept.iter().filter(|(s, _)| *s >= start) {
        let reply = vec![id.clone(), empty.clone(), seq_frame(*s), payload.clone()];
        if let Ok(m) = ZmqMessage::try_from(reply) {
            let _ = r.send(m).await;
        }
    }
    let end = bytes::Bytes::copy_from_slice(&(-1i64).to_be_bytes());
    if let Ok(m) = ZmqMessage::try_from(vec![id.clone(), empty.clone(), end, empty]) {
        let _ = r.send(m).await;
    }
}
