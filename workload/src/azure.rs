//! Reader for the Azure LLM inference trace 2023 (`Azure/AzurePublicDataset`,
//! `data/AzureLLMInferenceTrace_{code,conv}.csv`; CC-BY-4.0, Patel et al., "Splitwise", ISCA 2024).
//!
//! ```text
//! TIMESTAMP,ContextTokens,GeneratedTokens
//! 2023-11-16 18:15:46.6805900,374,44
//! ```
//!
//! `TIMESTAMP` is a naive wall-clock time (no time zone) with up to 9 fractional digits (the files
//! have 7). `jiff` parses it as a civil date-time, counted in nanoseconds from 1970-01-01 00:00:00 of
//! the same naive clock; arrival times are then milliseconds after the earliest row. `ContextTokens` is the prompt length and `GeneratedTokens` the output length.
//! The published files use `\r\n` line endings and have no trailing newline; both are handled.

use jiff::civil::DateTime;

use super::{clip, parse_tokens, Arrival, Builder, Csv, Ctx, TraceError, TraceErrorKind};
use super::{TraceFormat, Workload};

/// The columns this reader needs (a header names them in any order).
pub const HEADER: [&str; 3] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];

/// Parses Azure trace text (header first). See the [module docs](self).
pub(crate) fn parse(text: &str, ctx: Ctx<'_>) -> Result<Workload, TraceError> {
    let mut csv = Csv::new(text, ctx, &HEADER)?;

    // (time in ns, arrival with a placeholder time); times are rebased once the minimum is known.
    let mut timed = Vec::new();
    while let Some((n, row)) = csv.next_row()? {
        let [ts, prompt, output] = csv.fields(n, &row)?;
        let at_ns = parse_timestamp(ts).map_err(|why| {
            ctx.err(
                n,
                Some(HEADER[0]),
                TraceErrorKind::BadTimestamp {
                    value: clip(ts),
                    why: why.0,
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

/// Parses `YYYY-MM-DD HH:MM:SS[.fraction]` (ISO 8601 as `jiff` reads a civil date-time: a `T` may
/// replace the space, up to 9 fractional digits) into nanoseconds since 1970-01-01 00:00:00 on the
/// same naive clock.
///
/// # Errors
///
/// [`BadTimestamp`]: jiff's description of the first part that is malformed or out of range.
pub fn parse_timestamp(s: &str) -> Result<i128, BadTimestamp> {
    let t: DateTime = s
        .trim()
        .parse()
        .map_err(|e: jiff::Error| BadTimestamp(e.to_string()))?;
    Ok(t.duration_since(DateTime::constant(1970, 1, 1, 0, 0, 0, 0))
        .as_nanos())
}

/// A timestamp [`parse_timestamp`] refused: jiff's description of the part that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadTimestamp(pub String);

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{load, parse as parse_any};

    fn ctx() -> Ctx<'static> {
        Ctx {
            path: Path::new("azure.csv"),
        }
    }

    #[test]
    fn timestamp_parses_to_nanoseconds() {
        let t = parse_timestamp("2023-11-16 18:17:03.9799600").unwrap();
        // 2023-11-16 is day 19,677 after 1970-01-01.
        let want = 19_677 * 86_400 * 1_000_000_000
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
            (
                "2023-13-01 00:00:00",
                "'month' is not in the required range",
            ),
            ("2023-02-29 00:00:00", "'day' for `2023-02` is invalid"),
            ("2023-04-31 00:00:00", "'day' for `2023-04` is invalid"),
            ("23-11-16 00:00:00", "year"),
            ("2023-11-16 24:00:00", "'hour' is not in the required range"),
            (
                "2023-11-16 18:60:00",
                "'minute' is not in the required range",
            ),
            (
                "2023-11-16 18:00:61",
                "'second' is not in the required range",
            ),
            ("2023-11-16 18:00:00.", "fractional seconds"),
            ("2023-11-16 18:00:00.1234567890", "unparsed input"),
            ("2023-11-16 18:00:0x", "second"),
            ("2023/11/16 18:00:00", "month"),
        ] {
            let err = parse_timestamp(bad).unwrap_err();
            assert!(err.0.contains(why), "{bad}: {err}");
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
                "azure.csv:2: field TIMESTAMP: bad timestamp (\"2023-11-31 18:15:46.6805900\"): parsed date is not valid: parameter 'day' for `2023-11` is invalid",
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
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/azure_conv_head.csv");
        let w = load(&path).unwrap();
        assert_eq!(w.len(), 1500);
        assert_eq!(w.dropped_rows, 0);
        assert_eq!(
            w.source,
            crate::Source::Trace {
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
