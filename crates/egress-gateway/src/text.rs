//! Client-supplied text made safe to show: clipped to a length at a character boundary.
//! Callers format it with `{:?}`, which escapes control characters, so nothing a client sends
//! can break a response header or an access-log line.

/// `s` cut to at most `max` bytes at a character boundary.
pub fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn clipping_keeps_whole_characters() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("abcdef", 3), "abc");
        assert_eq!(clip("aé", 2), "a");
    }
}
