//! Dynamo's preprocessed request as an engine request (`kvsched_dynamo::request::plan`): limits
//! refused by their field, `max_tokens` clamped to the context left, what is not served refused.

use dynamo_backend_common::{OutputOptions, PreprocessedRequest, SamplingOptions, StopConditions};
use kvsched_dynamo::request::{plan, Limits};

const LIMITS: Limits = Limits {
    max_model_len: 64,
    vocab: 100,
};

fn request(
    prompt: Vec<u32>,
    stop: StopConditions,
    sampling: SamplingOptions,
) -> PreprocessedRequest {
    PreprocessedRequest::builder()
        .model("m".to_string())
        .token_ids(prompt)
        .stop_conditions(stop)
        .sampling_options(sampling)
        .output_options(OutputOptions::default())
        .build()
        .expect("a request")
}

fn max_tokens(n: Option<u32>) -> StopConditions {
    StopConditions {
        max_tokens: n,
        ..StopConditions::default()
    }
}

/// The refusal's message for `r`.
fn refusal(r: &PreprocessedRequest) -> String {
    plan(r.clone(), LIMITS, 1).expect_err("refused").to_string()
}

#[test]
fn max_tokens_is_clamped_to_the_context_left() {
    let ten = vec![5; 10];
    let cases = [(Some(8), 8), (Some(54), 54), (Some(10_000), 54), (None, 54)];
    for (asked, got) in cases {
        let r = request(ten.clone(), max_tokens(asked), SamplingOptions::default());
        assert_eq!(
            plan(r, LIMITS, 1).expect("planned").max_new,
            got,
            "{asked:?}"
        );
    }
}

#[test]
fn limits_are_refused_by_their_field() {
    let none = SamplingOptions::default;
    let cases = [
        (request(vec![], max_tokens(None), none()), "token_ids"),
        (
            request(vec![5, 100], max_tokens(None), none()),
            "token_ids: token 100",
        ),
        (
            request(vec![5; 64], max_tokens(None), none()),
            "max_model_len",
        ),
        (request(vec![5], max_tokens(Some(0)), none()), "max_tokens"),
    ];
    for (r, field) in cases {
        let why = refusal(&r);
        assert!(why.contains(field), "{why} does not name {field}");
    }
    let stop = StopConditions {
        stop_token_ids_hidden: Some(vec![200]),
        ..StopConditions::default()
    };
    assert!(refusal(&request(vec![5], stop, none())).contains("stop_token_ids"));
    let hot = SamplingOptions {
        temperature: Some(f32::NAN),
        ..SamplingOptions::default()
    };
    assert!(refusal(&request(vec![5], max_tokens(None), hot)).contains("temperature"));
}

#[test]
fn what_is_not_served_is_refused_by_name() {
    let cases = [
        (
            SamplingOptions {
                n: Some(2),
                ..SamplingOptions::default()
            },
            "n / best_of",
        ),
        (
            SamplingOptions {
                use_beam_search: Some(true),
                ..SamplingOptions::default()
            },
            "use_beam_search",
        ),
    ];
    for (sampling, field) in cases {
        let why = refusal(&request(vec![5], max_tokens(None), sampling));
        assert!(why.contains(field), "{why} does not name {field}");
    }
}

#[test]
fn stop_tokens_and_the_cache_salt_reach_the_plan() {
    let stop = StopConditions {
        stop_token_ids: Some(vec![7]),
        ..StopConditions::default()
    };
    let r = request(vec![5, 6], stop, SamplingOptions::default());
    let p = plan(r, LIMITS, 1).expect("planned");
    assert_eq!((p.prompt, p.cache_salt), (vec![5, 6], 0));
    assert!(p.sampler.is_greedy());
    assert!(
        p.sampler.ends_at(7, |_| false),
        "the request's stop token ends it"
    );
    assert!(!p.sampler.ends_at(8, |_| false));
}
