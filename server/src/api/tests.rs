//! The request parser's tests.

use super::*;

fn refused(endpoint: Endpoint, body: &str) -> ApiError {
    parse(endpoint, body.as_bytes()).expect_err(body)
}

#[test]
fn a_completion_request_reads_every_field() {
    let r = parse(
        Endpoint::Completions,
        br#"{"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,
             "seed":-1,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},
             "n":1,"logprobs":null,"ignore_eos":true}"#,
    )
    .unwrap();
    assert_eq!(r.prompt, Prompt::Text("hi".into()));
    assert_eq!(
        (r.max_tokens, r.sampling.temperature, r.sampling.top_p),
        (Some(5), 0.0, 0.5)
    );
    assert_eq!(r.sampling.seed, Some(u64::MAX));
    assert_eq!(r.stop, ["a", "b"]);
    assert!(r.stream && r.include_usage && r.sampling.ignore_eos);
}

#[test]
fn chat_content_parts_and_token_prompts_are_read() {
    let r = parse(
        Endpoint::Chat,
        br#"{"model":"m","messages":[{"role":"developer","content":"be brief"},
             {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
             "max_completion_tokens":3}"#,
    )
    .unwrap();
    assert_eq!(
        r.prompt,
        Prompt::Chat(vec![Message::system("be brief"), Message::user("ab")])
    );
    assert_eq!(r.max_tokens, Some(3));
    let t = parse(
        Endpoint::Completions,
        br#"{"model":"m","prompt":[[1,2,3]]}"#,
    )
    .unwrap();
    assert_eq!(t.prompt, Prompt::Tokens(vec![1, 2, 3]));
}

/// An integer too large for `i64` was refused as "not an integer" (issue 43); it is a count, and a
/// number with no fraction is one too.
#[test]
fn a_count_of_any_size_is_a_count() {
    let max_tokens = |v: &str| {
        let body = format!(r#"{{"model":"m","prompt":"x","max_tokens":{v}}}"#);
        parse(Endpoint::Completions, body.as_bytes()).map(|r| r.max_tokens)
    };
    assert_eq!(max_tokens("100000000000000000000"), Ok(Some(usize::MAX)));
    assert_eq!(max_tokens("18446744073709551615"), Ok(Some(usize::MAX)));
    assert_eq!(max_tokens("5.0"), Ok(Some(5)));
    let code = |v: &str| max_tokens(v).expect_err(v).code;
    assert_eq!(code("-100000000000000000000"), "invalid_value");
    assert_eq!(code("5.5"), "invalid_type");
}

#[test]
fn each_bad_field_is_named() {
    let cases: &[(Endpoint, &str, Option<&str>, &str)] = &[
        (Endpoint::Completions, "{", None, "invalid_json"),
        (Endpoint::Completions, "[1]", None, "invalid_type"),
        (
            Endpoint::Completions,
            r#"{"model":"m"}"#,
            Some("prompt"),
            "missing_field",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt":"x"}"#,
            Some("model"),
            "missing_field",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","max_tokens":0}"#,
            Some("max_tokens"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","max_tokens":"5"}"#,
            Some("max_tokens"),
            "invalid_type",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","temperature":3}"#,
            Some("temperature"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","top_p":0}"#,
            Some("top_p"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","use_beam_search":true,"stream":true}"#,
            Some("stream"),
            "unsupported_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","length_penalty":0.5}"#,
            Some("length_penalty"),
            "unsupported_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","n":3,"best_of":2}"#,
            Some("best_of"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","n":2,"best_of":3,"stream":true}"#,
            Some("best_of"),
            "unsupported_value",
        ),
        (
            Endpoint::Chat,
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":0}"#,
            Some("n"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":["a","b"]}"#,
            Some("prompt"),
            "unsupported_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":7}"#,
            Some("prompt"),
            "invalid_type",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","stop":["a","b","c","d","e"]}"#,
            Some("stop"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","stream_options":{"include_usage":true}}"#,
            Some("stream_options"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","stream":true,"stream_options":{"x":1}}"#,
            Some("stream_options.x"),
            "unknown_field",
        ),
        (
            Endpoint::Chat,
            r#"{"model":"m","messages":[]}"#,
            Some("messages"),
            "invalid_type",
        ),
        (
            Endpoint::Chat,
            r#"{"model":"m","messages":[{"role":"robot","content":"x"}]}"#,
            Some("messages[0].role"),
            "invalid_value",
        ),
        (
            Endpoint::Chat,
            r#"{"model":"m","messages":[{"role":"user","content":"x","extra":1}]}"#,
            Some("messages[0].extra"),
            "unknown_field",
        ),
        (
            Endpoint::Chat,
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}]}"#,
            Some("tools"),
            "unsupported_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","top_k":-2}"#,
            Some("top_k"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","logit_bias":{"a":1}}"#,
            Some("logit_bias"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","max_tokens":2,"min_tokens":3}"#,
            Some("min_tokens"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","logprobs":21}"#,
            Some("logprobs"),
            "invalid_value",
        ),
        (
            Endpoint::Chat,
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#,
            Some("top_logprobs"),
            "invalid_value",
        ),
        (
            Endpoint::Chat,
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"guided_regex":"a","guided_choice":["a"]}"#,
            Some("guided_choice"),
            "invalid_value",
        ),
        (
            Endpoint::Chat,
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}}"#,
            Some("response_format"),
            "invalid_value",
        ),
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"x","prompt_logprobs":1}"#,
            Some("prompt_logprobs"),
            "unsupported_value",
        ),
    ];
    for &(endpoint, body, param, code) in cases {
        let e = refused(endpoint, body);
        assert_eq!((e.param.as_deref(), e.code), (param, code), "{body}: {e:?}");
        assert_eq!(e.status, 400);
    }
}

