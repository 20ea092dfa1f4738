//! Free memory filled with NaN after every step: a page no table names and no prefix-cache entry
//! keeps, a state slot that is no request's and holds no snapshot.

use kvsched_core::page_pool::{page_of, HOST, NO_PAGE};
use kvsched_core::state_pool::Placement;
use kvsched_core::Tier;

use super::engine::{HybridEngine, HYBRID_REQUESTS};
use super::store::Units;

/// Fills every unit of `units` whose flag is not set with NaN.
fn fill(units: &mut Units, used: &[bool]) {
    for (i, &u) in used.iter().enumerate() {
        if !u {
            units.unit_mut(i as u32).fill(f32::NAN);
        }
    }
}

impl HybridEngine<'_> {
    /// [The module docs](self).
    pub(super) fn poison(&mut self) {
        let (pages, states) = (self.used_pages(), self.used_states());
        let stores = self.stores_mut();
        for t in 0..2 {
            fill(&mut stores.pages[t], &pages[t]);
            fill(&mut stores.states[t], &states[t]);
        }
    }

    fn used_pages(&self) -> [Vec<bool>; 2] {
        let pool = &self.backend().attention().groups()[0].pool;
        let counts = self.stores().pages.each_ref().map(Units::count);
        let mut used = counts.map(|n| vec![false; n]);
        for slot in 0..HYBRID_REQUESTS as u16 {
            for &e in pool.table(slot).iter().filter(|&&e| e != NO_PAGE) {
                let (tier, page) = page_of(e);
                used[usize::from(tier == Tier::Host)][page as usize] = true;
            }
        }
        for (t, flags) in used.iter_mut().enumerate() {
            for (page, u) in flags.iter_mut().enumerate() {
                let entry = page as u32 | if t == 1 { HOST } else { 0 };
                let info = pool.page_info(entry);
                *u |= info.is_some_and(|i| i.cached() || i.refs() > 0 || i.holds() > 0);
            }
        }
        used
    }

    fn used_states(&self) -> [Vec<bool>; 2] {
        let state = self.backend().state();
        let counts = self.stores().states.each_ref().map(Units::count);
        let mut used = counts.map(|n| vec![false; n]);
        for (g, u) in used[0].iter_mut().enumerate() {
            *u = state.snapshot_position(g as u32).is_some();
        }
        for row in 0..HYBRID_REQUESTS as u16 {
            match state.placement(row) {
                Placement::Gpu(g) | Placement::Held(g) => used[0][g as usize] = true,
                Placement::Host(h) => used[1][h as usize] = true,
                Placement::None => {}
            }
        }
        used
    }
}
