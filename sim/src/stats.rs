//! Small numeric and file helpers shared by the simulator, its report and the plots (and the `kvsched`
//! binary's `--json` output): one of each.

use std::io::{self, Write as _};
use std::path::Path;

/// The `p`-quantile (0 ≤ p ≤ 1) of `sorted` by nearest rank; `None` for no data.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let k = (last as f64 * p.clamp(0.0, 1.0)).round() as usize;
    Some(sorted[k.min(last)])
}

/// Writes `bytes` to `path` whole or not at all: a fresh temporary file in the same folder (`tempfile`),
/// synced, then renamed over `path`. On error nothing is left behind. The file gets the mode a plain
/// create would (0666 less the umask), not the temporary file's private 0600.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if path.file_name().is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path names no file",
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        // The mode given to open(2), which the kernel narrows by the umask.
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut file = builder.tempfile_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Why an I/O call failed, in the system's words without the path: the operating system's message
/// (`No such file or directory`), even from an error `tempfile` wrapped (its message names the
/// temporary file, which is no concern of the caller's).
pub fn io_reason(e: &io::Error) -> String {
    let text = e.to_string();
    let end = [" (os error", " at path "]
        .iter()
        .filter_map(|m| text.find(m))
        .min()
        .unwrap_or(text.len());
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn nearest_rank_and_no_data() {
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(51.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&v, 2.0), Some(100.0));
    }

    #[test]
    fn an_atomic_write_replaces_whole_or_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("kvsched-stats-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("out.txt");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let e = write_atomic(&dir.join("missing/out.txt"), b"x").unwrap_err();
        assert_eq!(io_reason(&e), "No such file or directory", "{e}");
        let left: Vec<_> = fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The written file's mode is 0666 narrowed by the umask (0644 under the usual 022), as a plain
    /// create's would be. Runs in a child process so that its umask does not touch the other tests.
    #[cfg(unix)]
    #[test]
    fn an_atomic_write_honours_the_umask() {
        use std::os::unix::fs::PermissionsExt as _;
        if let Some(p) = std::env::var_os("KVSCHED_UMASK_CHILD") {
            write_atomic(std::path::Path::new(&p), b"x").unwrap();
            return;
        }
        let dir = std::env::temp_dir().join(format!("kvsched-umask-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("out.txt");
        for (umask, mode) in [("022", 0o644), ("077", 0o600), ("002", 0o664)] {
            let _ = fs::remove_file(&p);
            let exe = std::env::current_exe().unwrap();
            let status = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
                .arg(exe)
                .args(["--exact", "stats::tests::an_atomic_write_honours_the_umask"])
                .env("KVSCHED_UMASK_CHILD", &p)
                .status()
                .unwrap();
            assert!(status.success());
            let got = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(got, mode, "umask {umask}: mode {got:o}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
