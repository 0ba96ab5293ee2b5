//! Writing results: stdout for data (human lines or JSON Lines), stderr for everything else,
//! colour only on a terminal without `NO_COLOR`, and times as readable UTC.

use std::io::{self, BufWriter, IsTerminal, Stdout, Write};
use std::path::Path;

use runjournal::state::RunStatus;
use runjournal::verify::Severity;

/// Standard output, line by line. Write errors are returned (a closed pipe is handled by the
/// caller, which exits quietly), never panicked on.
pub struct Out {
    writer: BufWriter<Stdout>,
    pub is_json: bool,
    pub has_color: bool,
}

impl Out {
    pub fn new(is_json: bool) -> Out {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
        Out {
            writer: BufWriter::new(io::stdout()),
            is_json,
            has_color: !is_json && !no_color && io::stdout().is_terminal(),
        }
    }

    pub fn line(&mut self, text: &str) -> io::Result<()> {
        self.writer.write_all(text.as_bytes())?;
        self.writer.write_all(b"\n")
    }

    /// One JSON Lines object; `kind` becomes its `"type"`, put first.
    pub fn json(&mut self, kind: &str, fields: serde_json::Value) -> io::Result<()> {
        let mut object = serde_json::Map::new();
        object.insert("type".to_string(), kind.into());
        if let serde_json::Value::Object(fields) = fields {
            object.extend(fields);
        }
        serde_json::to_writer(&mut self.writer, &serde_json::Value::Object(object))
            .map_err(io::Error::other)?;
        self.writer.write_all(b"\n")
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    /// `text` in a colour, when colour is on.
    pub fn paint(&self, text: &str, colour: Colour) -> String {
        if self.has_color {
            format!("\x1b[{}m{text}\x1b[0m", colour.code())
        } else {
            text.to_string()
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Colour {
    Red,
    Green,
    Yellow,
    Cyan,
    Dim,
}

impl Colour {
    fn code(self) -> &'static str {
        match self {
            Colour::Red => "31",
            Colour::Green => "32",
            Colour::Yellow => "33",
            Colour::Cyan => "36",
            Colour::Dim => "2",
        }
    }

    pub fn of_status(status: RunStatus) -> Option<Colour> {
        match status {
            RunStatus::Queued => None,
            RunStatus::Running => Some(Colour::Cyan),
            RunStatus::Complete => Some(Colour::Green),
            RunStatus::Failed => Some(Colour::Red),
            RunStatus::Stopped | RunStatus::Paused => Some(Colour::Yellow),
        }
    }

    pub fn of_severity(severity: Severity) -> Colour {
        match severity {
            Severity::Damaged | Severity::Unchecked => Colour::Red,
            Severity::Inconsistent => Colour::Yellow,
            Severity::Note => Colour::Dim,
        }
    }
}

/// A message for the person at the terminal, on stderr. A failure to write it changes nothing.
pub fn note(text: &str) {
    let _ = writeln!(io::stderr(), "journal-tools: {text}");
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SSZ` (UTC).
pub fn time(ms: u64) -> String {
    format_time(ms, "%Y-%m-%d %H:%M:%SZ")
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS.mmmZ` (UTC), for timelines.
pub fn time_ms(ms: u64) -> String {
    format_time(ms, "%Y-%m-%d %H:%M:%S%.3fZ")
}

fn format_time(ms: u64, format: &str) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{ms} ms"),
            |time| time.strftime(format).to_string(),
        )
}

/// `path` relative to `root` when it is inside it, else as it is.
pub fn shown_path(path: &Path, root: Option<&Path>) -> String {
    root.and_then(|root| path.strip_prefix(root).ok())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Left-aligned columns, padded to the widest cell; the last column is not padded. Each cell
/// is (plain text, text to print) so colour codes do not count towards the width.
pub fn table(rows: &[Vec<(String, String)>]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|column| {
            rows.iter()
                .filter_map(|row| row.get(column))
                .map(|(plain, _)| plain.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (column, (plain, shown)) in row.iter().enumerate() {
                line.push_str(shown);
                if column + 1 < row.len() {
                    let pad = widths[column].saturating_sub(plain.chars().count()) + 2;
                    line.push_str(&" ".repeat(pad));
                }
            }
            line
        })
        .collect()
}

/// A cell without colour.
pub fn cell(text: impl Into<String>) -> (String, String) {
    let text = text.into();
    (text.clone(), text)
}

/// `1 run`, `2 runs`.
pub fn plural(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("{count} {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// The name serde gives a value (an enum's wire name, say), without quotes.
pub fn wire_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_string(),
    }
}
