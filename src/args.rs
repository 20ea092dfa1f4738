//! The subcommands' argument parsing, one way for all: clap, with the subcommand's name in messages.

use std::process::ExitCode;

/// Parses the arguments after `kvsched <command>` into `T`.
pub fn parse<T: clap::Parser>(command: &str, args: &[String]) -> Result<T, clap::Error> {
    T::try_parse_from(std::iter::once(command.to_string()).chain(args.iter().cloned()))
}

/// Prints a parse result that is not a run: help to stdout with status 0, a usage mistake to stderr
/// with status 2.
pub fn exit(e: &clap::Error) -> ExitCode {
    let _ = e.print();
    ExitCode::from(if e.use_stderr() { 2 } else { 0 })
}

/// A value parser for one of `all`, by `name`; the error lists the names.
pub fn one_of<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    move |v| {
        all.iter().copied().find(|&t| name(t) == v).ok_or_else(|| {
            let names: Vec<_> = all.iter().map(|&t| name(t)).collect();
            format!("unknown value {v:?} ({})", names.join(", "))
        })
    }
}
