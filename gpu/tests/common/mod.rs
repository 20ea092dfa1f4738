//! Helpers shared by the integration tests: byte patterns, a per-tier content model, the CUDA
//! skip rule.
// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::sync::Arc;

use kvsched_gpu::{open_device, CudaContext, MemError, PageMove, PageStore, Tier};
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Moves `(src, dst)` of pages from tier `from` to the other tier (`request` unused by the stores).
pub fn moves(from: Tier, pairs: &[(u32, u32)]) -> Vec<PageMove> {
    pairs
        .iter()
        .map(|&(src, dst)| PageMove {
            request: kvsched_core::RequestId::default(),
            from,
            src,
            dst,
        })
        .collect()
}

/// `len` pseudo-random bytes determined by `seed` (splitmix64).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        bytes.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// The device context for a CUDA test, or `None` after printing why the test is skipped.
pub fn cuda_or_skip(test: &str) -> Option<Arc<CudaContext>> {
    match open_device(0) {
        Ok(ctx) => Some(ctx),
        Err(error) => {
            println!("{test}: skipped: {error}");
            None
        }
    }
}

/// A store error as a failed property case.
pub fn fail(error: MemError) -> TestCaseError {
    TestCaseError::fail(error.to_string())
}

/// The CUDA twin of a host-backend property: `cases` cases (fewer than on the host: every case
/// allocates a store), or a printed skip reason without a driver.
pub fn cuda_property<S: Strategy>(
    test: &str,
    cases: u32,
    strategy: S,
    check: impl Fn(&Arc<CudaContext>, S::Value) -> Result<(), TestCaseError>,
) {
    let Some(ctx) = cuda_or_skip(test) else {
        return;
    };
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(error) = runner.run(&strategy, |value| check(&ctx, value)) {
        panic!("{error}");
    }
}

/// What every page of both tiers of a store should hold.
#[derive(Clone, Debug)]
pub struct Model {
    pub gpu: Vec<Vec<u8>>,
    pub host: Vec<Vec<u8>>,
}

impl Model {
    /// A model of a freshly created (zeroed) store.
    pub fn zeroed<S: PageStore>(store: &S) -> Self {
        let shape = store.shape();
        let page = vec![0; shape.page_bytes];
        Self {
            gpu: vec![page.clone(); shape.gpu_pages as usize],
            host: vec![page; shape.host_pages as usize],
        }
    }

    pub fn tier_mut(&mut self, tier: Tier) -> &mut Vec<Vec<u8>> {
        match tier {
            Tier::Gpu => &mut self.gpu,
            Tier::Host => &mut self.host,
        }
    }

    /// Writes `seed`'s pattern into `page` of `tier`, in the store and in the model.
    pub fn write<S: PageStore>(&mut self, store: &mut S, tier: Tier, page: u32, seed: u64) {
        let bytes = pattern(seed, store.shape().page_bytes);
        store.write_page(tier, page, &bytes).expect("write_page");
        self.tier_mut(tier)[page as usize] = bytes;
    }

    /// Applies a move list to the model: page `src` of tier `from` to page `dst` of the other.
    pub fn apply(&mut self, moves: &[PageMove]) {
        for page_move in moves {
            let (source, target) = match page_move.from {
                Tier::Gpu => (&self.gpu, &mut self.host),
                Tier::Host => (&self.host, &mut self.gpu),
            };
            target[page_move.dst as usize] = source[page_move.src as usize].clone();
        }
    }

    /// Compares every byte of every page of both tiers; the first difference as an error.
    pub fn check<S: PageStore>(&self, store: &S) -> Result<(), String> {
        let mut out = vec![0; store.shape().page_bytes];
        for (tier, pages) in [(Tier::Gpu, &self.gpu), (Tier::Host, &self.host)] {
            for (page, expected) in pages.iter().enumerate() {
                let page = page as u32;
                store
                    .read_page(tier, page, &mut out)
                    .map_err(|error| format!("read {tier} {page}: {error}"))?;
                if let Some(byte) = out.iter().zip(expected).position(|(got, want)| got != want) {
                    return Err(format!(
                        "{tier} page {page} byte {byte}: got {:#04x}, want {:#04x}",
                        out[byte], expected[byte]
                    ));
                }
            }
        }
        Ok(())
    }
}
