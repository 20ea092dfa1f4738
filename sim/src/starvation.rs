//! The starvation figure: the longest any request waited in the scheduler while others progressed.
//!
//! A request waits from its submission, or from the pass that last scheduled it, to the pass that next
//! schedules it. Only passes that scheduled work count (a pass that scheduled nobody is a stall, which
//! deadlock detection sees): the figure is how many such passes went by without it, the gap in simulated
//! time beside it. Under overload most of that is a queue served in arrival order, so the figure has a
//! second part: the most passes of one wait in which a request that arrived after it ran (it was
//! overtaken: a younger request fit where it did not). A request still live when the run ends waited to
//! the end (`unfinished`), and then the figure is unbounded for that run. Requests the engine holds in
//! its queue before the scheduler takes them (its table full) are not in the scheduler yet: their wait
//! is the time to first token's.
//!
//! O(1) a scheduled request, plus O(gap) when a wait ends (each progressing pass keeps the youngest
//! request it ran).

/// The run's longest wait while others progressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Starvation {
    /// Passes that scheduled other requests while this one waited.
    pub passes: u64,
    /// The same wait in simulated time, ms (from the pass before it to the pass that scheduled it).
    pub ms: f64,
    /// The request (its index in the workload) that waited longest, if any request waited.
    pub request: Option<u64>,
    /// The most passes of one wait in which a younger request ran (the request overtaken).
    pub overtaken: u64,
    /// The request overtaken most in one wait.
    pub overtaken_request: Option<u64>,
    /// Requests still waiting when the run ended (0 when every request that entered finished).
    pub unfinished: u64,
}

impl Starvation {
    /// Whether every request that entered the scheduler was scheduled again until it finished.
    pub fn finite(&self) -> bool {
        self.unfinished == 0
    }

    /// The longer of two figures (a cluster's is its replicas' longest); unfinished requests add up.
    pub fn max(self, other: Self) -> Self {
        let mut m = self;
        m.unfinished += other.unfinished;
        if other.passes > m.passes {
            (m.passes, m.ms, m.request) = (other.passes, other.ms, other.request);
        }
        if other.overtaken > m.overtaken {
            (m.overtaken, m.overtaken_request) = (other.overtaken, other.overtaken_request);
        }
        m
    }

    fn note(&mut self, wait: Wait) {
        if wait.passes > self.passes || self.request.is_none() {
            (self.passes, self.ms, self.request) = (wait.passes, wait.ms, Some(wait.request));
        }
        if wait.overtaken > self.overtaken {
            (self.overtaken, self.overtaken_request) = (wait.overtaken, Some(wait.request));
        }
    }
}

/// One request's ended wait.
#[derive(Debug, Clone, Copy)]
struct Wait {
    request: u64,
    passes: u64,
    ms: f64,
    overtaken: u64,
}

/// Where each live request's wait started, by table slot.
#[derive(Debug, Default)]
pub(super) struct Waits {
    /// The youngest request (the highest workload index) each progressing pass so far ran.
    youngest: Vec<u64>,
    /// Per slot: the request, the progressing passes before its wait began, and when it began (ms).
    since: Vec<Option<(u64, usize, f64)>>,
    longest: Starvation,
}

impl Waits {
    /// A request entered the scheduler at `slot` at `now` ms: its wait begins.
    pub(super) fn entered(&mut self, slot: u16, request: u64, now: f64) {
        let s = usize::from(slot);
        if self.since.len() <= s {
            self.since.resize(s + 1, None);
        }
        self.since[s] = Some((request, self.youngest.len(), now));
    }

    /// A pass at `now` ms scheduled the requests at `slots`: their waits end (and the next begins).
    pub(super) fn scheduled(&mut self, slots: impl Iterator<Item = u16>, now: f64) {
        let mut youngest = None;
        let next = self.youngest.len() + 1;
        for slot in slots {
            let Some(Some((request, before, at))) = self.since.get(usize::from(slot)).copied()
            else {
                continue;
            };
            self.end(request, before, now - at);
            self.since[usize::from(slot)] = Some((request, next, now));
            youngest = youngest.max(Some(request));
        }
        self.youngest.extend(youngest);
    }

    /// A wait of `request` that began after `before` progressing passes ended, `ms` long.
    fn end(&mut self, request: u64, before: usize, ms: f64) {
        let passes = &self.youngest[before.min(self.youngest.len())..];
        self.longest.note(Wait {
            request,
            passes: passes.len() as u64,
            ms,
            overtaken: passes.iter().filter(|&&y| y > request).count() as u64,
        });
    }

    /// The request at `slot` left the scheduler.
    pub(super) fn left(&mut self, slot: u16) {
        if let Some(s) = self.since.get_mut(usize::from(slot)) {
            *s = None;
        }
    }

    /// The figure at the end of the run, at `now` ms: requests still live waited to the end.
    pub(super) fn finish(mut self, now: f64) -> Starvation {
        for (request, before, at) in std::mem::take(&mut self.since).into_iter().flatten() {
            self.longest.unfinished += 1;
            self.end(request, before, now - at);
        }
        self.longest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_counts_only_the_passes_that_scheduled_others() {
        let mut w = Waits::default();
        w.entered(0, 7, 0.0);
        w.entered(1, 8, 0.0);
        // Slot 1 runs three passes alone; one pass schedules nobody.
        for t in 1..=3 {
            w.scheduled([1u16].into_iter(), f64::from(t));
        }
        w.scheduled(std::iter::empty(), 4.0);
        w.scheduled([0u16, 1].into_iter(), 5.0);
        let s = w.finish(6.0);
        assert_eq!(
            s,
            Starvation {
                passes: 3,
                ms: 5.0,
                request: Some(7),
                overtaken: 3,
                overtaken_request: Some(7),
                unfinished: 2
            }
        );
    }

    #[test]
    fn a_queue_served_in_arrival_order_is_not_overtaken() {
        let mut w = Waits::default();
        for r in 0..3u16 {
            w.entered(r, u64::from(r), 0.0);
        }
        // Each runs two passes, in arrival order, and leaves.
        for r in 0..3u16 {
            for t in 0..2 {
                w.scheduled([r].into_iter(), f64::from(2 * r + t));
            }
            w.left(r);
        }
        let s = w.finish(6.0);
        assert_eq!((s.passes, s.request, s.overtaken), (4, Some(2), 0));
        assert!(s.finite());
    }

    #[test]
    fn a_request_scheduled_every_pass_never_waits() {
        let mut w = Waits::default();
        w.entered(3, 1, 0.0);
        for t in 0..10 {
            w.scheduled([3u16].into_iter(), f64::from(t));
        }
        w.left(3);
        let s = w.finish(10.0);
        assert_eq!((s.passes, s.unfinished, s.finite()), (0, 0, true));
    }

    #[test]
    fn a_request_left_waiting_makes_the_figure_unbounded() {
        let mut w = Waits::default();
        w.entered(0, 1, 0.0);
        w.entered(1, 2, 0.0);
        w.scheduled([1u16].into_iter(), 1.0);
        w.left(1);
        let s = w.finish(2.0);
        assert!(!s.finite());
        assert_eq!((s.passes, s.request), (1, Some(1)));
        assert_eq!((s.overtaken, s.overtaken_request), (1, Some(1)));
        let other = Starvation {
            passes: 9,
            ms: 1.0,
            request: Some(5),
            ..Starvation::default()
        };
        let m = s.max(other);
        assert_eq!((m.passes, m.request, m.unfinished), (9, Some(5), 1));
        assert_eq!((m.overtaken, m.overtaken_request), (1, Some(1)));
    }
}
