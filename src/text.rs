//! Text from elsewhere made safe to show: a run's output, a provider's message, a server's
//! error. The one escaping of control characters, below everything that shows text (the
//! binaries, `show`, a shipper's lag line).

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with every control character shown visibly, so that text from a run, a provider or a
/// file cannot drive the terminal it is shown on (retitle it, clear it, move the cursor, hide
/// what follows): tab, newline and carriage return as `\t`, `\n`, `\r`; other C0 controls
/// and DEL as `\xNN` (ESC is `\x1b`); C1 controls and the bidirectional formatting
/// characters (which reorder what a reader sees) as `\u{NNNN}`. Everything else is left as
/// it is. Escaping twice changes nothing more: the result holds no control character.
pub fn escape_control(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\t' => escaped.push_str("\\t"),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            c if needs_escape(c) && (c as u32) < 0x80 => {
                let _ = write!(escaped, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(escaped, "\\u{{{:x}}}", c as u32);
            }
            c => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

/// Whether `c` is shown escaped by [`escape_control`]: a control character (C0, DEL, C1) or a
/// bidirectional formatting character.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// A size for people: `45.2 MiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}
