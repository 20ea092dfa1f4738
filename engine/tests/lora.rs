//! LoRA: a seeded rank-8 adapter on q, k, v and o, read by the step from an adapter store's device
//! pages, really changes the model's tokens, and a LoRA request is bit-identical paged and alone —
//! batched with a base request and a request on another adapter.

mod common;

use common::{assert_identical, prompts, reference, run_paged, Request};
use kvsched_engine::{HostAdapterStore, Lora, PageStore, PoolShape, Tier};

const NEW: usize = 10;
const PAGE: usize = 256 * 1024;

fn adapter(model: &kvsched_engine::Model, seed: u64) -> Lora {
    Lora::seeded(model.config(), 8, 16.0, 0.1, seed)
}

#[test]
fn an_adapter_changes_the_tokens_and_is_identical_paged() {
    let Some(model) = common::model() else { return };
    let (a, b) = (adapter(model, 1), adapter(model, 2));
    assert_eq!(Lora::from_bytes(model.config(), &a.to_bytes()).unwrap(), a);
    let pages = a.pages(PAGE);
    let mut store = HostAdapterStore::new(PoolShape::new(PAGE, 2 * pages as u32 + 2, 0)).unwrap();
    // Adapter A on device pages 1.., adapter B on the pages after it, in reverse order.
    let pages_a: Vec<u32> = (1..=pages as u32).collect();
    let pages_b: Vec<u32> = (pages as u32 + 1..=2 * pages as u32).rev().collect();
    a.write_pages(&mut store, Tier::Gpu, &pages_a).unwrap();
    b.write_pages(&mut store, Tier::Gpu, &pages_b).unwrap();
    assert_eq!(
        Lora::read_pages(model.config(), &store, Tier::Gpu, &pages_b, &mut Vec::new()).unwrap(),
        b
    );

    let prompts = prompts(model);
    let base = reference(model, &prompts[0], NEW, None);
    let want_a = reference(model, &prompts[0], NEW, Some(a.clone()));
    let want_b = reference(model, &prompts[1], NEW, Some(b.clone()));
    let want_plain = reference(model, &prompts[1], NEW, None);
    assert_ne!(
        want_a.tokens, base.tokens,
        "adapter A left the greedy tokens unchanged"
    );
    assert_ne!(
        want_b.tokens, want_plain.tokens,
        "adapter B left the greedy tokens unchanged"
    );

    let requests = [
        Request {
            prompt: prompts[0].clone(),
            chunk: 7,
            arrive: 0,
            max_new: NEW,
            adapter: Some(pages_a.clone()),
        },
        Request {
            prompt: prompts[0].clone(),
            chunk: usize::MAX,
            arrive: 2,
            max_new: NEW,
            adapter: None,
        },
        Request {
            prompt: prompts[1].clone(),
            chunk: 16,
            arrive: 1,
            max_new: NEW,
            adapter: Some(pages_b.clone()),
        },
        Request {
            prompt: prompts[1].clone(),
            chunk: 3,
            arrive: 4,
            max_new: NEW,
            adapter: Some(pages_b),
        },
    ];
    let got = run_paged(model, &requests, 16, 64, 21, Some(&store));
    assert_identical("adapter A, chunks of 7", &got[0], &want_a);
    assert_identical("base model beside adapters", &got[1], &base);
    assert_identical("adapter B, chunks of 16", &got[2], &want_b);
    assert_identical("adapter B shared, chunks of 3", &got[3], &want_b);
    let _ = store.shape();
}
