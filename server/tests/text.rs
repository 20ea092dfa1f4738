//! The streamed text on the test model's tokenizer: characters split across byte-level tokens are
//! never sent half; a stop string split across tokens is found and nothing from it is sent; the
//! pieces always add up to the text of the whole.

#[path = "support/serve.rs"]
mod serve;

use kvsched_server::text::TextStream;

/// Pushes `tokens` one at a time; returns the pieces and whether a stop string ended them.
fn pieces(
    stream: &mut TextStream,
    tok: &kvsched_engine::Tokenizer,
    tokens: &[u32],
) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        let p = stream.push(tok, &[t], i + 1 == tokens.len()).unwrap();
        out.push(p.text);
        if p.stopped {
            return (out, true);
        }
    }
    (out, false)
}

#[test]
fn split_characters_are_held_until_whole() {
    let Some(m) = serve::model() else { return };
    let tok = m.tokenizer();
    let text = "Un café, 日本語 et 🎉 fin.";
    let tokens = tok.encode(text).unwrap();
    assert!(tokens.len() > text.chars().count() / 2);
    let (got, stopped) = pieces(&mut TextStream::new(Vec::new()), tok, &tokens);
    assert!(!stopped);
    assert!(got.iter().all(|p| !p.contains('\u{FFFD}')), "{got:?}");
    assert!(
        tokens
            .iter()
            .any(|&t| tok.decode(&[t]).unwrap().contains('\u{FFFD}')),
        "some token holds part of a character (else this test proves nothing)"
    );
    assert_eq!(got.concat(), text);
}

#[test]
fn a_stop_string_across_tokens_ends_the_text_before_it() {
    let Some(m) = serve::model() else { return };
    let tok = m.tokenizer();
    let text = "alpha beta gamma delta epsilon";
    let tokens = tok.encode(text).unwrap();
    for stop in ["a gam", "delta", "epsilon", " beta"] {
        let mut s = TextStream::new(vec!["zzz".into(), stop.into()]);
        let (got, stopped) = pieces(&mut s, tok, &tokens);
        assert!(stopped, "{stop:?}");
        assert_eq!(
            got.concat(),
            &text[..text.find(stop).unwrap()],
            "{stop:?}: {got:?}"
        );
        let after = s.push(tok, &tokens[..1], true).unwrap();
        assert!(after.stopped && after.text.is_empty());
    }
    let (got, stopped) = pieces(&mut TextStream::new(vec!["omega".into()]), tok, &tokens);
    assert_eq!(
        (got.concat().as_str(), stopped),
        (text, false),
        "an absent stop string holds nothing back at the end"
    );
    let special = tok.special_tokens()[0];
    let p = TextStream::new(Vec::new())
        .push(tok, &[special], true)
        .unwrap();
    assert_eq!(p.text, "", "special tokens are not text");
}
