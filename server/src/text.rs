//! A request's text as its tokens arrive: the part that is safe to send now (no half of a UTF-8
//! character, nothing that may turn out to begin a stop string), and where a stop string ends it.
//!
//! Special tokens (the model's stop tokens, chat markers) are left out of the text, as vLLM's
//! `skip_special_tokens` does. Stop strings are matched over the whole text, so one split across
//! tokens is found, and the text ends before it (the stop string is not sent). While streaming, the
//! last `longest stop − 1` bytes are held back until the next token shows they are not the start of
//! a stop string, so the streamed text is always exactly the non-streamed one.

use kvsched_engine::{Result, Tokenizer};

/// The text of one request's tokens.
#[derive(Debug, Clone)]
pub struct TextStream {
    /// The tokens that make text (special tokens left out).
    body: Vec<u32>,
    /// The text of `body[..read]`: no half character in it (but at the end).
    text: String,
    /// Where the tokens decoded again for context begin, and where the new ones begin (vLLM's
    /// incremental detokenizer: each push decodes a few tokens, not the whole body).
    prefix: usize,
    read: usize,
    /// Bytes of the text sent so far.
    sent: usize,
    stops: Vec<String>,
    /// Bytes held back while streaming (the longest stop string's length minus one).
    hold: usize,
    stopped: bool,
    /// The stop string that ended the text.
    hit: Option<usize>,
}

/// What [`TextStream::push`] released.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Piece {
    /// Text to send now (may be empty).
    pub text: String,
    /// A stop string was generated: the text ended before it, and the request is over.
    pub stopped: bool,
}

impl TextStream {
    /// A stream ending at the first of `stops`.
    pub fn new(stops: Vec<String>) -> Self {
        let hold = stops.iter().map(String::len).max().unwrap_or(1) - 1;
        Self {
            body: Vec::new(),
            text: String::new(),
            prefix: 0,
            read: 0,
            sent: 0,
            stops,
            hold,
            stopped: false,
            hit: None,
        }
    }

    /// The stop string that ended the text, once one did.
    pub fn stop_hit(&self) -> Option<&str> {
        self.hit.map(|i| self.stops[i].as_str())
    }

    /// Adds `tokens` (generated, in order); `last` when no more will come. Returns the text that
    /// can be sent now. After a stop string nothing more is released.
    pub fn push(&mut self, tok: &Tokenizer, tokens: &[u32], last: bool) -> Result<Piece> {
        if self.stopped {
            return Ok(Piece {
                text: String::new(),
                stopped: true,
            });
        }
        let special = tok.special_tokens();
        self.body
            .extend(tokens.iter().filter(|t| special.binary_search(t).is_err()));
        self.decode_new(tok, last)?;
        if let Some((at, which)) = self.first_stop() {
            self.stopped = true;
            self.hit = Some(which);
            let text = self.text.get(self.sent..at).unwrap_or_default().to_string();
            self.sent = at;
            return Ok(Piece {
                text,
                stopped: true,
            });
        }
        let mut end = self.text.len();
        if !last {
            end = end.saturating_sub(self.hold);
            while !self.text.is_char_boundary(end) {
                end -= 1;
            }
        }
        let text = self
            .text
            .get(self.sent..end.max(self.sent))
            .unwrap_or_default()
            .to_string();
        self.sent = end.max(self.sent);
        Ok(Piece {
            text,
            stopped: false,
        })
    }

    /// Appends the text of the tokens past `read`, decoded after the few before them (a decoder's
    /// output may depend on its context). A character split across tokens decodes as U+FFFD until its
    /// last byte arrives: until then (or the end) nothing is appended.
    fn decode_new(&mut self, tok: &Tokenizer, last: bool) -> Result<()> {
        if self.read == self.body.len() {
            return Ok(());
        }
        let before = tok.decode(&self.body[self.prefix..self.read])?;
        let after = tok.decode(&self.body[self.prefix..])?;
        if !last && (after.len() <= before.len() || after.ends_with('\u{FFFD}')) {
            return Ok(());
        }
        match after.strip_prefix(before.as_str()) {
            Some(new) => self.text.push_str(new),
            // A decoder that rewrote the context: the whole text again (rare; never for byte-level
            // BPE or SentencePiece's byte fallback).
            None => self.text = tok.decode(&self.body)?,
        }
        (self.prefix, self.read) = (self.read, self.body.len());
        Ok(())
    }

    /// Where the first stop string begins in the text, and which it is, if one is there.
    fn first_stop(&self) -> Option<(usize, usize)> {
        let full = self.text.as_str();
        let from = self.sent.saturating_sub(self.hold).min(full.len());
        let from = (0..=from).rev().find(|&i| full.is_char_boundary(i))?;
        self.stops
            .iter()
            .enumerate()
            .filter_map(|(k, s)| full[from..].find(s.as_str()).map(|i| (from + i, k)))
            .min()
    }
}
