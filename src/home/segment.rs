//! Directory-name segments for index paths, encoded the way pi-subagents encodes them
//! (its `encodeIndexSegment`), so its readers find our index entries.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use sha2::{Digest, Sha256};

/// Longest segment: a file-name component.
pub const MAX_SEGMENT_BYTES: usize = 255;

/// What JavaScript's `encodeURIComponent` escapes: everything but `A-Z a-z 0-9 - _ . ! ~ * ' ( )`.
const URI_COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// `value` URI-component-encoded when that is a portable name of at most `max_bytes`, else
/// `~sha256-<hex of value>`.
pub fn encode(value: &str, max_bytes: usize) -> String {
    let encoded = utf8_percent_encode(value, URI_COMPONENT).to_string();
    if encoded.len() <= max_bytes && is_portable(&encoded) {
        encoded
    } else {
        let digest = Sha256::digest(value.as_bytes());
        let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
        format!("~sha256-{hex}")
    }
}

fn is_portable(name: &str) -> bool {
    if name.is_empty() || name == "." || name == ".." || name.ends_with('.') {
        return false;
    }
    let lower = name.to_ascii_lowercase();
    if lower.contains("%5c") {
        return false;
    }
    let stem = lower.split('.').next().unwrap_or_default();
    let is_reserved = matches!(stem, "con" | "prn" | "aux" | "nul")
        || ((stem.starts_with("com") || stem.starts_with("lpt"))
            && stem.len() == 4
            && matches!(stem.as_bytes()[3], b'1'..=b'9'));
    if is_reserved {
        return false;
    }
    !ends_like_extension(name)
}

/// Whether `name` ends with `.` + a letter + up to seven letters or digits.
fn ends_like_extension(name: &str) -> bool {
    let Some(dot) = name.rfind('.') else {
        return false;
    };
    let extension = &name[dot + 1..];
    let mut chars = extension.chars();
    let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    starts_with_letter && extension.len() <= 8 && chars.all(|c| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_ids_pass_through() {
        assert_eq!(encode("session-42", MAX_SEGMENT_BYTES), "session-42");
        assert_eq!(encode("a b/c", MAX_SEGMENT_BYTES), "a%20b%2Fc");
    }

    #[test]
    fn unportable_names_are_hashed() {
        for value in [
            "",
            ".",
            "..",
            "x.",
            "CON",
            "com1.txt",
            "a\\b",
            "log.jsonl",
            "x".repeat(300).as_str(),
        ] {
            let encoded = encode(value, MAX_SEGMENT_BYTES);
            assert!(encoded.starts_with("~sha256-"), "{value:?} gave {encoded}");
            assert_eq!(encoded.len(), "~sha256-".len() + 64);
        }
    }

    #[test]
    fn hash_is_of_the_raw_value() {
        // sha256("..") as printed by sha256sum.
        assert_eq!(
            encode("..", MAX_SEGMENT_BYTES),
            "~sha256-5ec1f7e700f37c3d0b2981d04855fc34b94aaa15457b05ca571817442d228f81"
        );
    }
}
