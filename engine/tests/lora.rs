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

/// Adapters registered and retired while the engine runs: a retired adapter's slot serves the next
/// one (more adapters over the engine's life than it has slots), each request's tokens equal the
/// reference's on its adapter; an adapter a request holds cannot be retired (issue 43).
#[test]
fn adapters_are_registered_and_retired_while_the_engine_runs() {
    use kvsched_engine::{Engine, EngineConfig, Sampler, MAX_ADAPTERS};
    let Some(model) = common::model() else { return };
    let mut engine = Engine::new(model, EngineConfig::default()).unwrap();
    let prompt = &prompts(model)[0];
    let total = MAX_ADAPTERS as u64 + 3;
    for id in 1..=total {
        let lora = adapter(model, 100 + id);
        if id > MAX_ADAPTERS as u64 {
            assert!(
                engine.register_adapter(id, &lora).is_err(),
                "the table is full"
            );
            engine.unregister_adapter(id - MAX_ADAPTERS as u64).unwrap();
        }
        engine.register_adapter(id, &lora).unwrap();
        let want = reference(model, prompt, 4, Some(lora)).tokens;
        let sub = engine
            .submit(prompt, 4, Some(id), Sampler::greedy())
            .unwrap();
        assert!(engine.unregister_adapter(id).is_err(), "held by a request");
        let done = engine.run().unwrap();
        let got = &done.iter().find(|c| c.id == sub).unwrap().tokens;
        assert_eq!(got, &want, "adapter {id}");
    }
    assert!(engine.unregister_adapter(1).is_err(), "retired already");
    assert!(engine
        .submit(prompt, 4, Some(1), Sampler::greedy())
        .is_err());
}
