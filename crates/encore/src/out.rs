//! Output that never panics. `outln!`/`out!` write to stdout and return the
//! `io::Result` (a closed pipe, as in `encore generate | head -c 5`, is an error the
//! command returns, and `main` turns into a quiet exit); `errln!` writes to stderr and
//! ignores failures (there is nowhere left to report them).

use std::fmt;
use std::io::{self, Write};

/// Write to stdout (and flush, so streamed text shows at once).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::stdout(format_args!($($arg)*))
    };
}

/// Write a line to stdout.
macro_rules! outln {
    () => {
        $crate::out::stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Write a line to stderr, ignoring failure.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {errln, out, outln};

pub fn stdout(args: fmt::Arguments<'_>) -> io::Result<()> {
    let mut o = io::stdout().lock();
    o.write_fmt(args)?;
    o.flush()
}

pub fn stderr(args: fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// Whether `e` (or any of its causes) is a write to a closed pipe.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// The exit status after stdout's reader went away: 128 + SIGPIPE, what a shell reports
/// for a process killed by the signal (`yes | head -1`).
pub const BROKEN_PIPE_STATUS: u8 = 141;
