//! What the CLI prints. Every command builds a typed result and hands it to
//! [`Output::print`]; `Output` alone decides between JSON (`--json`: one object on
//! stdout), text for people, and no text (`--quiet`). Diagnostics go to stderr in every
//! mode: errors and warnings always, notes and notices unless `--quiet`.
//!
//! Names from trees, the file system and storage are hostile (larder_engine's `names`
//! module): text escapes each name where it is put in (`escape_name`), and every line
//! written to stderr, the log included, passes [`stderr_line`] or [`SafeLines`], which
//! escape any control character left (`escape_controls`). An error object under
//! `--json` is `{"error": MESSAGE, "exit_code": CODE}`.

mod bar;
pub mod disk_index;
pub mod tree;

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;
use std::time::Duration;

use larder_engine::{escape_controls, escape_name, Warning};
use serde::Serialize;
use serde_json::json;

pub use bar::Bar;

/// A command's result: [`Output`] prints its `Serialize` form under `--json`, its text
/// otherwise. A new field goes into the struct (JSON) and, if people should see it,
/// into [`Render::write_text`].
pub trait Render: Serialize {
    /// Whether `--quiet` silences the text. It does, except for output that was asked
    /// for and has always shown under `--quiet`: `cluster status`, `snapshots
    /// --cluster`, `gen --stats`, the cuts of `chunk --device gpu --cuts`.
    const QUIET_SILENCES_TEXT: bool = true;

    /// The text on stdout.
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let _ = w;
        Ok(())
    }

    /// Lines shown after the text as notes on stderr (`larder: LINE`; not under
    /// `--quiet`), for results that were only ever notes.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// Problems shown before the text on stderr (`larder: LINE`), even under
    /// `--quiet`; the JSON carries them instead.
    fn problems(&self) -> Vec<String> {
        Vec::new()
    }
}

/// `--json` and `--quiet`. Under both, JSON is printed and notes are not.
#[derive(Clone, Copy)]
pub struct Output {
    json: bool,
    quiet: bool,
}

/// Megabytes (10^6 bytes) with one decimal, as most texts show sizes.
pub fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// A name or other text from storage or the file system, escaped for a line of text
/// (`escape_name`).
pub fn shown(text: &str) -> String {
    escape_name(text.as_bytes())
}

/// Seconds rounded to 0.1 ms, as every JSON shows durations.
pub fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 1e4
}

/// The line that closes a backup's or restore's text when some paths failed (each
/// was named in a warning on stderr as it happened).
pub fn write_failed_paths(w: &mut dyn Write, warnings: &[Warning]) -> io::Result<()> {
    let errors = warnings.iter().filter(|w| w.is_error).count();
    if errors > 0 {
        writeln!(
            w,
            "  {errors} path(s) could not be processed (see warnings above)"
        )?;
    }
    Ok(())
}

/// Writes `larder: [LABEL: ]TEXT` on stderr, every control character of `text` (a
/// raw name in an error message, say) escaped: the one way diagnostics reach stderr.
pub fn stderr_line(label: Option<&str>, text: &str) {
    let text = escape_controls(text.as_bytes());
    match label {
        Some(label) => eprintln!("larder: {label}: {text}"),
        None => eprintln!("larder: {text}"),
    }
}

/// The JSON object of an error that ended larder with exit code `code`.
pub fn error_json(message: &str, code: u8) -> serde_json::Value {
    json!({ "error": message, "exit_code": code })
}

/// A writer for the log (`LARDER_LOG`): each write, one whole event as the log
/// formats it, made safe with `escape_controls` but for its final newline.
pub struct SafeLines<W: Write>(pub W);

