//! The pool gateway's parsers against arbitrary client bytes: the HTTP request head, the
//! three SOCKS5 messages, the `Proxy-Authorization` value, a CONNECT authority and the
//! username syntax. Input: byte 0 selects the parser (mod 6), byte 1 a split point, the rest
//! is what a client sent. See docs/fuzzing.md.
#![no_main]

use egress_gateway::{auth, http, socks, target, username};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (Some(&which), Some(&split)) = (data.first(), data.get(1)) else {
        return;
    };
    let input = &data[2..];
    let cut = usize::from(split).min(input.len());
    match which % 6 {
        0 => check_http(input, cut),
        1 => {
            if let Ok(Some(g)) = socks::parse_greeting(input) {
                assert!(g.len <= input.len() && g.len >= 3);
                assert_eq!(socks::parse_greeting(&input[..g.len]), Ok(Some(g)));
            }
        }
        2 => {
            if let Ok(Some(up)) = socks::parse_userpass(input) {
                assert!(up.len <= input.len() && up.len <= socks::MAX_MESSAGE);
                assert_eq!(up.username.len() + up.password.len() + 3, up.len);
                let again = socks::parse_userpass(&input[..up.len]).unwrap().unwrap();
                assert_eq!(again, up);
            }
        }
        3 => {
            if let Ok(Some((t, n))) = socks::parse_request(input) {
                assert!(n <= input.len() && t.port != 0);
                assert_eq!(socks::parse_request(&input[..n]), Ok(Some((t, n))));
            }
            // A message one byte short is incomplete or an error, never a different success.
            if let Ok(Some((_, n))) = socks::parse_request(input) {
                assert!(!matches!(socks::parse_request(&input[..n - 1]), Ok(Some(_))));
            }
        }
        4 => {
            if let Some((u, p)) = auth::parse_basic(input) {
                assert!(!u.is_empty() && u.len() <= auth::MAX_CREDENTIAL);
                assert!(p.len() <= auth::MAX_CREDENTIAL);
            }
            if let Ok(s) = std::str::from_utf8(input) {
                if let Some(t) = target::Target::parse_authority(s) {
                    assert!(t.port != 0);
                    // What we print parses back to the same target.
                    assert_eq!(target::Target::parse_authority(&t.to_string()), Some(t));
                }
            }
        }
        _ => {
            let Ok(s) = std::str::from_utf8(input) else { return };
            // Identities: every prefix of the input ending before a '-' at the cut.
            let ident = &s[..s.floor_char_boundary(cut)];
            if let Some(sp) = username::split(s, |n| n == ident) {
                assert_eq!(sp.name, ident);
                assert!(s.starts_with(sp.name));
                let _ = sp.options(&egress_gateway::Sessions::default());
            }
        }
    }
});

fn check_http(input: &[u8], cut: usize) {
    let whole = http::parse(input);
    if let Ok(Some(r)) = &whole {
        assert!(r.head_len <= input.len() && r.head_len <= http::MAX_HEAD);
        // The head alone parses to the same request: nothing after it changed the parse.
        assert_eq!(http::parse(&input[..r.head_len]).as_ref(), Ok(&Some(r.clone())));
        assert_ne!(r.target.port, 0);
        if let Some(h) = &r.forward_head {
            assert!(h.ends_with(b"Connection: close\r\n\r\n"));
            assert_eq!(memchr::memmem::find_iter(h, b"\r\n\r\n").count(), 1);
            // The rewrite adds the request line's fixed parts, a Host line, `Connection:
            // close`, and per header at most ": " for ":" and "\r\n" for "\n".
            let bound = r.head_len + 64 + r.target.to_string().len() + 2 * http::MAX_HEADERS;
            assert!(h.len() <= bound);
        }
    }
    // Fed in two parts, as a client's segments arrive: a complete prefix gives the same
    // request as the whole (more bytes never change a complete head).
    if let Ok(Some(early)) = http::parse(&input[..cut]) {
        assert_eq!(whole, Ok(Some(early)));
    }
}