/// A role "tool" message was refused as an unknown field, and an SDK's own fields (`store`,
/// `metadata`) with it (issue 43); vLLM takes the first and ignores the others with a warning.
#[test]
fn a_tool_message_is_read_and_unknown_fields_are_ignored_by_name() {
    let r = parse(
        Endpoint::Chat,
        br#"{"model":"m","messages":[{"role":"user","content":"x"},
             {"role":"assistant","content":null,"tool_calls":[]},
             {"role":"tool","content":"42","tool_call_id":"c1"}],
             "store":false,"metadata":{"a":"b"},"service_tier":"auto"}"#,
    )
    .unwrap();
    assert_eq!(r.ignored, ["metadata", "service_tier", "store"]);
    let Prompt::Chat(m) = r.prompt else { panic!() };
    assert_eq!(m[2], Message::new("tool", "42"));
}

#[test]
fn the_sampling_and_output_fields_are_read() {
    let r = parse(
        Endpoint::Chat,
        br#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_k":-1,"min_p":0.1,
             "presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.2,
             "logit_bias":{"7":-100},"min_tokens":2,"stop_token_ids":[5,6],"logprobs":true,
             "top_logprobs":3,"cache_salt":"tenant-a","stream":true,
             "stream_options":{"include_usage":true,"continuous_usage_stats":true},
             "response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"object"}}}}"#,
    )
    .unwrap();
    let s = &r.sampling;
    assert_eq!((s.top_k, s.min_p, s.min_tokens), (0, 0.1, 2));
    assert_eq!(s.penalties, [0.5, -0.5, 1.2]);
    assert_eq!(
        (&s.logit_bias[..], &s.stop_token_ids[..]),
        (&[(7, -100.0)][..], &[5, 6][..])
    );
    assert_eq!(
        (r.logprobs, r.cache_salt.as_deref()),
        (Some(3), Some("tenant-a"))
    );
    assert!(r.include_usage && r.continuous_usage);
    assert_eq!(
        r.format,
        Some(Format::JsonSchema(serde_json::json!({"type": "object"})))
    );
    let c = parse(
        Endpoint::Completions,
        br#"{"model":"m","prompt":"x","logprobs":2,"guided_choice":["yes","no"]}"#,
    )
    .unwrap();
    assert_eq!(c.logprobs, Some(2));
    assert_eq!(
        c.format,
        Some(Format::Choice(vec!["yes".into(), "no".into()]))
    );
}
