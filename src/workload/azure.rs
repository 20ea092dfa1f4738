//! Reader for the Azure LLM inference trace 2023 (`Azure/AzurePublicDataset`,
//! `data/AzureLLMInferenceTrace_{code,conv}.csv`; CC-BY-4.0, Patel et al., "Splitwise", ISCA 2024).
//!
//! ```text
//! TIMESTAMP,ContextTokens,GeneratedTokens
//! 2023-11-16 18:15:46.6805900,374,44
//! ```
//!
//! `TIMESTAMP` is a naive wall-clock time (no time zone) with up to 9 fractional digits (the files
//! have 7). It is parsed by hand — no date library — into nanoseconds since 1970-01-01 00:00:00 of the
//! same naive clock, using [`days_from_civil`]; arrival times are then milliseconds after the
//! earliest row. `ContextTokens` is the prompt length and `GeneratedTokens` the output length.
//! The published files use `\r\n` line endings and have no trailing newline; both are handled.

use super::{
    check_header, lines, parse_tokens, split_row, Arrival, Builder, Ctx, TraceError, TraceErrorKind,
};
use super::{clip, TraceFormat, Workload};

/// The header line's column names.
pub const HEADER: [&str; 3] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];

const NS_PER_DAY: i128 = 86_400 * 1_000_000_000;

/// Parses Azure trace text (header first). See the [module docs](self).
pub(crate) fn parse(text: &str, ctx: Ctx<'_>) -> Result<Workload, TraceError> {
    let mut rows = lines(text).filter(|(_, l)| !l.trim().is_empty());
    let (n, header) = rows
        .next()
        .ok_or_else(|| ctx.file_err(TraceErrorKind::Empty))?;
    check_header(ctx, n, header, &HEADER)?;

    // (time in ns, arrival with a placeholder time); times are rebased once the minimum is known.
    let mut timed = Vec::new();
    for (n, line) in rows {
        let [ts, prompt, output] = split_row(ctx, n, line, &HEADER)?;
        let at_ns = parse_timestamp(ts).map_err(|why| {
            ctx.err(
                n,
                Some(HEADER[0]),
                TraceErrorKind::BadTimestamp {
                    value: clip(ts),
                    why,
                },
            )
        })?;
        let prompt_tokens = parse_tokens(prompt).map_err(|r| ctx.err(n, Some(HEADER[1]), r))?;
        let output_tokens = parse_tokens(output).map_err(|r| ctx.err(n, Some(HEADER[2]), r))?;
        timed.push((at_ns, prompt_tokens, output_tokens));
    }

    let origin = timed.iter().map(|&(t, _, _)| t).min().unwrap_or(0);
    let mut b = Builder::new();
    for (t, prompt_tokens, output_tokens) in timed {
        // The difference of two timestamps in 0000..=9999 is < 2^69 ns, exact enough as f64 ms.
        let at_ms = (t - origin) as f64 / 1e6;
        b.push(Arrival {
            at_ms,
            prompt_tokens,
            output_tokens,
            adapter: None,
            prefix_blocks: Vec::new(),
        });
    }
    Ok(b.finish(ctx.source(TraceFormat::Azure2023), None))
}

