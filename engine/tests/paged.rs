//! The paged step is bit-identical to the reference (one request alone, whole prompt, contiguous
//! cache): logits and greedy tokens, however the prompt is chunked, whatever else is in the batch
//! and at which positions, wherever the pages are, with freed pages filled with NaN.

mod common;

use common::{assert_identical, prompts, reference, run_paged, Request};

const NEW: usize = 10;

#[test]
fn one_chunk_alone_equals_the_reference() {
    let Some(model) = common::model() else { return };
    let prompt = prompts(model).swap_remove(0);
    let want = reference(model, &prompt, NEW, None);
    let request = Request {
        prompt,
        chunk: usize::MAX,
        arrive: 0,
        max_new: NEW,
        adapter: None,
    };
    let got = run_paged(model, &[request], 16, 8, 7, None);
    assert_identical("one chunk", &got[0], &want);
}

/// The request under test prefilled in chunks of `chunk`, batched with three others that join at
/// other steps (so they are at other positions, some prefilling, some decoding).
fn chunked_in_a_batch(chunk: usize, tokens_per_block: usize, seed: u64) {
    let Some(model) = common::model() else { return };
    let prompts = prompts(model);
    let wants: Vec<_> = prompts
        .iter()
        .map(|p| reference(model, p, NEW, None))
        .collect();
    let others = [(usize::MAX, 0), (5, 3), (3, 9)];
    let mut requests = vec![Request {
        prompt: prompts[0].clone(),
        chunk,
        arrive: 1,
        max_new: NEW,
        adapter: None,
    }];
    for (p, &(chunk, arrive)) in prompts[1..].iter().zip(&others) {
        requests.push(Request {
            prompt: p.clone(),
            chunk,
            arrive,
            max_new: NEW,
            adapter: None,
        });
    }
    let pages =
        (prompts.iter().map(|p| p.len() + NEW).sum::<usize>() / tokens_per_block + 8) as u32;
    let got = run_paged(model, &requests, tokens_per_block, pages, seed, None);
    for (i, (g, w)) in got.iter().zip(&wants).enumerate() {
        assert_identical(&format!("chunk {chunk}, request {i}"), g, w);
    }
}

#[test]
fn chunks_of_1_in_a_batch_equal_the_reference() {
    chunked_in_a_batch(1, 16, 11);
}

#[test]
fn chunks_of_7_in_a_batch_equal_the_reference() {
    chunked_in_a_batch(7, 16, 12);
}

#[test]
fn chunks_of_16_in_a_batch_equal_the_reference() {
    chunked_in_a_batch(16, 16, 13);
}

#[test]
fn small_pages_and_odd_chunks_equal_the_reference() {
    chunked_in_a_batch(5, 4, 14);
}
