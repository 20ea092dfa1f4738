//! Prompt-lookup drafts for speculative decoding: the tokens that followed the latest earlier
//! occurrence of the sequence's last few tokens (an n-gram match in its own prompt and output)
//! are proposed as the next ones; the model verifies them all in one step.

/// How drafts are looked up ([`crate::EngineConfig::speculative`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest n-gram matched (tried first).
    pub max_ngram: usize,
    /// Shortest n-gram matched (at least 1).
    pub min_ngram: usize,
    /// Draft tokens proposed at most per step.
    pub max_draft: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        Self {
            max_ngram: 3,
            min_ngram: 1,
            max_draft: 4,
        }
    }
}

impl PromptLookup {
    /// Whether the lookup can propose anything (n-gram lengths `1 <= min <= max`, drafts >= 1).
    pub fn is_valid(&self) -> bool {
        self.min_ngram >= 1 && self.min_ngram <= self.max_ngram && self.max_draft >= 1
    }

    /// Up to `limit.min(max_draft)` draft tokens for `tokens` (prompt, then generated): for the
    /// longest n-gram (from `max_ngram` down to `min_ngram`) ending `tokens` that also occurs
    /// earlier, the tokens after its latest earlier occurrence. Empty when nothing matches.
    pub fn propose(&self, tokens: &[u32], limit: usize) -> Vec<u32> {
        let k = limit.min(self.max_draft);
        if k == 0 || !self.is_valid() {
            return Vec::new();
        }
        let len = tokens.len();
        for n in (self.min_ngram..=self.max_ngram.min(len.saturating_sub(1))).rev() {
            let tail = &tokens[len - n..];
            // The latest start `i < len - n` whose n-gram equals the tail.
            if let Some(i) = (0..len - n).rev().find(|&i| &tokens[i..i + n] == tail) {
                let from = i + n;
                return tokens[from..(from + k).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

/// How many of `draft` the model's greedy tokens confirm: `greedy[j]` is the model's token after
/// the step's `j`-th row (the last accepted token, then the drafts), so draft `j` is accepted while
/// every draft before it was and `greedy[j] == draft[j]`.
pub fn accepted(draft: &[u32], greedy: &[u32]) -> usize {
    draft.iter().zip(greedy).take_while(|(d, g)| d == g).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_longest_match_proposes_what_followed_it() {
        let p = PromptLookup::default();
        // "1 2 3 9 | 1 2 3 7 8 | 1 2 3": the 3-gram's latest earlier match is followed by 7 8 1 2.
        let t = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3];
        assert_eq!(p.propose(&t, 8), vec![7, 8, 1, 2]);
        assert_eq!(p.propose(&t, 2), vec![7, 8], "the limit caps the draft");
        assert_eq!(p.propose(&t, 0), Vec::<u32>::new());
        // Only a 1-gram matches: 5 was followed by 6.
        assert_eq!(p.propose(&[5, 6, 7, 5], 3), vec![6, 7, 5]);
        // The draft stops at the end of the tokens.
        assert_eq!(p.propose(&[4, 4], 3), vec![4]);
        assert!(p.propose(&[1, 2, 3], 3).is_empty(), "no match");
        assert!(p.propose(&[], 3).is_empty());
        let bad = PromptLookup { min_ngram: 0, ..p };
        assert!(!bad.is_valid() && bad.propose(&t, 3).is_empty());
    }

    #[test]
    fn acceptance_is_the_longest_confirmed_prefix() {
        assert_eq!(accepted(&[1, 2, 3], &[1, 2, 3, 4]), 3);
        assert_eq!(accepted(&[1, 2, 3], &[1, 5, 3, 4]), 1);
        assert_eq!(accepted(&[1, 2, 3], &[9, 2, 3, 4]), 0);
        assert_eq!(accepted(&[], &[9]), 0);
    }
}
