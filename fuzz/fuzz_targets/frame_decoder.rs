//! Fuzzes `libvirt_remote::frame::PacketCodec` the way `tokio_util::codec::FramedRead` drives
//! it: bytes arrive in chunks, the codec is called until it returns `Ok(None)` or an error,
//! and `decode_eof` runs once the stream ends.
//!
//! Input layout: byte 0 is a chunk count `n` (mod 16); the next `n` bytes are chunk sizes
//! (0 means 1); the rest is the byte stream. Bytes left after the listed chunks arrive as one
//! last chunk.
//!
//! Checks (finding L27):
//! - never panics;
//! - the buffer never grows past [`MAX_PACKET`] (nothing reserved for a rejected length);
//! - each decoded packet re-encodes to exactly the bytes it was decoded from;
//! - an error is `TooShort`/`TooLarge` exactly when the length word at that point is below
//!   [`MIN_PACKET`]/above [`MAX_PACKET`];
//! - the outcome (packets, then error or clean end) does not depend on the split points.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use libvirt_remote::frame::{FrameError, MAX_PACKET, MIN_PACKET, Packet, PacketCodec};
use tokio_util::codec::Decoder;

/// How a decoding run ended after its packets.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The stream ended on a packet boundary.
    Clean,
    /// The stream ended mid-packet (`decode_eof` reports leftover bytes).
    Leftover,
    TooShort(usize),
    TooLarge(usize),
}

/// Feeds `chunks` to a fresh codec, checking the allocation bound after every call.
fn run(stream: &[u8], chunks: &[usize]) -> (Vec<Packet>, End) {
    let mut codec = PacketCodec;
    let mut buf = BytesMut::new();
    let mut packets = Vec::new();
    let mut offset = 0usize; // stream offset of buf[0]
    let mut fed = 0usize;
    let mut sizes = chunks.iter().copied();
    loop {
        let at_eof = fed == stream.len();
        if !at_eof {
            let n = sizes
                .next()
                .unwrap_or(stream.len() - fed)
                .min(stream.len() - fed);
            buf.extend_from_slice(&stream[fed..fed + n]);
            fed += n;
        }
        // FramedRead calls decode until it yields nothing, and decode_eof at the end.
        loop {
            let before_len = buf.len();
            let res = if at_eof {
                codec.decode_eof(&mut buf)
            } else {
                codec.decode(&mut buf)
            };
            // The harness feeds at most a few KiB, so every capacity above that comes from
            // the codec's own reservation, which must never exceed one maximal packet.
            assert!(
                buf.capacity() <= MAX_PACKET.max(2 * stream.len()),
                "codec reserved {} bytes",
                buf.capacity()
            );
            match res {
                Ok(Some(pkt)) => {
                    let consumed = before_len - buf.len();
                    let wire = &stream[offset..offset + consumed];
                    let re = pkt.to_bytes().expect("a decoded packet re-encodes");
                    assert_eq!(&re[..], wire, "packet does not re-encode to its bytes");
                    assert!((MIN_PACKET..=MAX_PACKET).contains(&consumed));
                    offset += consumed;
                    packets.push(pkt);
                }
                Ok(None) => {
                    assert_eq!(buf.len(), before_len, "Ok(None) must not consume");
                    if at_eof {
                        assert!(buf.is_empty());
                        return (packets, End::Clean);
                    }
                    break;
                }
                Err(e) => {
                    let word = &stream[offset..];
                    let len = match word.get(..4) {
                        Some(w) => u32::from_be_bytes([w[0], w[1], w[2], w[3]]) as usize,
                        None => usize::MAX,
                    };
                    let end = match e {
                        FrameError::TooShort(l) => {
                            assert_eq!(l, len);
                            assert!(l < MIN_PACKET);
                            End::TooShort(l)
                        }
                        FrameError::TooLarge(l) => {
                            assert_eq!(l, len);
                            assert!(l > MAX_PACKET);
                            End::TooLarge(l)
                        }
                        FrameError::Io(_) => {
                            // decode_eof's "bytes remaining on stream": a partial packet.
                            assert!(at_eof && !buf.is_empty());
                            End::Leftover
                        }
                    };
                    return (packets, end);
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 16).min(rest.len());
    let (sizes, stream) = rest.split_at(n);
    let chunks: Vec<usize> = sizes.iter().map(|&s| usize::from(s).max(1)).collect();
    let split = run(stream, &chunks);
    let whole = run(stream, &[]);
    assert_eq!(split, whole, "the outcome depends on the split points");
});
