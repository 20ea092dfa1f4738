//! The bad-input matrix for trace files (DESIGN.md §5, docs/RELIABILITY.md): every malformed trace is
//! refused with a typed reason that names the file, and the file is left untouched.

use std::path::PathBuf;

use kvsched_workload::{self as workload, TraceErrorKind, TraceFormat};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("kvsched-bad-input-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn file(&self, name: &str, text: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

type IsKind = fn(&TraceErrorKind) -> bool;

#[test]
fn malformed_trace_files_are_refused_with_a_typed_reason() {
    let dir = TempDir::new("trace");
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
        let path = dir.file("trace.txt", &bytes);
        let err = workload::load(&path).expect_err(case);
        assert!(want(&err.reason), "{case}: {err} ({:?})", err.reason);
        assert_eq!(err.path, path, "{case}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{case}: file untouched"
        );
    }
    let path = dir.file("trace.csv", burst.as_bytes());
    let err = workload::load_as(&path, TraceFormat::Azure2023).unwrap_err();
    assert!(
        matches!(err.reason, TraceErrorKind::BadHeader { .. }),
        "{err}"
    );
    let err = workload::load(dir.0.join("missing.csv")).unwrap_err();
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
