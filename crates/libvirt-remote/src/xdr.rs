//! XDR (RFC 4506) encoding and decoding for the types libvirt's remote protocol uses.
//!
//! Guarantees: decoding never panics and never allocates more than the input could hold
//! (every length is checked against the bytes that remain before anything is reserved);
//! strings are bounded by [`STRING_MAX`]; trailing bytes after a message are an error.
//!
//! NB: hand-written rather than `serde-xdr`/`xdr-codec`: those crates are unmaintained, do
//! not bound allocations by remaining input, and libvirt uses only a dozen XDR shapes, which
//! the [`xdr_struct!`](crate::xdr_struct) macro below covers in a few lines each.

use bytes::{BufMut, Bytes, BytesMut};

/// Maximum length of an XDR string in libvirt's protocol (`REMOTE_STRING_MAX`, 4 MiB).
pub const STRING_MAX: usize = 4 * 1024 * 1024;

/// Why a payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XdrError {
    /// The payload ended before the value did.
    #[error("payload truncated: needed {needed} more bytes at offset {offset}")]
    Truncated {
        /// Byte offset where the read started.
        offset: usize,
        /// Bytes that were missing.
        needed: usize,
    },
    /// A length prefix exceeded its protocol bound or the bytes that remain.
    #[error("length {len} at offset {offset} exceeds the limit {limit}")]
    TooLong {
        /// Byte offset of the length word.
        offset: usize,
        /// The length read.
        len: usize,
        /// The bound it broke.
        limit: usize,
    },
    /// A string was not valid UTF-8.
    #[error("string at offset {offset} is not UTF-8")]
    NotUtf8 {
        /// Byte offset of the string's length word.
        offset: usize,
    },
    /// A boolean or optional discriminant was neither 0 nor 1.
    #[error("invalid discriminant {value} at offset {offset}")]
    BadDiscriminant {
        /// Byte offset of the discriminant.
        offset: usize,
        /// The value read.
        value: u32,
    },
    /// Bytes remained after the value was decoded.
    #[error("{0} unexpected trailing bytes")]
    Trailing(usize),
}

/// Appends XDR-encoded values to a buffer.
#[derive(Debug, Default)]
pub struct Encoder {
    buf: BytesMut,
}

impl Encoder {
    /// An empty encoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// An encoder writing after `buf`'s current contents.
    pub fn from_buf(buf: BytesMut) -> Self {
        Self { buf }
    }

    /// The bytes written so far.
    pub fn into_inner(self) -> BytesMut {
        self.buf
    }

    /// Writes a big-endian u32.
    pub fn put_u32(&mut self, v: u32) {
        self.buf.put_u32(v);
    }

    /// Writes a big-endian i32.
    pub fn put_i32(&mut self, v: i32) {
        self.buf.put_i32(v);
    }

    /// Writes a big-endian u64 (`unsigned hyper`).
    pub fn put_u64(&mut self, v: u64) {
        self.buf.put_u64(v);
    }

    /// Writes a big-endian i64 (`hyper`).
    pub fn put_i64(&mut self, v: i64) {
        self.buf.put_i64(v);
    }

    /// Writes fixed-length opaque data (padded to 4 bytes).
    pub fn put_fixed_opaque(&mut self, v: &[u8]) {
        self.buf.put_slice(v);
        self.pad(v.len());
    }

    /// Writes variable-length opaque data (length, bytes, padding).
    pub fn put_opaque(&mut self, v: &[u8]) {
        // NB: lengths above u32::MAX cannot be produced by our callers (frames are ≤ 32 MiB);
        // saturate rather than panic so a misuse yields a rejected message, not a crash.
        self.put_u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        self.buf.put_slice(v);
        self.pad(v.len());
    }

    fn pad(&mut self, len: usize) {
        let rem = (4 - len % 4) % 4;
        self.buf.put_bytes(0, rem);
    }
}

