//! State fingerprints: a 64-bit FNV-1a [`Hasher`] over every byte of a structure's state, so tests can
//! check that a refused operation left the scheduler, its KV pool and its adapter cache unchanged
//! (`before == after`) without the arenas having to be `Clone` (the page pool only borrows its buffers).
//!
//! A fingerprint is deterministic within one build on one machine (integers hash in native byte
//! order); it is a test aid, not a stable format.

use core::hash::Hasher;

/// FNV-1a, 64 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(u64);

impl Fingerprint {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    /// An empty fingerprint.
    pub const fn new() -> Self {
        Self(Self::OFFSET)
    }
}

impl Default for Fingerprint {
    fn default() -> Self {
        Self::new()
    }
}

impl Hasher for Fingerprint {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(Self::PRIME);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::hash::Hash;

    #[test]
    fn differs_on_any_byte_and_is_deterministic() {
        let fp = |v: &[u32]| {
            let mut h = Fingerprint::new();
            v.hash(&mut h);
            h.finish()
        };
        assert_eq!(fp(&[1, 2, 3]), fp(&[1, 2, 3]));
        assert_ne!(fp(&[1, 2, 3]), fp(&[1, 2, 4]));
        assert_ne!(fp(&[1, 2, 3]), fp(&[1, 2, 3, 0]));
    }
}
