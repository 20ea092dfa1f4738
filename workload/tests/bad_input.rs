//! The bad-input matrix for trace files (DESIGN.md §5, docs/RELIABILITY.md): every malformed trace is
//! refused with a typed reason that names the file, and the file is left untouched.

use std::path::PathBuf;

use kvsched_workload::{self as workload, TraceErrorKind, TraceFormat};

/// Writes `text` to `name` in `dir` and returns its path.
fn file(dir: &tempfile::TempDir, name: &str, text: &[u8]) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

type IsKind = fn(&TraceErrorKind) -> bool;

#[test]
fn malformed_trace_files_are_refused_with_a_typed_reason() {
    let dir = tempfile::tempdir().unwrap();
    let azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
    let burst = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n";
    let cases: Vec<(&str, Vec<u8>, IsKind)> = vec![
        ("empty", b"".to_vec(), |k| *k == TraceErrorKind::Empty),
        ("blank lines only", b"\n \n".to_vec(), |k| *k == TraceErrorKind::Empty),
        ("unknown format", b"a,b,c\n1,2,3\n".to_vec(), |k| matches!(k, TraceErrorKind::UnknownFormat(_))),
        ("not UTF-8", b"\xff\xfe\x00".to_vec(), |k| *k == TraceErrorKind::NotUtf8),
        ("Azure: not an integer", format!("{azure}2023-11-16 18:15:46.6805900,x,1\n").into_bytes(), |k| matches!(k, TraceErrorKind::NotAnInteger(_))),
        ("Azure: bad timestamp", format!("{azure}yesterday,1,1\n").into_bytes(), |k| matches!(k, TraceErrorKind::BadTimestamp { .. })),
        ("Azure: missing column", format!("{azure}2023-11-16 18:15:46.6805900,1\n").into_bytes(), |k| *k == TraceErrorKind::MissingColumn),
        ("Azure: extra column", format!("{azure}2023-11-16 18:15:46.6805900,1,1,1\n").into_bytes(), |k| matches!(k, TraceErrorKind::ExtraColumns { .. })),
        ("BurstGPT: negative", format!("{burst}5,ChatGPT,-1,18,17,Conversation log\n").into_bytes(), |k| matches!(k, TraceErrorKind::Negative(_) | TraceErrorKind::NotAnInteger(_))),
        ("Mooncake: bad JSON", b"{\"timestamp\": 0,\n".to_vec(), |k| matches!(k, TraceErrorKind::Json(_))),
        ("Mooncake: missing field", b"{\"timestamp\": 0, \"output_length\": 1}\n".to_vec(), |k| *k == TraceErrorKind::MissingField),
        ("Mooncake: wrong type", b"{\"timestamp\": 0, \"input_length\": \"many\", \"output_length\": 1, \"hash_ids\": []}\n".to_vec(), |k| matches!(k, TraceErrorKind::WrongType { .. })),
        ("Mooncake: out of range", b"{\"timestamp\": 0, \"input_length\": 99999999999999, \"output_length\": 1, \"hash_ids\": []}\n".to_vec(), |k| matches!(k, TraceErrorKind::OutOfRange { .. })),
    ];
    for (case, bytes, want) in cases {
        let path = file(&dir, "trace.txt", &bytes);
        let err = workload::load(&path).expect_err(case);
        assert!(want(&err.reason), "{case}: {err} ({:?})", err.reason);
        assert_eq!(err.path, path, "{case}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{case}: file untouched"
        );
    }
    let path = file(&dir, "trace.csv", burst.as_bytes());
    let err = workload::load_as(&path, TraceFormat::Azure2023).unwrap_err();
    assert!(
        matches!(err.reason, TraceErrorKind::BadHeader { .. }),
        "{err}"
    );
    let err = workload::load(dir.path().join("missing.csv")).unwrap_err();
    assert!(
        matches!(
            err.reason,
            TraceErrorKind::Io {
                kind: std::io::ErrorKind::NotFound,
                ..
            }
        ),
        "{err}"
    );
}