/// Reads XDR-encoded values from a byte slice.
#[derive(Debug)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Current offset.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<(), XdrError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(XdrError::Trailing(n)),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        let offset = self.pos;
        let end = offset
            .checked_add(n)
            .ok_or(XdrError::Truncated { offset, needed: n })?;
        let slice = self.buf.get(offset..end).ok_or(XdrError::Truncated {
            offset,
            needed: end.saturating_sub(self.buf.len()),
        })?;
        self.pos = end;
        Ok(slice)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], XdrError> {
        let s = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    /// Reads a u32.
    pub fn get_u32(&mut self) -> Result<u32, XdrError> {
        Ok(u32::from_be_bytes(self.take_array::<4>()?))
    }

    /// Reads an i32.
    pub fn get_i32(&mut self) -> Result<i32, XdrError> {
        Ok(i32::from_be_bytes(self.take_array::<4>()?))
    }

    /// Reads a u64.
    pub fn get_u64(&mut self) -> Result<u64, XdrError> {
        Ok(u64::from_be_bytes(self.take_array::<8>()?))
    }

    /// Reads an i64.
    pub fn get_i64(&mut self) -> Result<i64, XdrError> {
        Ok(i64::from_be_bytes(self.take_array::<8>()?))
    }

    /// Reads a length prefix, bounded by `limit` and by the bytes that remain
    /// (each element occupying at least `min_elem_size` bytes).
    pub fn get_len(&mut self, limit: usize, min_elem_size: usize) -> Result<usize, XdrError> {
        let offset = self.pos;
        let len = self.get_u32()? as usize;
        let fits = len
            .checked_mul(min_elem_size.max(1))
            .is_some_and(|bytes| bytes <= self.remaining());
        if len > limit || !fits {
            return Err(XdrError::TooLong {
                offset,
                len,
                limit: limit.min(self.remaining() / min_elem_size.max(1)),
            });
        }
        Ok(len)
    }

    /// Reads fixed-length opaque data of `n` bytes plus padding.
    pub fn get_fixed_opaque(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        let s = self.take(n)?;
        self.skip_pad(n)?;
        Ok(s)
    }

    /// Reads variable-length opaque data of at most `limit` bytes.
    pub fn get_opaque(&mut self, limit: usize) -> Result<&'a [u8], XdrError> {
        let len = self.get_len(limit, 1)?;
        self.get_fixed_opaque(len)
    }

    /// Reads a UTF-8 string of at most `limit` bytes.
    pub fn get_string(&mut self, limit: usize) -> Result<String, XdrError> {
        let offset = self.pos;
        let raw = self.get_opaque(limit)?;
        String::from_utf8(raw.to_vec()).map_err(|_| XdrError::NotUtf8 { offset })
    }

    /// Reads an XDR bool or optional-data discriminant.
    pub fn get_bool(&mut self) -> Result<bool, XdrError> {
        let offset = self.pos;
        match self.get_u32()? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(XdrError::BadDiscriminant { offset, value }),
        }
    }

    fn skip_pad(&mut self, len: usize) -> Result<(), XdrError> {
        let rem = (4 - len % 4) % 4;
        self.take(rem).map(|_| ())
    }
}

/// A type with an XDR wire form.
pub trait Xdr: Sized {
    /// Smallest encoded size in bytes (used to bound array lengths before allocating).
    const MIN_SIZE: usize = 4;
    /// Appends the encoded value.
    fn encode(&self, enc: &mut Encoder);
    /// Reads one value.
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError>;
}

/// Encodes a value into a fresh buffer.
pub fn to_bytes<T: Xdr>(v: &T) -> Bytes {
    let mut enc = Encoder::new();
    v.encode(&mut enc);
    enc.into_inner().freeze()
}

/// Decodes a whole payload into one value; trailing bytes are an error.
pub fn from_bytes<T: Xdr>(buf: &[u8]) -> Result<T, XdrError> {
    let mut dec = Decoder::new(buf);
    let v = T::decode(&mut dec)?;
    dec.finish()?;
    Ok(v)
}

impl Xdr for () {
    const MIN_SIZE: usize = 0;
    fn encode(&self, _: &mut Encoder) {}
    fn decode(_: &mut Decoder<'_>) -> Result<Self, XdrError> {
        Ok(())
    }
}

impl Xdr for u32 {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(*self);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_u32()
    }
}

impl Xdr for i32 {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_i32(*self);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_i32()
    }
}

impl Xdr for u64 {
    const MIN_SIZE: usize = 8;
    fn encode(&self, enc: &mut Encoder) {
        enc.put_u64(*self);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_u64()
    }
}

impl Xdr for i64 {
    const MIN_SIZE: usize = 8;
    fn encode(&self, enc: &mut Encoder) {
        enc.put_i64(*self);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_i64()
    }
}

impl Xdr for bool {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(u32::from(*self));
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_bool()
    }
}

