//! Narrowing an index or a count to the width the core keeps it in.
//!
//! Slots are `u16` (every table's capacity is checked at compile time to fit, in `arena.rs`); page
//! numbers, block counts and token counts are `u32` (a pool's configuration is validated to fit).
//! A value past its width is a broken invariant, never input: these conversions stop on it rather
//! than wrap. They are the core's only narrowing casts (the cast lints are on in `lib.rs`).

/// The largest `u16`, as an index.
const U16_LIMIT: usize = 0xffff;
/// The largest `u32`, as an index.
const U32_LIMIT: usize = 0xffff_ffff;

/// `n` as a `u16` slot or task index.
#[inline(always)]
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn u16_of(n: usize) -> u16 {
    assert!(
        n <= U16_LIMIT,
        "an index past u16: a capacity check is missing"
    );
    n as u16
}

/// `n` as a `u32` page number, block count or token count.
#[inline(always)]
#[allow(clippy::cast_possible_truncation)]
pub(crate) const fn u32_of(n: usize) -> u32 {
    assert!(
        n <= U32_LIMIT,
        "a count past u32: a capacity check is missing"
    );
    n as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_hold_their_limits() {
        assert_eq!(u16_of(0xffff), u16::MAX);
        assert_eq!(u32_of(0xffff_ffff), u32::MAX);
    }

    #[test]
    #[should_panic(expected = "past u16")]
    fn a_slot_past_u16_stops() {
        let _ = u16_of(0x1_0000);
    }
}
