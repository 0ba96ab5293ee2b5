//! Writing results: stdout for data (human lines or JSON Lines), stderr for everything else,
//! colour only on a terminal without `NO_COLOR`. What the lines say comes from the library
//! (`runjournal::show`); this is only where they go.

use std::io::{self, BufWriter, IsTerminal, Stdout, Write};
use std::path::Path;

use runjournal::show::{self, Cell, Tone};

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

    /// One line as it is: for lines the library rendered (escaped, with this binary's colours)
    /// or made only of this binary's words. A line that holds a run's or a file's text goes
    /// through [`Out::text_line`].
    pub fn line(&mut self, text: &str) -> io::Result<()> {
        self.writer.write_all(text.as_bytes())?;
        self.writer.write_all(b"\n")
    }

    /// One line of text that may hold a run's or a file's text, its control characters shown
    /// visibly ([`show::escape_control`]).
    pub fn text_line(&mut self, text: &str) -> io::Result<()> {
        self.line(&show::escape_control(text))
    }

    /// One JSON Lines object, a document of the library (`runjournal::json`); `kind` becomes
    /// its `"type"`, put first.
    pub fn json(&mut self, kind: &str, document: &impl serde::Serialize) -> io::Result<()> {
        let mut object = serde_json::Map::new();
        object.insert("type".to_string(), kind.into());
        if let serde_json::Value::Object(fields) =
            serde_json::to_value(document).map_err(io::Error::other)?
        {
            object.extend(fields);
        }
        serde_json::to_writer(&mut self.writer, &serde_json::Value::Object(object))
            .map_err(io::Error::other)?;
        self.writer.write_all(b"\n")
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    /// `text` in the colour of `tone`, when colour is on.
    pub fn paint(&self, text: &str, tone: Tone) -> String {
        if self.has_color {
            format!("\x1b[{}m{text}\x1b[0m", colour_code(tone))
        } else {
            text.to_string()
        }
    }

    /// Prints a table ([`show::table_lines`]), each line after `indent`.
    pub fn table(&mut self, rows: &[Vec<Cell>], indent: &str) -> io::Result<()> {
        let paint = |text: &str, tone: Tone| self.paint(text, tone);
        let lines = show::table_lines(rows, &paint);
        for line in lines {
            self.line(&format!("{indent}{line}"))?;
        }
        Ok(())
    }
}

/// The ANSI colour of a tone.
fn colour_code(tone: Tone) -> &'static str {
    match tone {
        Tone::Bad => "31",
        Tone::Good => "32",
        Tone::Warning => "33",
        Tone::Active => "36",
        Tone::Quiet => "2",
    }
}

/// A message for the person at the terminal, on stderr, with its control characters shown
/// visibly ([`show::escape_control`]: it may quote a run's text). A failure to write it changes
/// nothing.
pub fn note(text: &str) {
    let _ = writeln!(
        io::stderr(),
        "journal-tools: {}",
        show::escape_control(text)
    );
}

/// `path` relative to `root` when it is inside it, else as it is; its control characters
/// shown visibly.
pub fn shown_path(path: &Path, root: Option<&Path>) -> String {
    let path = root
        .and_then(|root| path.strip_prefix(root).ok())
        .unwrap_or(path)
        .display()
        .to_string();
    show::escape_control(&path).into_owned()
}
