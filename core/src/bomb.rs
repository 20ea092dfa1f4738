//! The debug drop bomb: a request or lease that still owns resources must be consumed by a transition,
//! never dropped. Armed, it panics on drop in debug builds with the `std` feature.

/// Debug drop bomb: armed while its owner holds resources. Defused by the consuming transition.
#[derive(Debug)]
pub(crate) struct Bomb {
    #[cfg(all(feature = "std", debug_assertions))]
    armed: bool,
}

impl Bomb {
    #[inline]
    pub(crate) fn armed() -> Self {
        Self {
            #[cfg(all(feature = "std", debug_assertions))]
            armed: true,
        }
    }
    #[inline]
    // Without `std` in a debug build there is nothing to disarm.
    #[allow(unused_mut, clippy::unused_self)]
    pub(crate) fn defuse(mut self) {
        #[cfg(all(feature = "std", debug_assertions))]
        {
            self.armed = false;
        }
    }
}

impl Drop for Bomb {
    #[inline]
    fn drop(&mut self) {
        #[cfg(all(feature = "std", debug_assertions))]
        assert!(!self.armed || std::thread::panicking(), "a request or adapter lease was dropped while it still owns resources (KV pages or a lease)");
    }
}
