//! What a pass did to each request ([`Mark`], a bit each), kept per slot without clearing every slot
//! every pass (issue 41: a pass costs what changed, not the table).
//!
//! A mark is the stamp of the pass that set it (a byte per kind of mark); a pass reads only marks
//! with its own stamp, so an older mark reads as none. Stamps cycle through 1..=255, so a mark written in
//! one pass would read as a pass's own 255 passes later; each pass therefore clears one window of
//! `N / WINDOWS` slots in turn ([`Clock::begin`]), so every slot is cleared at least once every
//! `WINDOWS` (< 255) passes, before its stamp comes round again. A fresh array (all 0: stamp 0) holds
//! no pass's marks.

/// Windows the slots are cleared in, one a pass: fewer than the 255 stamps.
const WINDOWS: u8 = 128;
const _: () = assert!(
    WINDOWS < u8::MAX,
    "a slot is cleared before its stamp comes round again"
);

/// What a pass can do to a request, one kind of mark each (a request may be scheduled and then
/// evicted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark(usize);

impl Mark {
    /// Scheduled (generation, context or encoder) in this pass: protected from preemption.
    pub(crate) const SCHEDULED: Mark = Mark(0);
    /// Recompute-paused in this pass: never visited again.
    pub(crate) const RECOMPUTED: Mark = Mark(1);
    /// Preempted in this pass: never admitted again in it.
    pub(crate) const PREEMPTED: Mark = Mark(2);
    /// Ordinarily suspended in this pass.
    pub(crate) const EVICTED: Mark = Mark(3);
}

/// A request's marks: per kind, the stamp of the last pass that set it (a byte each, so that a
/// read is one comparison and a write one store).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Marks([u8; 4]);

impl Marks {
    /// No pass's marks.
    pub(crate) const NONE: Marks = Marks([0; 4]);
}

/// A pass's stamp: which marks are its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp(u8);

impl Stamp {
    /// Whether this pass set `mark` on `m`.
    #[inline(always)]
    pub(crate) fn reads(self, m: &Marks, mark: Mark) -> bool {
        m.0[mark.0] == self.0
    }

    /// This pass sets `mark` on `m` (its other marks stand).
    #[inline(always)]
    pub(crate) fn set(self, m: &mut Marks, mark: Mark) {
        m.0[mark.0] = self.0;
    }
}

/// The scheduler's count of passes for the marks: the next stamp and the next window to clear.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Clock {
    stamp: u8,
    window: u8,
}

impl Clock {
    /// Before the first pass.
    pub(crate) const NEW: Clock = Clock {
        stamp: 0,
        window: 0,
    };

    /// A pass begins: one window of slots is cleared, and its stamp is the next one.
    pub(crate) fn begin<const N: usize>(&mut self, marks: &mut [Marks; N]) -> Stamp {
        let len = N.div_ceil(usize::from(WINDOWS));
        let from = (usize::from(self.window) * len).min(N);
        marks[from..(from + len).min(N)].fill(Marks::NONE);
        self.window = (self.window + 1) % WINDOWS;
        self.stamp = if self.stamp == u8::MAX {
            1
        } else {
            self.stamp + 1
        };
        Stamp(self.stamp)
    }
}

#[cfg(test)]
mod tests {
    use super::{Clock, Mark, Marks};

    /// A mark reads as set in the pass that set it only, over many stamp cycles, on every slot.
    #[test]
    fn a_mark_reads_only_in_its_own_pass() {
        const N: usize = 300;
        let mut marks = [Marks::NONE; N];
        let mut clock = Clock::NEW;
        let mut written = [u32::MAX; N];
        for pass in 0..2_000u32 {
            let stamp = clock.begin(&mut marks);
            for (slot, &at) in written.iter().enumerate() {
                for mark in [Mark::SCHEDULED, Mark::EVICTED, Mark::PREEMPTED] {
                    let set = stamp.reads(&marks[slot], mark);
                    assert!(
                        !set,
                        "slot {slot} marked in pass {at} reads as pass {pass}'s"
                    );
                }
            }
            // Mark a few slots, differently each pass.
            let slot = (pass as usize * 7) % N;
            stamp.set(&mut marks[slot], Mark::SCHEDULED);
            stamp.set(&mut marks[slot], Mark::EVICTED);
            assert!(stamp.reads(&marks[slot], Mark::SCHEDULED));
            assert!(stamp.reads(&marks[slot], Mark::EVICTED));
            assert!(!stamp.reads(&marks[slot], Mark::PREEMPTED));
            written[slot] = pass;
        }
    }
}
