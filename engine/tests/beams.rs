//! Beam search on forks (issue 44, `Engine::submit_beam_search`) against a reference beam search
//! that runs each beam as its own request on [`Reference`] (one request alone, whole sequence,
//! contiguous cache) and ranks as vLLM ranks: every sequence, token and cumulative log probability
//! (bit for bit) the same, on a roomy pool and on tiny pools that suspend and recompute beams. Free
//! pages are NaN after every step, so a beam reading a page a sibling gave up shows up.

mod common;

use kvsched_engine::{
    argmax, BeamResult, BeamSearch, Engine, EngineConfig, EngineStats, Finish, Message, Model,
    Reference, Sampler, SchedulerConfig,
};

const TPB: u32 = 8;
const WIDTH: usize = 4;
const NEW: usize = 12;

fn config(gpu_pages: u32, host_pages: u32) -> EngineConfig {
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_requests: 16,
            max_num_tokens: Some(64),
            ..EngineConfig::default().scheduler
        },
        tokens_per_block: TPB,
        gpu_pages,
        host_pages,
        max_blocks: 64,
        prefix_cache: true,
        poison: true,
        ..EngineConfig::default()
    }
}

fn prompt(model: &Model, q: &str) -> Vec<u32> {
    let m = [Message::user(q)];
    model.tokenizer().encode_chat(&m, true).unwrap()
}

/// The reference: each step every beam is run alone from its first token; its `2 × width`
/// likeliest next tokens are its candidates; vLLM's ranking. Returns (tokens generated without a
/// final stop token, cumulative log probability, ended by a stop token), best first.
fn reference(model: &Model, prompt: &[u32], p: BeamSearch) -> Vec<(Vec<u32>, f64, bool)> {
    let tok = model.tokenizer();
    let lp = Sampler::greedy().with_logprobs(2 * p.width);
    let score = |t: &[u32], cum: f64| {
        // vLLM leaves a last stop token out of the length, ignore_eos or not.
        let stop = t.last().is_some_and(|&x| tok.is_stop(x));
        cum / ((t.len() - usize::from(stop)) as f64).powf(p.length_penalty)
    };
    let (mut beams, mut done) = (vec![(prompt.to_vec(), 0.0f64)], Vec::new());
    for _ in 0..NEW {
        let mut next = Vec::new();
        for (tokens, cum) in &beams {
            let logits = Reference::new(model, tokens.len() + 1, None)
                .feed(tokens)
                .unwrap();
            for (t, l) in lp.logprob(&logits, argmax(&logits)).unwrap().top {
                let mut seq = tokens.clone();
                seq.push(t);
                let c = cum + f64::from(l);
                if tok.is_stop(t) && !p.ignore_eos {
                    done.push((seq, c));
                } else {
                    next.push((seq, c));
                }
            }
        }
        next.sort_by(|a, b| score(&b.0, b.1).total_cmp(&score(&a.0, a.1)));
        next.truncate(p.width);
        beams = next;
        if beams.is_empty() {
            break;
        }
    }
    done.extend(beams);
    done.sort_by(|a, b| score(&b.0, b.1).total_cmp(&score(&a.0, a.1)));
    done.truncate(p.width);
    done.into_iter()
        .map(|(mut t, c)| {
            let stop = !p.ignore_eos && t.last().is_some_and(|&x| tok.is_stop(x));
            if stop {
                t.pop();
            }
            (t.split_off(prompt.len()), c, stop)
        })
        .collect()
}

const QUESTIONS: [&str; 2] = [
    "Complete the sentence: the best thing about the sea is",
    "Name the capital of Italy.",
];

fn check(model: &Model, what: &str, engine: &mut Engine<'_>) -> EngineStats {
    let params = BeamSearch {
        width: WIDTH,
        length_penalty: 1.0,
        ignore_eos: false,
        priority: 0,
        class: 0,
    };
    let prompts: Vec<Vec<u32>> = QUESTIONS.iter().map(|q| prompt(model, q)).collect();
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| engine.submit_beam_search(p, NEW, None, params, 0).unwrap())
        .collect();
    let mut results: Vec<BeamResult> = Vec::new();
    while !engine.is_empty() {
        engine.step().unwrap();
        results.extend(engine.take_beam_results());
    }
    results.extend(engine.take_beam_results());
    assert_eq!(results.len(), prompts.len(), "{what}: every search ended");
    for (q, p) in prompts.iter().enumerate() {
        let got = results.iter().find(|r| r.id == ids[q]).unwrap();
        let want = reference(model, p, params);
        assert_eq!(got.sequences.len(), want.len(), "{what}: question {q}");
        for (k, (g, w)) in got.sequences.iter().zip(&want).enumerate() {
            assert_eq!(g.tokens, w.0, "{what}: question {q}, sequence {k}: tokens");
            assert_eq!(
                g.cum_logprob.to_bits(),
                w.1.to_bits(),
                "{what}: q {q} seq {k}: log prob"
            );
            assert_eq!(
                g.finish == Finish::Stop,
                w.2,
                "{what}: q {q} seq {k}: finish"
            );
        }
    }
    let s = engine.stats();
    eprintln!(
        "{what}: {} forks sharing {} positions, {} beams parked, {} suspensions ({} pages \
         offloaded, {} reloaded), {} recomputes, {} steps",
        s.forks,
        s.fork_shared_tokens,
        s.beams_parked,
        s.suspensions,
        s.pages_offloaded,
        s.pages_reloaded,
        s.recomputes,
        s.model_steps
    );
    assert!(s.forks > 0, "{what}: beams are forked");
    s
}

#[test]
fn width_4_equals_the_reference_on_a_roomy_pool() {
    let Some(model) = common::model() else { return };
    let mut e = Engine::new(model, config(256, 0)).unwrap();
    check(model, "roomy", &mut e);
}

#[test]
fn width_4_equals_the_reference_with_beams_suspended_and_resumed() {
    let Some(model) = common::model() else { return };
    let mut e = Engine::new(model, config(14, 96)).unwrap();
    let s = check(model, "tiny pool, host tier", &mut e);
    assert!(
        s.pages_offloaded > 0,
        "beams are suspended to the host tier"
    );
}

#[test]
fn width_4_equals_the_reference_with_beams_recomputed() {
    let Some(model) = common::model() else { return };
    let mut e = Engine::new(model, config(14, 0)).unwrap();
    let s = check(model, "tiny pool, no host tier", &mut e);
    assert!(s.recomputes > 0, "beams are recompute-paused");
}

#[test]
fn a_cancelled_search_leaves_nothing() {
    let Some(model) = common::model() else { return };
    let mut e = Engine::new(model, config(256, 0)).unwrap();
    let p = prompt(model, QUESTIONS[0]);
    let params = BeamSearch {
        width: WIDTH,
        length_penalty: 1.0,
        ignore_eos: false,
        priority: 0,
        class: 0,
    };
    let id = e.submit_beam_search(&p, NEW, None, params, 0).unwrap();
    for _ in 0..4 {
        e.step().unwrap();
    }
    assert!(e.len() > 1, "beams forked");
    assert!(e.cancel(id).unwrap());
    assert!(e.is_empty());
    assert!(e.take_beam_results().is_empty());
    let wide = BeamSearch {
        width: 17,
        ..params
    };
    assert!(
        e.submit_beam_search(&p, NEW, None, wide, 0).is_err(),
        "wider than the scheduler"
    );
}
