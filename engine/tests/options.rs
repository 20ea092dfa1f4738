//! What a request carries beyond its prompt (issue 43): a cache salt that keys the prefix cache, a
//! guide that masks tokens before each draw, log probabilities of the model's own distribution,
//! the prefix-cache hit it got, and the sampler's rules (penalties, min_tokens, stop tokens).

mod common;

use kvsched_engine::{
    Completion, Engine, EngineConfig, Finish, Guide, GuideError, Penalties, Sampler, SubmitOptions,
};

fn engine(model: &kvsched_engine::Model) -> Engine<'_> {
    let cfg = EngineConfig {
        tokens_per_block: 16,
        gpu_pages: 64,
        max_blocks: 16,
        prefix_cache: true,
        ..EngineConfig::default()
    };
    Engine::new(model, cfg).expect("an engine")
}

fn prompt(model: &kvsched_engine::Model) -> Vec<u32> {
    let text =
        "The history of the city begins with a small settlement on the river, where traders met";
    model.tokenizer().encode(text).expect("encode")
}

fn run(e: &mut Engine<'_>, p: &[u32], n: usize, s: Sampler, o: SubmitOptions) -> Completion {
    let id = e.submit_with(p, n, None, s, o).expect("submit");
    let done = e.run().expect("run");
    done.into_iter().find(|c| c.id == id).expect("finished")
}

fn salted(salt: u64) -> SubmitOptions {
    SubmitOptions {
        cache_salt: salt,
        guide: None,
        priority: 0,
        class: 0,
    }
}

#[test]
fn a_cache_salt_keys_the_prefix_cache() {
    let Some(model) = common::model() else { return };
    let mut e = engine(model);
    let p = prompt(model);
    let g = Sampler::greedy;
    assert_eq!(run(&mut e, &p, 2, g(), salted(0)).cached_tokens, 0);
    let again = run(&mut e, &p, 2, g(), salted(0));
    assert!(again.cached_tokens >= 16, "{}", again.cached_tokens);
    assert_eq!(
        run(&mut e, &p, 2, g(), salted(7)).cached_tokens,
        0,
        "another salt, no hit"
    );
    let seven = run(&mut e, &p, 2, g(), salted(7));
    assert_eq!(seven.cached_tokens, again.cached_tokens);
    assert_eq!(seven.tokens, again.tokens);
}

#[test]
fn greedy_logprobs_rank_the_drawn_token_first() {
    let Some(model) = common::model() else { return };
    let mut e = engine(model);
    let c = run(
        &mut e,
        &prompt(model),
        6,
        Sampler::greedy().with_logprobs(3),
        salted(0),
    );
    assert_eq!(c.logprobs.len(), c.tokens.len());
    for (lp, &t) in c.logprobs.iter().zip(&c.tokens) {
        assert_eq!(lp.token, t);
        assert_eq!(lp.top.len(), 3);
        assert_eq!(lp.top[0], (t, lp.logprob), "greedy draws the likeliest");
        assert!(lp.logprob <= 0.0 && lp.top[1].1 <= lp.top[0].1);
    }
    let plain = run(&mut e, &prompt(model), 6, Sampler::greedy(), salted(0));
    assert!(plain.logprobs.is_empty());
    assert_eq!(plain.tokens, c.tokens, "reporting changes nothing drawn");
}

/// A guide that allows only the tokens of a set.
struct Only(Vec<u32>, usize);

impl Guide for Only {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), GuideError> {
        for (t, l) in logits.iter_mut().enumerate() {
            if !self.0.contains(&(t as u32)) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<(), GuideError> {
        assert!(self.0.contains(&token), "only allowed tokens are drawn");
        self.1 += 1;
        Ok(())
    }
}

#[test]
fn a_guide_masks_every_draw() {
    let Some(model) = common::model() else { return };
    let mut e = engine(model);
    let tok = model.tokenizer();
    let allowed: Vec<u32> = [" yes", " no"]
        .iter()
        .map(|w| tok.encode_text(w).unwrap()[0])
        .collect();
    let o = SubmitOptions {
        cache_salt: 0,
        guide: Some(Box::new(Only(allowed.clone(), 0))),
        priority: 0,
        class: 0,
    };
    let c = run(&mut e, &prompt(model), 5, Sampler::seeded(3, 1.0), o);
    assert_eq!(c.tokens.len(), 5);
    assert!(
        c.tokens.iter().all(|t| allowed.contains(t)),
        "{:?}",
        c.tokens
    );
}

#[test]
fn stop_tokens_min_tokens_and_penalties_shape_the_output() {
    let Some(model) = common::model() else { return };
    let mut e = engine(model);
    let p = prompt(model);
    let free = run(&mut e, &p, 12, Sampler::greedy().ignoring_stop(), salted(0)).tokens;
    let stop_at = free[3];
    let first = free.iter().position(|&t| t == stop_at).unwrap();
    let stopped = run(
        &mut e,
        &p,
        12,
        Sampler::greedy()
            .ignoring_stop()
            .with_stop_tokens(vec![stop_at]),
        salted(0),
    );
    assert_eq!(
        (stopped.finish, &stopped.tokens[..]),
        (Finish::Stop, &free[..=first])
    );
    let late = Sampler::greedy()
        .with_stop_tokens(vec![stop_at])
        .with_min_tokens(first + 2);
    let late = run(&mut e, &p, 12, late, salted(0));
    assert!(
        !late.tokens[..first + 2].contains(&stop_at),
        "{:?}",
        late.tokens
    );
    let penalties = Penalties {
        frequency: 100.0,
        ..Penalties::NONE
    };
    let fresh = run(
        &mut e,
        &p,
        12,
        Sampler::greedy().ignoring_stop().with_penalties(penalties),
        salted(0),
    );
    let mut seen = fresh.tokens.clone();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(
        seen.len(),
        fresh.tokens.len(),
        "no token twice: {:?}",
        fresh.tokens
    );
}