impl<W: Write> Write for SafeLines<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let (body, end) = match buf.strip_suffix(b"\n") {
            Some(body) => (body, "\n"),
            None => (buf, ""),
        };
        write!(self.0, "{}{end}", escape_controls(body))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Output {
    pub fn new(json: bool, quiet: bool) -> Self {
        Self { json, quiet }
    }

    /// Prints a command's result on stdout.
    pub fn print<R: Render>(&self, result: &R) -> io::Result<()> {
        self.emit(result, &mut io::stdout().lock())
    }

    /// Prints a command's result on stderr, for a command whose stdout carries its
    /// data (`gen`).
    pub fn print_beside_data<R: Render>(&self, result: &R) -> io::Result<()> {
        self.emit(result, &mut io::stderr().lock())
    }

    fn emit<R: Render>(&self, result: &R, sink: &mut dyn Write) -> io::Result<()> {
        let mut w = BufWriter::new(sink);
        if self.json {
            // Through a `Value`, whose objects keep their keys sorted: the order every
            // JSON object larder prints has had.
            let value = serde_json::to_value(result).map_err(io::Error::other)?;
            writeln!(w, "{value}")?;
            return w.flush();
        }
        for line in result.problems() {
            stderr_line(None, &line);
        }
        if !self.quiet || !R::QUIET_SILENCES_TEXT {
            result.write_text(&mut w)?;
        }
        w.flush()?;
        for line in result.notes() {
            self.note(&line);
        }
        Ok(())
    }

    /// Whether progress bars may be drawn (text mode; [`Bar`] also wants a terminal).
    pub fn shows_progress(&self) -> bool {
        !self.json && !self.quiet
    }

    /// Reports the error that ends larder with exit code 1.
    pub fn error(&self, e: &anyhow::Error) {
        let message = format!("{e:#}");
        if self.json {
            println!("{}", error_json(&message, 1));
        }
        stderr_line(Some("error"), &message);
    }

    /// Reports a usage error (bad arguments): nothing was done. Returns exit code 2,
    /// the code clap uses for the errors it catches itself.
    pub fn usage(&self, msg: &str) -> ExitCode {
        if self.json {
            println!("{}", error_json(msg, 2));
        }
        stderr_line(Some("error"), msg);
        ExitCode::from(2)
    }

    /// For a command whose output is raw data, never JSON: under `--json`, the usage
    /// error `msg` (exit code 2).
    pub fn refuse_json(&self, msg: &str) -> Option<ExitCode> {
        self.json.then(|| self.usage(msg))
    }

    /// Names a problem that did not stop the command (its exit code says so).
    pub fn error_line(&self, msg: &str) {
        stderr_line(Some("error"), msg);
    }

    /// `msg` is raw text (names in it need not be escaped, but may be).
    pub fn warn(&self, msg: &str) {
        stderr_line(Some("warning"), msg);
    }

    pub fn note(&self, msg: &str) {
        if !self.quiet {
            stderr_line(None, msg);
        }
    }

    /// A problem with one path, as a run reports it: an error (the command's exit
    /// code says so) always, a notice (the result is complete) unless `--quiet`.
    pub fn path_warning(&self, w: &Warning) {
        match (w.is_error, self.quiet) {
            (true, _) => stderr_line(Some("warning"), &w.to_string()),
            (false, false) => stderr_line(Some("notice"), &w.to_string()),
            (false, true) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Sample {
        zebra: u32,
        apple: &'static str,
    }

    impl Render for Sample {
        fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
            writeln!(w, "{} {}", self.apple, self.zebra)
        }
    }

    #[derive(Serialize)]
    struct Asked(u32);

    impl Render for Asked {
        const QUIET_SILENCES_TEXT: bool = false;

        fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
            writeln!(w, "asked {}", self.0)
        }
    }

    fn printed<R: Render>(out: &Output, result: &R) -> String {
        let mut sink = Vec::new();
        out.emit(result, &mut sink).unwrap();
        String::from_utf8(sink).unwrap()
    }

    /// JSON objects keep their keys sorted, as larder's JSON always had them, whatever
    /// order a result's fields are declared in.
    #[test]
    fn json_keys_are_sorted() {
        let sample = Sample {
            zebra: 1,
            apple: "a",
        };
        let json = Output::new(true, false);
        assert_eq!(printed(&json, &sample), "{\"apple\":\"a\",\"zebra\":1}\n");
        // --json wins over --quiet.
        let both = Output::new(true, true);
        assert_eq!(printed(&both, &sample), "{\"apple\":\"a\",\"zebra\":1}\n");
    }

    /// A warning names its path escaped in text and exactly in JSON, whatever its
    /// bytes: a path that is not UTF-8 once made the whole `--json` output an error.
    #[test]
    fn warnings_show_hostile_paths_escaped_and_serialize_them_exactly() {
        use std::os::unix::ffi::OsStrExt;
        let w = Warning {
            path: std::ffi::OsStr::from_bytes(b"/a\n\x1b[2J\xff").into(),
            message: "skipped".into(),
            is_error: false,
        };
        assert_eq!(w.to_string(), "/a\\x0a\\x1b[2J\\xff: skipped");
        assert_eq!(
            serde_json::to_value(&w).unwrap(),
            json!({
                "path": "/a\n\x1b[2J\u{fffd}",
                "path_hex": "2f610a1b5b324aff",
                "message": "skipped",
                "is_error": false,
            })
        );
    }

    /// The log's lines: controls escaped, each event's final newline kept.
    #[test]
    fn log_lines_escape_controls_but_keep_their_end() {
        let mut sink = SafeLines(Vec::new());
        sink.write_all(b"WARN caching /x\x1b[2J\nFORGED\n").unwrap();
        sink.write_all(b"no end\r").unwrap();
        assert_eq!(
            String::from_utf8(sink.0).unwrap(),
            "WARN caching /x\\x1b[2J\\x0aFORGED\nno end\\x0d"
        );
    }

    #[test]
    fn error_objects_carry_their_exit_code() {
        assert_eq!(
            error_json("bad", 2).to_string(),
            r#"{"error":"bad","exit_code":2}"#
        );
    }

    #[test]
    fn quiet_silences_text_unless_the_result_was_asked_for() {
        let sample = Sample {
            zebra: 1,
            apple: "a",
        };
        assert_eq!(printed(&Output::new(false, false), &sample), "a 1\n");
        assert_eq!(printed(&Output::new(false, true), &sample), "");
        assert_eq!(printed(&Output::new(false, true), &Asked(7)), "asked 7\n");
    }
}
