//! The tokenizer built from the GGUF metadata: exact round trips, no prefix space, digits one by
//! one, special tokens whole, and the ChatML template.

mod common;

use kvsched_engine::{Message, Tokenizer};

fn tokenizer() -> Option<Tokenizer> {
    let path = common::model_path()?;
    Some(Tokenizer::load(path).expect("the tokenizer loads"))
}

#[test]
fn round_trips_a_varied_text_exactly() {
    let Some(t) = tokenizer() else { return };
    let texts = [
        "system",
        " leading space, trailing space ",
        "Hello, world! It's 2024-06-01 and π ≈ 3.14159; 1234567890 items.",
        "fn main() {\n    println!(\"{}\", 42_u32.pow(2));\n}\n\n\t\ttabs\r\nCRLF",
        "naïve café, Ünïcödé, 日本語のテキスト, 🙂🚀 emoji, ﬁ ligature, \u{200b}zero width",
        "<|im_start|>user\nspecial tokens inside text<|im_end|>\n<|endoftext|>",
        "   multiple   spaces\n\n\nand newlines   ",
        "",
    ];
    for text in texts {
        let ids = t.encode(text).unwrap();
        assert_eq!(
            t.decode(&ids).unwrap(),
            text,
            "round trip of {text:?} ({ids:?})"
        );
    }
}

#[test]
fn no_prefix_space_and_digits_one_by_one() {
    let Some(t) = tokenizer() else { return };
    let ids = t.encode("system").unwrap();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(t.token(ids[0]), Some("system"));
    assert_eq!(t.token_id("system"), Some(ids[0]));
    assert_ne!(t.token_id("Ġsystem"), Some(ids[0]));
    let digits = t.encode("2024").unwrap();
    let spelled: Vec<&str> = digits.iter().map(|&i| t.token(i).unwrap()).collect();
    assert_eq!(spelled, ["2", "0", "2", "4"]);
    let spaced = t.encode(" system").unwrap();
    assert_eq!(t.token(spaced[0]), Some("Ġsystem"));
}

#[test]
fn special_tokens_and_the_chat_template() {
    let Some(t) = tokenizer() else { return };
    let start = t.token_id("<|im_start|>").unwrap();
    let end = t.token_id("<|im_end|>").unwrap();
    assert_eq!(t.eos(), end);
    assert!(t.is_stop(end) && t.is_stop(t.token_id("<|endoftext|>").unwrap()));
    assert!(t.special_tokens().contains(&start));
    assert_eq!(t.encode("<|im_start|>").unwrap(), [start]);
    let text = t.render_chat(&[Message::user("Hi")], true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let own = [Message::system("Be brief."), Message::user("Hi")];
    let text = t.render_chat(&own, false).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
    let ids = t.encode_chat(&own, true).unwrap();
    assert_eq!(ids[0], start);
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 3);
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 2);
    assert_eq!(t.decode(&ids).unwrap(), t.render_chat(&own, true).unwrap());
}

/// Each token's bytes (what a grammar engine matches tokens against) spell the text its tokens
/// encode, on both tokenizer kinds (byte-level BPE and SentencePiece); a control token has none.
#[test]
fn token_bytes_spell_the_text() {
    let paths = [common::model_path(), common::gemma3_path()];
    for path in paths.into_iter().flatten() {
        let t = Tokenizer::load(&path).expect("the tokenizer loads");
        let bytes = t.token_bytes();
        assert_eq!(bytes.len(), t.vocab_size());
        for text in [
            "Hello, world! It's 2024-06-01 and π ≈ 3.14159;\n\n\tindented {\"a\": [1, 2]}",
            "naïve café, 日本語のテキスト, 🙂🚀 emoji",
        ] {
            let ids = t.encode_text(text).unwrap();
            let spelled: Vec<u8> = ids
                .iter()
                .flat_map(|&id| bytes[id as usize].clone().expect("a text token"))
                .collect();
            assert_eq!(
                String::from_utf8_lossy(&spelled),
                text,
                "{}: {ids:?}",
                path.display()
            );
        }
        for &s in t.special_tokens() {
            assert!(bytes[s as usize].is_none(), "control token {s}");
        }
    }
}

/// Hugging Face's `tokenizer.json` of the tokenizer (what a frontend such as Dynamo's reads), loaded
/// back by the `tokenizers` library, gives the same ids for text with special tokens in it, and
/// decodes them back; SmolLM2's byte-level BPE and Gemma 3's SentencePiece alike.
#[test]
fn the_hugging_face_json_tokenizes_as_the_engine_does() {
    let files = [common::model_path(), common::gemma3_path()];
    for path in files.into_iter().flatten() {
        let t = Tokenizer::load(&path).expect("the tokenizer loads");
        let json = t.to_hf_json().expect("serialized");
        let hf: tokenizers::Tokenizer = json.parse().expect("tokenizers reads it back");
        for text in [
            "Hello, world! It's 2024-06-01 and π ≈ 3.14159; 1234567890 items.",
            "<|im_start|>user\nnaïve café 🙂<|im_end|>\n<start_of_turn>model\n",
            "   multiple   spaces\n\n\nand newlines\t\ttabs ",
        ] {
            let want = t.encode_text(text).unwrap();
            let got = hf.encode(text, false).expect("encodes").get_ids().to_vec();
            assert_eq!(got, want, "{text:?} in {}", path.display());
            assert_eq!(hf.decode(&got, false).unwrap(), t.decode(&want).unwrap());
        }
    }
}
