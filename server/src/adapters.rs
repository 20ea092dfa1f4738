//! The adapters a server serves, by name: those given at start and those loaded since
//! (`POST /v1/load_lora_adapter`), each with the count of admitted requests on it. A request holds
//! its adapter ([`Held`]) from its check to its end, so an unload (`POST /v1/unload_lora_adapter`)
//! with any request on the adapter, running or waiting, is refused: never pulled from under them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::ApiError;

/// Names, engine ids and holds.
#[derive(Debug, Default)]
struct Inner {
    /// Served adapters: name and engine id, in the order they came.
    names: Vec<(String, u64)>,
    /// Requests admitted on each engine id and not ended.
    held: HashMap<u64, usize>,
    /// The next engine id to give.
    next: u64,
}

/// The served adapters (see the module).
#[derive(Debug, Default)]
pub struct Adapters {
    inner: Mutex<Inner>,
}

/// A request's hold on its adapter, given back when dropped.
#[derive(Debug)]
pub struct Held {
    adapters: Arc<Adapters>,
    /// The adapter's engine id.
    pub id: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut inner = self.adapters.lock();
        if let Some(n) = inner.held.get_mut(&self.id) {
            *n -= 1;
        }
    }
}

impl Adapters {
    /// The adapters given at start: names and engine ids.
    pub fn new(names: Vec<(String, u64)>) -> Self {
        let next = names.iter().map(|&(_, id)| id + 1).max().unwrap_or(1);
        Self {
            inner: Mutex::new(Inner {
                names,
                held: HashMap::new(),
                next,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The served names, in order.
    pub fn names(&self) -> Vec<String> {
        self.lock().names.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Whether `name` is served.
    pub fn contains(&self, name: &str) -> bool {
        self.lock().names.iter().any(|(n, _)| n == name)
    }

    /// A hold on adapter `name` for one request, if it is served.
    pub fn hold(self: &Arc<Self>, name: &str) -> Option<Held> {
        let mut inner = self.lock();
        let id = inner.names.iter().find(|(n, _)| n == name)?.1;
        *inner.held.entry(id).or_default() += 1;
        Some(Held {
            adapters: Arc::clone(self),
            id,
        })
    }

    /// An engine id for a new adapter `name`; refused (400) when the name is served already.
    pub fn reserve(&self, name: &str) -> Result<u64, ApiError> {
        let mut inner = self.lock();
        if inner.names.iter().any(|(n, _)| n == name) {
            return Err(already(name));
        }
        inner.next += 1;
        Ok(inner.next - 1)
    }

    /// Serves `name` as engine id `id` from now on (its weights registered).
    pub fn add(&self, name: &str, id: u64) -> Result<(), ApiError> {
        let mut inner = self.lock();
        if inner.names.iter().any(|(n, _)| n == name) {
            return Err(already(name));
        }
        inner.names.push((name.to_string(), id));
        Ok(())
    }

    /// Stops serving `name` and returns its engine id; refused, changing nothing, when it is not
    /// served (404) or any request holds it (409).
    pub fn remove_idle(&self, name: &str) -> Result<u64, ApiError> {
        let mut inner = self.lock();
        let at = inner
            .names
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| ApiError::unknown_model(name))?;
        let id = inner.names[at].1;
        let holds = inner.held.get(&id).copied().unwrap_or(0);
        if holds > 0 {
            return Err(ApiError::adapter_busy(name, holds));
        }
        inner.names.remove(at);
        inner.held.remove(&id);
        Ok(id)
    }
}

fn already(name: &str) -> ApiError {
    ApiError::invalid(
        "lora_name",
        "invalid_value",
        format!("The LoRA adapter '{name}' has already been loaded."),
    )
}
