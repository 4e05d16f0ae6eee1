//! Packet framing: the length word, the 24-byte header, and a `tokio_util` codec that checks
//! the length before it allocates.
//!
//! Guarantees: a length below [`MIN_PACKET`] or above [`MAX_PACKET`] is rejected as soon as
//! its four bytes arrive, before any buffer is reserved for the body (finding L27); decoding
//! never panics on any input; an incomplete packet is a normal `Ok(None)`.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Size of the length word.
pub const LEN_SIZE: usize = 4;
/// Size of the XDR header after the length word.
pub const HEADER_SIZE: usize = 24;
/// Smallest valid packet: length word plus header.
pub const MIN_PACKET: usize = LEN_SIZE + HEADER_SIZE;
/// Largest message libvirt accepts (`VIR_NET_MESSAGE_MAX`), not counting the length word.
pub const MAX_MESSAGE: usize = 33_554_432;
/// Largest valid packet, length word included.
pub const MAX_PACKET: usize = LEN_SIZE + MAX_MESSAGE;
/// Largest payload after the header.
pub const MAX_PAYLOAD: usize = MAX_MESSAGE - HEADER_SIZE;
/// Most buffer space reserved ahead of the bytes received while a packet is incomplete.
pub const RESERVE_STEP: usize = 64 << 10;
/// Payload limit for stream data that every libvirt version accepts
/// (`VIR_NET_MESSAGE_LEGACY_PAYLOAD_MAX`).
pub const LEGACY_STREAM_PAYLOAD: usize = 262_120;

/// `virNetMessageType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    /// Client → server method call.
    Call,
    /// Server → client reply.
    Reply,
    /// Asynchronous message (events, keepalive).
    Message,
    /// Stream data or control.
    Stream,
    /// Call with passed file descriptors (not used by us).
    CallWithFds,
    /// Reply with passed file descriptors (not used by us).
    ReplyWithFds,
    /// Stream hole (sparse streams; not used by us).
    StreamHole,
    /// A value this client does not know.
    Unknown(i32),
}

impl MessageType {
    /// The wire value.
    pub fn to_wire(self) -> i32 {
        match self {
            Self::Call => 0,
            Self::Reply => 1,
            Self::Message => 2,
            Self::Stream => 3,
            Self::CallWithFds => 4,
            Self::ReplyWithFds => 5,
            Self::StreamHole => 6,
            Self::Unknown(v) => v,
        }
    }

    /// From the wire value.
    pub fn from_wire(v: i32) -> Self {
        match v {
            0 => Self::Call,
            1 => Self::Reply,
            2 => Self::Message,
            3 => Self::Stream,
            4 => Self::CallWithFds,
            5 => Self::ReplyWithFds,
            6 => Self::StreamHole,
            v => Self::Unknown(v),
        }
    }
}

/// `virNetMessageStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Success / end of stream.
    Ok,
    /// The payload is a `remote_error` (or, for a client's stream packet, an abort).
    Error,
    /// More stream data follows.
    Continue,
    /// A value this client does not know.
    Unknown(i32),
}

impl Status {
    /// The wire value.
    pub fn to_wire(self) -> i32 {
        match self {
            Self::Ok => 0,
            Self::Error => 1,
            Self::Continue => 2,
            Self::Unknown(v) => v,
        }
    }

    /// From the wire value.
    pub fn from_wire(v: i32) -> Self {
        match v {
            0 => Self::Ok,
            1 => Self::Error,
            2 => Self::Continue,
            v => Self::Unknown(v),
        }
    }
}

/// `virNetMessageHeader`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure number.
    pub proc_: i32,
    /// Message type.
    pub mtype: MessageType,
    /// Serial chosen by the caller; echoed in replies and stream packets.
    pub serial: u32,
    /// Status.
    pub status: Status,
}

/// One packet: a header and its (undecoded) payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The header.
    pub header: Header,
    /// Bytes after the header.
    pub payload: Bytes,
}

