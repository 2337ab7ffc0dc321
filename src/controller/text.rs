//! Text a program or a peer wrote (a hook's stderr, `env`'s, a plugin's, a registry's answer),
//! made fit for a log line, an event or a status: control characters out, bounded, never cut
//! inside a character.

/// What a program wrote (a hook's stderr, `env`'s), fit for a log line or an event: lossy UTF-8,
/// trimmed, control characters (a forged log line's newline, a terminal's escapes) as `?`, at
/// most `limit` bytes cut on a character boundary with `…` after.
pub fn bounded_text(bytes: &[u8], limit: usize) -> String {
    let head = &bytes[..bytes.len().min(limit.saturating_mul(4))];
    let text: String = String::from_utf8_lossy(head)
        .trim()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `text` fit for one log line: control characters (newlines, escapes) and bidirectional
/// overrides each made a space, trimmed, at most `max` bytes (cut at a character boundary).
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.trim().chars() {
        let c = if c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        {
            ' '
        } else {
            c
        };
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(c);
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_removes_control_and_bidi_characters_and_cuts_at_a_character() {
        assert_eq!(one_line(" a\nb\tc\u{1b}[0m\r ", 100), "a b c [0m");
        assert_eq!(one_line("x\u{202e}y\u{2066}z", 100), "x y z");
        assert_eq!(one_line("ééé", 5), "éé", "never half a character");
        assert_eq!(one_line(&"a".repeat(1000), 10).len(), 10);
    }
}
