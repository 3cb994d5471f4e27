//! Text from data, made safe to print: one helper for every message, log line and output file
//! that shows a file name, path, class name, COCO `file_name` or stream URL.
//!
//! - [`escape`] / [`path`]: control characters (an ANSI escape sequence, a carriage return, a
//!   NUL, a C1 control) and the invisible bidirectional overrides (U+202A–U+202E,
//!   U+2066–U+2069, which reorder what a terminal shows) are written as their escapes
//!   (`\u{1b}`), so a hostile name cannot drive the terminal or disguise itself.
//! - [`redact`]: the credentials of every URL in a text (`rtsp://user:pass@host` →
//!   `rtsp://user:***@host`; a user alone, often a token, → `***@`), for every line that shows a
//!   stream source, its errors (ffmpeg repeats the URL) and the files written.
//! - [`outln!`](outln), `out!`, `errln!`, `err!`: `println!` and its kin through [`message`], the
//!   only way the library and the commands print (an architecture test holds `src/` to it, and
//!   to [`path`] rather than `Path::display`).

use std::borrow::Cow;
use std::fmt;
use std::path::Path;

/// Whether `c` is shown escaped.
fn hidden(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with control characters and bidirectional overrides escaped (`\u{1b}`); borrowed when
/// there is none.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if hidden(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A path for messages: as `Path::display`, with [`escape`] applied.
pub fn path<P: AsRef<Path> + ?Sized>(p: &P) -> Shown<'_> {
    Shown(p.as_ref())
}

/// See [`path`].
pub struct Shown<'a>(&'a Path);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0.to_string_lossy();
        f.write_str(&escape(&s))
    }
}

/// `s` with the credentials of every `scheme://user:password@host` in it replaced (see the
/// module docs), then [`escape`]d. Borrowed when nothing changes.
pub fn redact(s: &str) -> Cow<'_, str> {
    match redact_only(s) {
        Cow::Borrowed(b) => escape(b),
        Cow::Owned(o) => Cow::Owned(escape(&o).into_owned()),
    }
}

/// [`redact`] without the escaping.
fn redact_only(s: &str) -> Cow<'_, str> {
    let mut out = String::new();
    let mut rest = s;
    let mut changed = false;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // The authority ends at the first `/`, `?`, `#` or blank.
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let user = &authority[..at];
                match user.split_once(':') {
                    Some((name, _)) => {
                        out.push_str(name);
                        out.push_str(":***");
                    }
                    None => out.push_str("***"),
                }
                out.push_str(&authority[at..]);
                changed = true;
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(s)
    }
}

/// A whole message of one or more lines (an error chain, a log line): URL credentials redacted,
/// control characters other than newline and tab escaped.
pub fn message(s: &str) -> Cow<'_, str> {
    let r = redact_only(s);
    if !r.chars().any(|c| c != '\n' && c != '\t' && hidden(c)) {
        return r;
    }
    Cow::Owned(
        r.split('\n')
            .map(|l| {
                l.split('\t')
                    .map(|p| escape(p).into_owned())
                    .collect::<Vec<_>>()
                    .join("\t")
            })
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// `std::io::Write` to stderr through [`message`]: the writer of the command line's log lines.
pub struct CleanStderr;

impl std::io::Write for CleanStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(message(&text).as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Writes `s` to stdout (what [`outln!`](outln) and `out!` print). When stdout is closed (the
/// reader of a pipe ended, as in `yolo9 detect … | head -1`), the command ends quietly as Unix
/// tools do: the process is ended by `SIGPIPE` with its default action, without a panic or a
/// message (`println!` would panic). Every output file is written atomically, so ending there
/// leaves each of them whole (or not yet written). Other write errors are ignored, as a
/// terminal that went away must not fail a training run.
#[doc(hidden)]
pub fn write_stdout(s: &str) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    let r = o.write_all(s.as_bytes()).and_then(|()| o.flush());
    if let Err(e) = r {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            stdout_closed();
        }
    }
}

/// Ends the process as a Unix tool does when its stdout pipe closes.
fn stdout_closed() -> ! {
    #[cfg(unix)]
    // SAFETY: restoring a signal's default action and raising it in this process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(141)
}

/// `println!` through [`message`]: the writer of every line a command prints on stdout (file
/// names, class names and stream URLs in it come out escaped and redacted); a closed stdout ends
/// the command quietly ([`write_stdout`]).
#[allow(unused_macros)] // the detector-only build prints nothing
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::text::write_stdout(&::std::format!(
            "{}\n",
            $crate::text::message(&::std::format!($($arg)*))
        ))
    };
}
#[allow(unused_imports)]
pub(crate) use outln;

/// `print!` through [`message`] (a block of lines that ends with its own line break); a closed
/// stdout ends the command quietly ([`write_stdout`]).
#[allow(unused_macros)] // the detector-only build prints nothing
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::text::write_stdout(&$crate::text::message(&::std::format!($($arg)*)))
    };
}
#[allow(unused_imports)]
pub(crate) use out;

/// `eprintln!` through [`message`]: the writer of every line a command prints on stderr
/// outside the log (`tracing` lines go through [`CleanStderr`]).
#[allow(unused_macros)] // the detector-only build prints nothing
macro_rules! errln {
    ($($arg:tt)*) => {
        ::std::eprintln!("{}", $crate::text::message(&::std::format!($($arg)*)))
    };
}
#[allow(unused_imports)]
pub(crate) use errln;

/// `eprint!` through [`message`].
#[allow(unused_macros)] // the detector-only build prints nothing
macro_rules! err {
    ($($arg:tt)*) => {
        ::std::eprint!("{}", $crate::text::message(&::std::format!($($arg)*)))
    };
}
#[allow(unused_imports)]
pub(crate) use err;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_redactions() {
        assert!(matches!(escape("plain.jpg"), Cow::Borrowed(_)));
        assert_eq!(escape("a\u{1b}[2Jb\r"), "a\\u{1b}[2Jb\\u{d}");
        assert_eq!(escape("evil\u{202e}gpj.exe"), "evil\\u{202e}gpj.exe");
        assert_eq!(
            path(Path::new("/d/x\u{7}.jpg")).to_string(),
            "/d/x\\u{7}.jpg"
        );
        assert_eq!(
            redact("rtsp://admin:s3cret@10.0.0.2:554/live?x=1"),
            "rtsp://admin:***@10.0.0.2:554/live?x=1"
        );
        assert_eq!(
            redact("a: https://TOKEN@h/x and rtmp://u:p:q@h2 end"),
            "a: https://***@h/x and rtmp://u:***@h2 end"
        );
        assert!(matches!(redact("http://host/a@b"), Cow::Borrowed(_)));
        assert_eq!(redact("no url"), "no url");
        assert_eq!(
            message("error: a\n  b: rtsp://u:p@h/x\u{1b}[0m\tc"),
            "error: a\n  b: rtsp://u:***@h/x\\u{1b}[0m\tc"
        );
    }
}
