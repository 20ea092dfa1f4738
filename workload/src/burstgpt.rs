//! Reader for BurstGPT CSV traces (`HPMLL/BurstGPT`, `data/BurstGPT_*.csv`; CC-BY-4.0, Wang et al.,
//! "BurstGPT: A Real-World Workload Dataset to Optimize LLM Serving Systems", KDD 2025).
//!
//! ```text
//! Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
//! 5,ChatGPT,472,18,490,Conversation log
//! ```
//!
//! - `Timestamp`: seconds from 0:00 on the trace's first day (a non-negative number); kept as an
//!   offset, converted to ms.
//! - `Request tokens` / `Response tokens`: prompt and output lengths. Rows where either is 0 are failed
//!   requests; they are dropped and counted in [`Workload::dropped_rows`].
//! - `Total tokens` must be an integer (it is request + response in the data; not checked further).
//! - `Model` (`ChatGPT`, `GPT-4`) and `Log Type` (`Conversation log`, `API log`) are not used.

use super::{parse_nonneg_f64, parse_tokens, parse_uint, Arrival, Builder, Csv, Ctx, TraceError};
use super::{TraceFormat, Workload};

/// The columns this reader needs (a header names them in any order).
pub const HEADER: [&str; 6] = [
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
];

/// Parses BurstGPT CSV text (header first). See the [module docs](self).
pub(crate) fn parse(text: &str, ctx: Ctx<'_>) -> Result<Workload, TraceError> {
    let mut csv = Csv::new(text, ctx, &HEADER)?;
    let mut b = Builder::new();
    while let Some((n, row)) = csv.next_row()? {
        let [ts, _model, request, response, total, _log_type] = csv.fields(n, &row)?;
        let seconds = parse_nonneg_f64(ts).map_err(|r| ctx.err(n, Some(HEADER[0]), r))?;
        let prompt_tokens = parse_tokens(request).map_err(|r| ctx.err(n, Some(HEADER[2]), r))?;
        let output_tokens = parse_tokens(response).map_err(|r| ctx.err(n, Some(HEADER[3]), r))?;
        parse_uint(total, u64::MAX).map_err(|r| ctx.err(n, Some(HEADER[4]), r))?;
        b.push(Arrival {
            at_ms: seconds * 1000.0,
            prompt_tokens,
            output_tokens,
            adapter: None,
            prefix_blocks: Vec::new(),
        });
    }
    Ok(b.finish(ctx.source(TraceFormat::BurstGpt), None))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::{load, parse as parse_any};

    const H: &str = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n";

    #[test]
    fn shipped_sample_has_54_rows_of_which_3_are_dropped() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/burstgpt1_head54.csv");
        let w = load(path).unwrap();
        // 2 rows have 0 request tokens and 3 have 0 response tokens; they overlap in 2 rows
        // (t = 1106 s and 2320 s: 0/0), plus t = 2401 s (612/0).
        assert_eq!(w.dropped_rows, 3);
        assert_eq!(w.len(), 54 - 3);
        let a = &w.arrivals;
        assert_eq!(
            (a[0].at_ms, a[0].prompt_tokens, a[0].output_tokens),
            (5000.0, 472, 18)
        );
        assert_eq!(
            (a[50].at_ms, a[50].prompt_tokens, a[50].output_tokens),
            (3_298_000.0, 344, 156)
        );
        assert!(a
            .iter()
            .all(|r| r.at_ms != 1_106_000.0 && r.at_ms != 2_320_000.0 && r.at_ms != 2_401_000.0));
        assert!(a.windows(2).all(|p| p[0].at_ms <= p[1].at_ms));
    }

    #[test]
    fn fractional_seconds_are_accepted() {
        let w = parse_any(
            &format!("{H}1.25,GPT-4,3,4,7,API log\n"),
            Path::new("b.csv"),
            None,
        )
        .unwrap();
        assert_eq!(w.arrivals[0].at_ms, 1250.0);
    }

    #[test]
    fn malformed_rows_name_line_and_field() {
        let cases = [
            (
                "5,ChatGPT,472,18,490\n",
                "b.csv:2: field Log Type: missing column",
            ),
            (
                "5,ChatGPT,47x,18,490,API log\n",
                "b.csv:2: field Request tokens: not an integer (\"47x\")",
            ),
            (
                "5,ChatGPT,472,,490,API log\n",
                "b.csv:2: field Response tokens: not an integer (\"\")",
            ),
            (
                "5,ChatGPT,472,18,4.9,API log\n",
                "b.csv:2: field Total tokens: not an integer (\"4.9\")",
            ),
            (
                "NaN,ChatGPT,472,18,490,API log\n",
                "b.csv:2: field Timestamp: not a number (\"NaN\")",
            ),
            (
                "-5,ChatGPT,472,18,490,API log\n",
                "b.csv:2: field Timestamp: negative (\"-5\")",
            ),
            (
                "5,ChatGPT,472,18,490,API log,extra\n",
                "b.csv:2: 7 columns, header has 6",
            ),
        ];
        for (row, want) in cases {
            let err = parse_any(&format!("{H}{row}"), Path::new("b.csv"), None).unwrap_err();
            assert_eq!(err.to_string(), want);
        }
    }
}
