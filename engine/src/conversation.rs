//! Multi-turn chats whose follow-up prompts extend the previous turn's tokens exactly, so that a
//! prefix cache finds the whole earlier conversation in its blocks.
//!
//! A follow-up's prompt is the previous prompt, then the tokens the model generated for it (as
//! generated, not re-tokenized from their text), then the tokens of the text the chat template puts
//! between that answer and the next assistant turn (the end of the answer, the user's message,
//! the opening of the assistant's turn).

use crate::error::{EngineError, Result};
use crate::tokenizer::{Message, Tokenizer};

/// A chat: its messages so far and the prompt of its current turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversation {
    messages: Vec<Message>,
    prompt: Vec<u32>,
}

impl Conversation {
    /// A conversation opened by `messages` (a system message, a user message, ...): its first
    /// prompt is their chat-template rendering with the assistant's turn opened. Refused
    /// (`Template`, `Tokenizer`) when the tokenizer has no template or the template fails.
    pub fn start(tokenizer: &Tokenizer, messages: Vec<Message>) -> Result<Self> {
        let prompt = tokenizer.encode_chat(&messages, true)?;
        Ok(Self { messages, prompt })
    }

    /// The prompt of the current turn.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// The messages so far (the assistant's answers included once followed up).
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The next turn: the model answered the current prompt with `answer` (the tokens it
    /// generated, a stop token included or not) and the user says `user`. Returns the new prompt,
    /// which starts with the current prompt and `answer` token for token.
    ///
    /// Refused (`Tokenizer`) for a token outside the vocabulary, and (`Template`) when the template
    /// does not render the longer conversation as an extension of the current prompt's text and
    /// the answer (a template that rewrites earlier turns).
    pub fn follow_up(
        &mut self,
        tokenizer: &Tokenizer,
        answer: &[u32],
        user: &str,
    ) -> Result<&[u32]> {
        let text_end = answer
            .iter()
            .rposition(|&t| !tokenizer.is_stop(t))
            .map_or(0, |i| i + 1);
        let reply = tokenizer.decode(&answer[..text_end])?;
        let mut messages = self.messages.clone();
        messages.push(Message::new("assistant", reply));
        messages.push(Message::user(user));
        let full = tokenizer.render_chat(&messages, true)?;
        let mut head_tokens = self.prompt.clone();
        head_tokens.extend_from_slice(answer);
        let head = tokenizer.decode(&head_tokens)?;
        let tail = full.strip_prefix(head.as_str()).ok_or_else(|| {
            EngineError::Template(
                "the chat template does not render the follow-up as an extension of the \
                 conversation so far"
                    .into(),
            )
        })?;
        head_tokens.extend(tokenizer.encode(tail)?);
        self.messages = messages;
        self.prompt = head_tokens;
        Ok(&self.prompt)
    }
}