/// `remote_nonnull_string`: a string bounded by [`STRING_MAX`].
impl Xdr for String {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_opaque(self.as_bytes());
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        dec.get_string(STRING_MAX)
    }
}

/// `remote_uuid`: 16 opaque bytes.
impl Xdr for [u8; 16] {
    const MIN_SIZE: usize = 16;
    fn encode(&self, enc: &mut Encoder) {
        enc.put_fixed_opaque(self);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        let s = dec.get_fixed_opaque(16)?;
        let mut out = [0u8; 16];
        out.copy_from_slice(s);
        Ok(out)
    }
}

/// XDR optional data (`T *`): a discriminant, then the value when present.
impl<T: Xdr> Xdr for Option<T> {
    fn encode(&self, enc: &mut Encoder) {
        match self {
            None => enc.put_u32(0),
            Some(v) => {
                enc.put_u32(1);
                v.encode(enc);
            }
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        if dec.get_bool()? {
            Ok(Some(T::decode(dec)?))
        } else {
            Ok(None)
        }
    }
}

/// Variable-length array (`T name<MAX>`); the length is checked against the bytes that
/// remain before the vector is allocated.
impl<T: Xdr> Xdr for Vec<T> {
    fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(u32::try_from(self.len()).unwrap_or(u32::MAX));
        for v in self {
            v.encode(enc);
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
        let len = dec.get_len(usize::MAX, T::MIN_SIZE)?;
        let mut out = Vec::with_capacity(len);
        for _ in 0..len {
            out.push(T::decode(dec)?);
        }
        Ok(out)
    }
}

/// Declares a struct whose XDR form is its fields in order.
#[macro_export]
macro_rules! xdr_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Default)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty ),*
        }

        impl $crate::xdr::Xdr for $name {
            const MIN_SIZE: usize = 0 $( + <$ty as $crate::xdr::Xdr>::MIN_SIZE )*;
            fn encode(&self, enc: &mut $crate::xdr::Encoder) {
                $( $crate::xdr::Xdr::encode(&self.$field, enc); )*
                let _ = enc;
            }
            fn decode(dec: &mut $crate::xdr::Decoder<'_>) -> Result<Self, $crate::xdr::XdrError> {
                let _ = &dec;
                Ok(Self { $( $field: <$ty as $crate::xdr::Xdr>::decode(dec)? ),* })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_padded_to_four_bytes() {
        let b = to_bytes(&"abcde".to_string());
        assert_eq!(&b[..], &[0, 0, 0, 5, b'a', b'b', b'c', b'd', b'e', 0, 0, 0]);
        assert_eq!(from_bytes::<String>(&b).unwrap(), "abcde");
    }

    #[test]
    fn optional_string_round_trips() {
        let v: Option<String> = Some("x".into());
        let b = to_bytes(&v);
        assert_eq!(&b[..], &[0, 0, 0, 1, 0, 0, 0, 1, b'x', 0, 0, 0]);
        assert_eq!(from_bytes::<Option<String>>(&b).unwrap(), v);
        assert_eq!(from_bytes::<Option<String>>(&[0, 0, 0, 0]).unwrap(), None);
    }

    #[test]
    fn huge_array_length_is_rejected_before_allocating() {
        // finding: L27 — a length of 2^32-1 elements must not reserve memory.
        let b = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1];
        let err = from_bytes::<Vec<u64>>(&b).unwrap_err();
        assert!(matches!(err, XdrError::TooLong { .. }), "{err:?}");
    }

    #[test]
    fn string_over_the_protocol_limit_is_rejected() {
        let mut b = vec![];
        b.extend_from_slice(&((STRING_MAX as u32) + 1).to_be_bytes());
        b.resize(4 + STRING_MAX + 4, b'a');
        assert!(matches!(
            from_bytes::<String>(&b),
            Err(XdrError::TooLong { .. })
        ));
    }

    #[test]
    fn bad_discriminant_and_trailing_bytes_are_errors() {
        assert!(matches!(
            from_bytes::<Option<u32>>(&[0, 0, 0, 2]),
            Err(XdrError::BadDiscriminant { value: 2, .. })
        ));
        assert!(matches!(
            from_bytes::<u32>(&[0, 0, 0, 2, 0]),
            Err(XdrError::Trailing(1))
        ));
        assert!(matches!(
            from_bytes::<u64>(&[0, 0, 0, 2]),
            Err(XdrError::Truncated { .. })
        ));
    }
}
