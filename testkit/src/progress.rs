//! The progress bound (issue 42): how long the oldest runnable request waits.
//!
//! The oldest runnable request is the first live request in arrival order that the scheduler may run:
//! not in flight, no transfer in progress (sending its KV or receiving it), no connector load pending.
//! While it stays the oldest runnable one, [`Progress`] counts the passes that did not schedule it (in
//! a context, generation or transfer list), and remembers the work the *other* live requests had left
//! when it became the oldest: their prompt tokens still to compute and their output tokens still to
//! produce. The bound the model tests hold (`core/tests/model.rs`, `PROGRESS_SLACK`) is stated against
//! that work: a request waits on work that exists when it becomes the oldest, never on work created
//! after (a newcomer's, or a replay that overtakes it).

/// The oldest runnable request's wait so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Episode {
    id: u64,
    waited: u64,
    others: u64,
}

/// The longest waits of oldest runnable requests in a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    current: Option<Episode>,
    /// The most passes an oldest runnable request went unscheduled.
    pub longest: u64,
    /// The most passes beyond the others' work (`waited - others`, 0 when always within it).
    pub excess: u64,
    /// The wait with that excess: (id, passes waited, the others' work when it became the oldest).
    pub worst: Option<(u64, u64, u64)>,
}

impl Progress {
    /// Before a pass: `oldest`, the oldest runnable request (if any), and `others(id)`, the work the
    /// other live requests have left, asked for only when a new request becomes the oldest. Returns
    /// the oldest's id.
    pub fn before(&mut self, oldest: Option<u64>, others: impl FnOnce(u64) -> u64) -> Option<u64> {
        let Some(id) = oldest else {
            self.current = None;
            return None;
        };
        if self.current.is_none_or(|e| e.id != id) {
            self.current = Some(Episode {
                id,
                waited: 0,
                others: others(id),
            });
        }
        Some(id)
    }

    /// After the pass: whether it scheduled the oldest runnable request.
    pub fn after(&mut self, scheduled: bool) {
        let Some(e) = &mut self.current else { return };
        if scheduled {
            self.current = None;
            return;
        }
        e.waited += 1;
        let e = *e;
        self.longest = self.longest.max(e.waited);
        let excess = e.waited.saturating_sub(e.others);
        if self
            .worst
            .is_none_or(|(_, waited, _)| (excess, e.waited) > (self.excess, waited))
        {
            self.excess = excess;
            self.worst = Some((e.id, e.waited, e.others));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `before` over `(id, runnable, work)` live requests in arrival order.
    fn before(p: &mut Progress, live: &[(u64, bool, u64)]) -> Option<u64> {
        let oldest = live.iter().find(|c| c.1).map(|c| c.0);
        p.before(oldest, |id| {
            live.iter().filter(|c| c.0 != id).map(|c| c.2).sum()
        })
    }

    #[test]
    fn a_wait_is_held_against_the_others_work_when_it_began() {
        let mut p = Progress::default();
        let live = [(1, false, 9), (2, true, 4), (3, true, 2)];
        for _ in 0..5 {
            assert_eq!(before(&mut p, &live), Some(2));
            p.after(false);
        }
        // Request 2 waited 5 passes; the others had 9 + 2 left.
        assert_eq!((p.longest, p.excess, p.worst), (5, 0, Some((2, 5, 11))));
        p.after(true);
        assert_eq!(before(&mut p, &[(3, true, 2)]), Some(3));
        p.after(false);
        p.after(false);
        assert_eq!((p.longest, p.excess, p.worst), (5, 2, Some((3, 2, 0))));
    }
}
