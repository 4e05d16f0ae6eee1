//! Reading a raw HTTP/1.1 response the tests' hand-made clients received: the status code and
//! the body, with `Transfer-Encoding: chunked` decoded (the operator streams its large
//! documents, `/status` and `/proxies`, in chunks).
//!
//! Hand-written (a dozen lines) rather than an HTTP client crate: the tests speak raw HTTP on
//! purpose (one request per connection, exact bytes, no pooling), and only need the body back.

/// The status code and body of the raw response `raw` (head, blank line, body; the body
/// de-chunked when the head says so). `None` when `raw` is not a whole response.
pub fn response(raw: &str) -> Option<(u16, String)> {
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let code = head.get(9..12)?.parse().ok()?;
    let chunked = head.lines().skip(1).any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    if !chunked {
        return Some((code, body.to_owned()));
    }
    // NB: sizes count bytes, and a chunk may end inside a character: de-chunk bytes.
    let mut out: Vec<u8> = Vec::new();
    let mut rest = body.as_bytes();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(rest.get(..line_end)?).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        let after = rest.get(line_end + 2..)?;
        if size == 0 {
            return Some((code, String::from_utf8(out).ok()?));
        }
        out.extend_from_slice(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix(b"\r\n")?;
    }
}

/// The body of `raw` when it is a whole response, whatever its status.
pub fn body(raw: &str) -> Option<String> {
    response(raw).map(|(_, b)| b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_chunked_bodies_read_the_same() {
        let plain = "HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{\"a\":[1,2]}";
        assert_eq!(response(plain), Some((200, "{\"a\":[1,2]}".into())));
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                       4\r\n{\"a\"\r\n7;x=y\r\n:[1,2]}\r\n0\r\n\r\n";
        assert_eq!(response(chunked), Some((200, "{\"a\":[1,2]}".into())));
        // Cut short: not a whole response.
        let cut = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n7\r\n:[1";
        assert_eq!(response(cut), None);
        assert_eq!(
            response("HTTP/1.1 404 Not Found\r\n\r\nno"),
            Some((404, "no".into()))
        );
    }
}
