//! Request phases: the upstream `LlmRequestState` values. The phase is runtime data (it changes every
//! step); what a request *owns* is its type-state (see [`crate::request`]).

/// The state of a request, numbered as upstream (`LlmRequestState`); the order is chronological.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(i8)]
pub enum Phase {
    /// Transfer failed (disaggregated serving).
    DisaggTransError = -1,
    /// Unknown / not yet set.
    Unknown = 0,
    /// Waiting for the encoder.
    EncoderInit = 1,
    /// Disaggregated context waiting for the scheduler.
    DisaggContextWaitScheduler = 7,
    /// Disaggregated generation: waiting to be prepared.
    DisaggGenerationInit = 8,
    /// Disaggregated generation: KV transfer in progress.
    DisaggGenerationTransInProgress = 9,
    /// Prefill (context) phase.
    ContextInit = 10,
    /// Disaggregated context being processed and transmitted.
    DisaggContextInitAndTrans = 11,
    /// Disaggregated generation: transfer complete.
    DisaggGenerationTransComplete = 12,
    /// Decoding.
    GenerationInProgress = 13,
    /// Last decode step issued; completing.
    GenerationToComplete = 14,
    /// Finished.
    GenerationComplete = 20,
    /// Disaggregated context: transfer in progress.
    DisaggContextTransInProgress = 21,
    /// Disaggregated context: complete.
    DisaggContextComplete = 22,
}

impl Phase {
    /// Every phase, in numeric order.
    pub const ALL: [Phase; 14] = [
        Phase::DisaggTransError,
        Phase::Unknown,
        Phase::EncoderInit,
        Phase::DisaggContextWaitScheduler,
        Phase::DisaggGenerationInit,
        Phase::DisaggGenerationTransInProgress,
        Phase::ContextInit,
        Phase::DisaggContextInitAndTrans,
        Phase::DisaggGenerationTransComplete,
        Phase::GenerationInProgress,
        Phase::GenerationToComplete,
        Phase::GenerationComplete,
        Phase::DisaggContextTransInProgress,
        Phase::DisaggContextComplete,
    ];

    /// The upstream numeric value.
    pub const fn value(self) -> i8 {
        self as i8
    }

    /// The upstream name (`GENERATION_IN_PROGRESS`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Phase::DisaggTransError => "DISAGG_TRANS_ERROR",
            Phase::Unknown => "UNKNOWN",
            Phase::EncoderInit => "ENCODER_INIT",
            Phase::DisaggContextWaitScheduler => "DISAGG_CONTEXT_WAIT_SCHEDULER",
            Phase::DisaggGenerationInit => "DISAGG_GENERATION_INIT",
            Phase::DisaggGenerationTransInProgress => "DISAGG_GENERATION_TRANS_IN_PROGRESS",
            Phase::ContextInit => "CONTEXT_INIT",
            Phase::DisaggContextInitAndTrans => "DISAGG_CONTEXT_INIT_AND_TRANS",
            Phase::DisaggGenerationTransComplete => "DISAGG_GENERATION_TRANS_COMPLETE",
            Phase::GenerationInProgress => "GENERATION_IN_PROGRESS",
            Phase::GenerationToComplete => "GENERATION_TO_COMPLETE",
            Phase::GenerationComplete => "GENERATION_COMPLETE",
            Phase::DisaggContextTransInProgress => "DISAGG_CONTEXT_TRANS_IN_PROGRESS",
            Phase::DisaggContextComplete => "DISAGG_CONTEXT_COMPLETE",
        }
    }

    /// Parses an upstream name.
    pub fn from_name(name: &str) -> Option<Phase> {
        Phase::ALL.iter().copied().find(|p| p.name() == name)
    }

    /// Context-init phases: `CONTEXT_INIT` and `DISAGG_CONTEXT_INIT_AND_TRANS`.
    pub const fn is_context_init(self) -> bool {
        matches!(self, Phase::ContextInit | Phase::DisaggContextInitAndTrans)
    }

    /// Generation-in-progress phases (C++ definition): 12, 13 and 14.
    pub const fn is_generation(self) -> bool {
        matches!(
            self,
            Phase::DisaggGenerationTransComplete
                | Phase::GenerationInProgress
                | Phase::GenerationToComplete
        )
    }

    /// Phases in which a transfer holds the request's pages (they count as progress for the deadlock
    /// detector).
    pub const fn holds_transfer(self) -> bool {
        matches!(
            self,
            Phase::DisaggContextTransInProgress
                | Phase::DisaggContextComplete
                | Phase::DisaggGenerationTransInProgress
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_values_are_upstream() {
        for p in Phase::ALL {
            assert_eq!(Phase::from_name(p.name()), Some(p));
        }
        assert_eq!(Phase::ContextInit.value(), 10);
        assert_eq!(Phase::GenerationToComplete.value(), 14);
        assert_eq!(Phase::from_name("NOPE"), None);
        assert!(Phase::ContextInit < Phase::GenerationToComplete);
    }
}