/// Days from 1970-01-01 to the proleptic Gregorian date `y-m-d` (negative before 1970).
///
/// Howard Hinnant's `days_from_civil`: shift the year to start on March 1 so the leap day is the last
/// day of the year, then count 400-year eras (146 097 days each), years of the era, and days of the
/// year (`(153·m' + 2) / 5` gives the day on which shifted month m' starts). `m` must be in 1..=12
/// and `d` in 1..=31; the result for an invalid day of month (e.g. Feb 30) is the day it would be
/// counting on (Mar 2), so callers validate first.
#[must_use]
pub const fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400; // [0, 399]
    let mp = (m as i64 + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + d as i64 - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date `(year, month, day)` that is `z` days after 1970-01-01; the inverse
/// of [`days_from_civil`] (Hinnant's `civil_from_days`).
#[must_use]
pub const fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

/// Whether `y` is a Gregorian leap year.
#[must_use]
pub const fn is_leap_year(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Number of days in month `m` (1..=12) of year `y`; 0 for an invalid month.
#[must_use]
pub const fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap_year(y) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Parses `YYYY-MM-DD HH:MM:SS[.fraction]` (a `T` may replace the space; 1 to 9 fractional digits)
/// into nanoseconds since 1970-01-01 00:00:00 on the same naive clock.
///
/// # Errors
///
/// A short description of the first part that is malformed or out of range.
pub fn parse_timestamp(s: &str) -> Result<i128, &'static str> {
    let s = s.trim();
    let (date, time) = s
        .split_once(' ')
        .or_else(|| s.split_once('T'))
        .ok_or("expected \"YYYY-MM-DD HH:MM:SS[.fraction]\"")?;
    let (year, month, day) = three(date.split('-')).ok_or("date must be YYYY-MM-DD")?;
    let year = digits(year, 4, 4).ok_or("year must have 4 digits")?;
    let month = digits(month, 1, 2).ok_or("month must have 1 or 2 digits")?;
    let day = digits(day, 1, 2).ok_or("day must have 1 or 2 digits")?;
    if !(1..=12).contains(&month) {
        return Err("month out of range");
    }
    if day == 0 || day > u64::from(days_in_month(year as i64, month as u32)) {
        return Err("day out of range for the month");
    }

    let (hms, fraction) = match time.split_once('.') {
        Some((hms, f)) => (hms, Some(f)),
        None => (time, None),
    };
    let (hour, minute, second) = three(hms.split(':')).ok_or("time must be HH:MM:SS")?;
    let hour = digits(hour, 1, 2).ok_or("hour must have 1 or 2 digits")?;
    let minute = digits(minute, 2, 2).ok_or("minute must have 2 digits")?;
    let second = digits(second, 2, 2).ok_or("second must have 2 digits")?;
    if hour > 23 {
        return Err("hour out of range");
    }
    if minute > 59 {
        return Err("minute out of range");
    }
    if second > 59 {
        return Err("second out of range");
    }
    let nanos = match fraction {
        None => 0,
        Some(f) => {
            let v = digits(f, 1, 9).ok_or("fraction must have 1 to 9 digits")?;
            v * 10u64.pow(9 - f.len() as u32)
        }
    };

    let days = days_from_civil(year as i64, month as u32, day as u32);
    let secs_of_day = hour * 3600 + minute * 60 + second;
    Ok(i128::from(days) * NS_PER_DAY + i128::from(secs_of_day) * 1_000_000_000 + i128::from(nanos))
}

/// The three items of `it`, if it has exactly three.
fn three<'a>(mut it: impl Iterator<Item = &'a str>) -> Option<(&'a str, &'a str, &'a str)> {
    let parts = (it.next()?, it.next()?, it.next()?);
    it.next().is_none().then_some(parts)
}

