//! Where in a TOML text a parse error is: 1-based line and column from a
//! byte offset, and serde's message in the quotes users read. The
//! experiment file (`config`) and task folders (`task.toml`, in `task`)
//! both report their TOML errors this way; it lives on its own so neither
//! of those modules has to name the other for it.

/// 1-based line and column (in characters) of a byte offset in `text`.
/// Offsets past the end or inside a multi-byte character are clamped, so a
/// slightly-off span from a parser can never cause a panic.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// serde quotes names with backticks (`` `iteratons` ``); users read double quotes.
pub(crate) fn clean_serde_message(message: &str) -> String {
    message.trim().replace('`', "\"")
}

/// Turns a toml deserialisation error into (line, column, message).
pub(crate) fn locate_toml_error(text: &str, err: &toml::de::Error) -> (usize, usize, String) {
    let (line, column) = err
        .span()
        .map_or((1, 1), |span| line_column(text, span.start));
    (line, column, clean_serde_message(err.message()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_column_handles_unicode_and_bad_offsets() {
        let text = "ab\nçé x";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 3), (2, 1));
        // 'x' is after two 2-byte characters and a space: byte 8, column 4.
        assert_eq!(line_column(text, 8), (2, 4));
        // Inside 'ç' and past the end: clamped, no panic.
        assert_eq!(line_column(text, 4), (2, 1));
        assert_eq!(line_column(text, 1000), (2, 5));
    }
}
