//! From a trace's prefix blocks to the block hashes the engine hands the scheduler, one per full page.
//!
//! A trace names its prompt's blocks of `block_tokens` tokens (Mooncake: 512-token `hash_ids`; the
//! conversation generator: 16-token blocks). Page `j` of `tokens_per_block` tokens covers the prompt's
//! tokens `[j·tpb, (j+1)·tpb)`; it gets a hash only if it lies wholly inside the prompt:
//!
//! - `tpb` divides the block (`tpb` = 16, 32, … 512 for Mooncake): page `j` is part `j mod (block/tpb)`
//!   of block `j·tpb / block`, and its hash mixes that block's id with the part index;
//! - the block divides `tpb` (1024-token pages over 512-token blocks): the page's hash folds the ids of
//!   the blocks it covers.
//!
//! Other sizes are refused by the simulator's option check. Hashes stop at the first page whose blocks
//! the trace does not list (the cache matches prefixes only). The core chains each page hash with its
//! parent's key, so a page hash need not encode its position.

use kvsched_core::kv::chain;

/// Pages of `tpb` tokens can carry hashes of blocks of `block_tokens` tokens.
pub fn compatible(block_tokens: u32, tpb: u32) -> bool {
    block_tokens > 0 && tpb > 0 && (block_tokens % tpb == 0 || tpb % block_tokens == 0)
}

/// Writes into `out` (cleared first) the hashes of the full pages of a `prompt`-token prompt whose
/// blocks are `blocks`.
pub fn page_hashes(blocks: &[u64], block_tokens: u32, tpb: u32, prompt: u32, out: &mut Vec<u64>) {
    out.clear();
    if !compatible(block_tokens, tpb) {
        return;
    }
    let pages = (prompt / tpb) as usize;
    if block_tokens % tpb == 0 {
        let parts = (block_tokens / tpb) as usize;
        let listed = blocks.len() * parts;
        out.extend((0..pages.min(listed)).map(|j| chain(blocks[j / parts], (j % parts) as u64)));
    } else {
        let per = (tpb / block_tokens) as usize;
        out.extend(
            blocks
                .chunks_exact(per)
                .take(pages)
                .map(|c| c.iter().fold(0x5eed, |k, &b| chain(k, b))),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(blocks: &[u64], block: u32, tpb: u32, prompt: u32) -> Vec<u64> {
        let mut v = Vec::new();
        page_hashes(blocks, block, tpb, prompt, &mut v);
        v
    }

    #[test]
    fn a_512_token_block_splits_into_pages_and_only_full_pages_are_hashed() {
        let h = hashes(&[7, 8], 512, 128, 1000);
        assert_eq!(h.len(), 7, "1000 tokens = 7 full pages of 128");
        assert_eq!(h[0], chain(7, 0));
        assert_eq!(h[3], chain(7, 3));
        assert_eq!(h[4], chain(8, 0));
        assert_eq!(
            hashes(&[7], 512, 128, 1000).len(),
            4,
            "stops where the blocks stop"
        );
        assert_eq!(hashes(&[7, 8], 512, 128, 100), Vec::<u64>::new());
    }

    #[test]
    fn a_page_of_several_blocks_folds_them() {
        let h = hashes(&[1, 2, 3, 4, 5], 512, 1024, 5000);
        assert_eq!(
            h.len(),
            2,
            "two full pages of 1024 (the fifth block is alone)"
        );
        assert_eq!(h[0], hashes(&[1, 2, 9], 512, 1024, 1024)[0]);
        assert_ne!(h[0], h[1]);
    }

    #[test]
    fn sizes_that_do_not_nest_are_refused() {
        assert!(compatible(512, 32) && compatible(16, 512) && compatible(512, 512));
        assert!(!compatible(512, 48) && !compatible(16, 24) && !compatible(0, 16));
        assert!(hashes(&[1, 2], 512, 48, 1024).is_empty());
    }
}