/// `s` as a decimal number if it is `min..=max` ASCII digits.
fn digits(s: &str, min: usize, max: usize) -> Option<u64> {
    if (min..=max).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::workload::{load, parse as parse_any};

    fn ctx() -> Ctx<'static> {
        Ctx {
            path: Path::new("azure.csv"),
        }
    }

    #[test]
    fn civil_day_counts_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2023, 11, 16), 19_677);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(0, 3, 1), -719_468);
        assert_eq!(civil_from_days(19_677), (2023, 11, 16));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn civil_round_trip_over_four_centuries() {
        let start = days_from_civil(1800, 1, 1);
        let mut expect = (1800i64, 1u32, 1u32);
        for z in start..start + 146_097 + 400 {
            assert_eq!(civil_from_days(z), expect, "day {z}");
            assert_eq!(days_from_civil(expect.0, expect.1, expect.2), z);
            // Advance `expect` by one calendar day the slow way.
            expect.2 += 1;
            if expect.2 > days_in_month(expect.0, expect.1) {
                expect.2 = 1;
                expect.1 += 1;
                if expect.1 > 12 {
                    expect.1 = 1;
                    expect.0 += 1;
                }
            }
        }
    }

    #[test]
    fn timestamp_parses_to_nanoseconds() {
        let t = parse_timestamp("2023-11-16 18:17:03.9799600").unwrap();
        let want = i128::from(days_from_civil(2023, 11, 16)) * NS_PER_DAY
            + i128::from(18 * 3600 + 17 * 60 + 3) * 1_000_000_000
            + 979_960_000;
        assert_eq!(t, want);
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Ok(0));
        assert_eq!(parse_timestamp("1970-01-01T00:00:01.5"), Ok(1_500_000_000));
        assert_eq!(
            parse_timestamp("2024-02-29 00:00:00.000000001").map(|t| t % 10),
            Ok(1)
        );
    }

    #[test]
    fn timestamp_rejects_malformed_parts() {
        for (bad, why) in [
            ("2023-11-16", "expected"),
            ("2023-13-01 00:00:00", "month out of range"),
            ("2023-02-29 00:00:00", "day out of range"),
            ("2023-04-31 00:00:00", "day out of range"),
            ("23-11-16 00:00:00", "year"),
            ("2023-11-16 24:00:00", "hour out of range"),
            ("2023-11-16 18:60:00", "minute out of range"),
            ("2023-11-16 18:00:61", "second out of range"),
            ("2023-11-16 18:00", "HH:MM:SS"),
            ("2023-11-16 18:00:00.", "fraction"),
            ("2023-11-16 18:00:00.1234567890", "fraction"),
            ("2023-11-16 18:00:0x", "second"),
            ("2023/11/16 18:00:00", "YYYY-MM-DD"),
        ] {
            let err = parse_timestamp(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn rows_become_ms_after_the_earliest_row_and_crlf_is_handled() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n\
                    2023-11-16 23:59:59.5000000,10,20\r\n\
                    2023-11-17 00:00:00.7500000,30,40\r\n\
                    2023-11-16 23:59:59.0000000,50,60";
        let w = parse(text, ctx()).unwrap();
        let got: Vec<(f64, u32, u32)> = w
            .arrivals
            .iter()
            .map(|a| (a.at_ms, a.prompt_tokens, a.output_tokens))
            .collect();
        assert_eq!(got, [(0.0, 50, 60), (500.0, 10, 20), (1750.0, 30, 40)]);
        assert_eq!(w.dropped_rows, 0);
        assert_eq!(w.prefix_block_tokens, None);
    }

    #[test]
    fn header_only_gives_an_empty_workload() {
        let w = parse("TIMESTAMP,ContextTokens,GeneratedTokens", ctx()).unwrap();
        assert!(w.is_empty());
    }

    #[test]
    fn malformed_rows_name_line_and_field() {
        let h = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
        let cases: [(&str, &str); 6] = [
            ("2023-11-16 18:15:46.6805900,374\n", "azure.csv:2: field GeneratedTokens: missing column"),
            ("2023-11-16 18:15:46.6805900,374,44,9\n", "azure.csv:2: 4 columns, header has 3"),
            ("2023-11-16 18:15:46.6805900,374,4.5\n", "azure.csv:2: field GeneratedTokens: not an integer (\"4.5\")"),
            ("2023-11-16 18:15:46.6805900,-374,44\n", "azure.csv:2: field ContextTokens: negative (\"-374\")"),
            (
                "2023-11-31 18:15:46.6805900,374,44\n",
                "azure.csv:2: field TIMESTAMP: bad timestamp (\"2023-11-31 18:15:46.6805900\"): day out of range for the month",
            ),
            ("\n\n2023-11-16 18:15:46,1,1\nyesterday,1,1", "azure.csv:5: field TIMESTAMP: bad timestamp"),
        ];
        for (body, want) in cases {
            let err = parse_any(&format!("{h}{body}"), Path::new("azure.csv"), None).unwrap_err();
            assert!(err.to_string().starts_with(want), "got {err}, want {want}");
        }
    }

    #[test]
    fn shipped_slice_has_1500_rows_spanning_the_expected_time() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/azure_conv_head.csv");
        let w = load(&path).unwrap();
        assert_eq!(w.len(), 1500);
        assert_eq!(w.dropped_rows, 0);
        assert_eq!(
            w.source,
            crate::workload::Source::Trace {
                path: path.clone(),
                format: TraceFormat::Azure2023
            }
        );
        // First rows: 18:15:46.6805900 (374, 44) then 18:15:50.9951690 (396, 109).
        let a = &w.arrivals;
        assert_eq!(
            (a[0].at_ms, a[0].prompt_tokens, a[0].output_tokens),
            (0.0, 374, 44)
        );
        assert!((a[1].at_ms - 4314.579).abs() < 1e-6, "{}", a[1].at_ms);
        assert_eq!((a[1].prompt_tokens, a[1].output_tokens), (396, 109));
        assert!(a.windows(2).all(|p| p[0].at_ms <= p[1].at_ms));
        // Last row: 18:20:56.2090740 (955, 602).
        assert!((w.span_ms() - 309_528.484).abs() < 1e-6, "{}", w.span_ms());
        assert_eq!((a[1499].prompt_tokens, a[1499].output_tokens), (955, 602));
        assert!(a
            .iter()
            .all(|r| r.adapter.is_none() && r.prefix_blocks.is_empty()));
    }
}