impl Packet {
    /// Encodes the whole packet, length word included, into `dst`.
    ///
    /// Fails if the payload exceeds [`MAX_PAYLOAD`].
    pub fn encode_into(&self, dst: &mut BytesMut) -> Result<(), FrameError> {
        encode_parts(&self.header, &self.payload, dst)
    }

    /// Encodes the packet into a new buffer.
    pub fn to_bytes(&self) -> Result<Bytes, FrameError> {
        let mut b = BytesMut::with_capacity(MIN_PACKET + self.payload.len());
        self.encode_into(&mut b)?;
        Ok(b.freeze())
    }
}

/// Encodes a header and payload, length word included, into `dst`.
pub fn encode_parts(header: &Header, payload: &[u8], dst: &mut BytesMut) -> Result<(), FrameError> {
    let prefix = packet_prefix(header, payload.len())?;
    dst.reserve(prefix.len() + payload.len());
    dst.put_slice(&prefix);
    dst.put_slice(payload);
    Ok(())
}

/// The first [`MIN_PACKET`] bytes of a packet whose payload is `payload_len` bytes: the
/// length word, then the header. Lets a sender build a packet in place, the payload read
/// straight into the buffer after room for this prefix, instead of copying it into a new one.
///
/// Fails if the payload exceeds [`MAX_PAYLOAD`].
pub fn packet_prefix(header: &Header, payload_len: usize) -> Result<[u8; MIN_PACKET], FrameError> {
    if payload_len > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(MIN_PACKET.saturating_add(payload_len)));
    }
    let total = MIN_PACKET + payload_len;
    // NB: total ≤ MAX_PACKET < u32::MAX, checked just above.
    let len = u32::try_from(total).map_err(|_| FrameError::TooLarge(total))?;
    let mut out = [0u8; MIN_PACKET];
    let mut w = &mut out[..];
    w.put_u32(len);
    w.put_u32(header.prog);
    w.put_u32(header.vers);
    w.put_i32(header.proc_);
    w.put_i32(header.mtype.to_wire());
    w.put_u32(header.serial);
    w.put_i32(header.status.to_wire());
    Ok(out)
}

/// Why the byte stream is not a valid packet sequence. Any of these ends the connection.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length word is below the header size.
    #[error("packet length {0} is below the {MIN_PACKET}-byte minimum")]
    TooShort(usize),
    /// The length word exceeds the protocol maximum.
    #[error("packet length {0} exceeds the {MAX_PACKET}-byte maximum")]
    TooLarge(usize),
    /// Reading or writing the transport failed.
    #[error("transport I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads a header from exactly [`HEADER_SIZE`] bytes.
pub fn decode_header(mut b: &[u8]) -> Option<Header> {
    if b.len() < HEADER_SIZE {
        return None;
    }
    Some(Header {
        prog: b.get_u32(),
        vers: b.get_u32(),
        proc_: b.get_i32(),
        mtype: MessageType::from_wire(b.get_i32()),
        serial: b.get_u32(),
        status: Status::from_wire(b.get_i32()),
    })
}

/// The packet codec. Decoding checks the length word before reserving the body.
#[derive(Debug, Default, Clone, Copy)]
pub struct PacketCodec;

impl Decoder for PacketCodec {
    type Item = Packet;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Packet>, FrameError> {
        let Some(len_bytes) = src.get(..LEN_SIZE) else {
            return Ok(None);
        };
        let mut lb = [0u8; LEN_SIZE];
        lb.copy_from_slice(len_bytes);
        let len = u32::from_be_bytes(lb) as usize;
        if len < MIN_PACKET {
            return Err(FrameError::TooShort(len));
        }
        if len > MAX_PACKET {
            return Err(FrameError::TooLarge(len));
        }
        if src.len() < len {
            // NB: reserve only a step ahead, never the whole announced length: a peer that
            // announces a 32 MiB packet and sends nothing more costs 64 KiB, not 32 MiB, so the
            // memory a connection holds is what its peer actually sent.
            src.reserve((len - src.len()).min(RESERVE_STEP));
            return Ok(None);
        }
        let mut pkt = src.split_to(len);
        pkt.advance(LEN_SIZE);
        let hdr = pkt.split_to(HEADER_SIZE);
        let header = decode_header(&hdr).ok_or(FrameError::TooShort(len))?;
        Ok(Some(Packet {
            header,
            payload: pkt.freeze(),
        }))
    }
}

impl Encoder<Packet> for PacketCodec {
    type Error = FrameError;

    fn encode(&mut self, item: Packet, dst: &mut BytesMut) -> Result<(), FrameError> {
        item.encode_into(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr() -> Header {
        Header {
            prog: 0x2000_8086,
            vers: 1,
            proc_: 66,
            mtype: MessageType::Call,
            serial: 7,
            status: Status::Ok,
        }
    }

    #[test]
    fn packet_round_trips_through_the_codec() {
        let p = Packet {
            header: hdr(),
            payload: Bytes::from_static(&[1, 2, 3, 4]),
        };
        let mut b = BytesMut::new();
        PacketCodec.encode(p.clone(), &mut b).unwrap();
        assert_eq!(&b[..4], &32u32.to_be_bytes());
        let mut partial = b.split_to(10);
        assert!(PacketCodec.decode(&mut partial).unwrap().is_none());
        partial.unsplit(b);
        assert_eq!(PacketCodec.decode(&mut partial).unwrap(), Some(p));
        assert!(partial.is_empty());
    }

    #[test]
    fn short_length_is_rejected_without_panicking() {
        // finding: L27 — a length below 28 used to panic the Go reader.
        for len in [0u32, 1, 4, 27] {
            let mut b = BytesMut::from(&len.to_be_bytes()[..]);
            assert!(matches!(
                PacketCodec.decode(&mut b),
                Err(FrameError::TooShort(_))
            ));
        }
    }

    #[test]
    fn huge_length_is_rejected_before_allocating() {
        // finding: L27 — a 4 GiB length must be refused from its first four bytes.
        let mut b = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
        let cap = b.capacity();
        assert!(matches!(
            PacketCodec.decode(&mut b),
            Err(FrameError::TooLarge(_))
        ));
        assert_eq!(b.capacity(), cap, "no reservation for a rejected length");
        // An announced maximum-size packet reserves one step, not its length.
        let mut big = BytesMut::from(&(MAX_PACKET as u32).to_be_bytes()[..]);
        assert!(PacketCodec.decode(&mut big).unwrap().is_none());
        assert!(
            big.capacity() <= LEN_SIZE + RESERVE_STEP + 64,
            "{}",
            big.capacity()
        );
        let mut b = BytesMut::from(&((MAX_PACKET + 1) as u32).to_be_bytes()[..]);
        assert!(PacketCodec.decode(&mut b).is_err());
        let mut b = BytesMut::from(&(MAX_PACKET as u32).to_be_bytes()[..]);
        assert!(PacketCodec.decode(&mut b).unwrap().is_none());
    }

    #[test]
    fn a_packet_built_in_place_equals_the_encoded_one() {
        let payload = [9u8; 1000];
        let mut expected = BytesMut::new();
        encode_parts(&hdr(), &payload, &mut expected).unwrap();
        let mut in_place = packet_prefix(&hdr(), payload.len()).unwrap().to_vec();
        in_place.extend_from_slice(&payload);
        assert_eq!(&expected[..], &in_place[..]);
        assert!(matches!(
            packet_prefix(&hdr(), MAX_PAYLOAD + 1),
            Err(FrameError::TooLarge(_))
        ));
    }

    #[test]
    fn oversized_payload_cannot_be_encoded() {
        let p = Packet {
            header: hdr(),
            payload: Bytes::from(vec![0u8; MAX_PAYLOAD + 1]),
        };
        assert!(matches!(p.to_bytes(), Err(FrameError::TooLarge(_))));
    }
}
