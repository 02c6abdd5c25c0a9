//! SPDY/3 frames on the wire: parsing, serialising, and the zlib-compressed header blocks.
//!
//! Header blocks in both directions are one zlib stream per direction for the whole connection,
//! primed with the SPDY/3 dictionary and sync-flushed after every block, so the codec is stateful.

use std::io;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt};

const VERSION: u16 = 3;
const CONTROL_BIT: u32 = 0x8000_0000;
pub const FLAG_FIN: u8 = 0x01;
const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// The length field is 24 bits.
const MAX_FRAME_LEN: usize = (1 << 24) - 1;
/// A decompressed header block bigger than this is refused (a zlib bomb guard).
const MAX_HEADER_BLOCK: usize = 1 << 20;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status codes used by the server.
pub const RST_PROTOCOL_ERROR: u32 = 1;
pub const RST_REFUSED_STREAM: u32 = 3;

/// Header names are lower case on the wire; several values of one name are joined by NUL.
pub type Headers = Vec<(String, String)>;

#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Data {
        stream_id: u32,
        fin: bool,
        data: Bytes,
    },
    SynStream {
        stream_id: u32,
        associated_to: u32,
        priority: u8,
        fin: bool,
        unidirectional: bool,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        entries: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        fin: bool,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    /// A control frame type this implementation ignores (NOOP, CREDENTIAL, …).
    Unknown {
        kind: u16,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("reading frame")]
    Io(#[from] io::Error),
    #[error("unsupported spdy version {0}")]
    Version(u16),
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    #[error("header block does not decompress")]
    Compression,
}

/// The SPDY/3 header compression dictionary (SPDY/3 draft, section 2.6.10.1): length-prefixed
/// common header names and values followed by a run of common literal text.
fn dictionary() -> &'static [u8] {
    static DICT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    DICT.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = concat!(
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
            "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
            "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
            "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
            "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
            "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
            "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
        );
        let mut dict = Vec::with_capacity(1424);
        for word in WORDS {
            dict.extend_from_slice(&(word.len() as u32).to_be_bytes());
            dict.extend_from_slice(word.as_bytes());
        }
        dict.extend_from_slice(TAIL.as_bytes());
        dict
    })
}

/// Compresses outgoing header blocks; one per connection direction.
pub struct HeaderEncoder {
    zlib: Compress,
    primed: bool,
}

impl Default for HeaderEncoder {
    fn default() -> Self {
        Self { zlib: Compress::new(Compression::default(), true), primed: false }
    }
}

impl HeaderEncoder {
    fn encode(&mut self, headers: &Headers) -> io::Result<Vec<u8>> {
        let mut raw = BytesMut::new();
        raw.put_u32(headers.len() as u32);
        for (name, value) in headers {
            raw.put_u32(name.len() as u32);
            raw.put_slice(name.to_ascii_lowercase().as_bytes());
            raw.put_u32(value.len() as u32);
            raw.put_slice(value.as_bytes());
        }
        if !self.primed {
            self.zlib.set_dictionary(dictionary()).map_err(io::Error::other)?;
            self.primed = true;
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut consumed = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(256);
            }
            let before = self.zlib.total_in();
            self.zlib.compress_vec(&raw[consumed..], &mut out, FlushCompress::Sync).map_err(io::Error::other)?;
            consumed += (self.zlib.total_in() - before) as usize;
            // With a sync flush, spare output room after all input is in means the flush completed.
            if consumed == raw.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// Decompresses incoming header blocks; one per connection direction.
pub struct HeaderDecoder {
    zlib: Decompress,
}

impl Default for HeaderDecoder {
    fn default() -> Self {
        Self { zlib: Decompress::new(true) }
    }
}

impl HeaderDecoder {
    fn decode(&mut self, block: &[u8]) -> Result<Headers, FrameError> {
        let mut out = Vec::with_capacity(block.len() * 4 + 256);
        let mut consumed = 0;
        loop {
            if out.capacity() - out.len() < 256 {
                if out.len() > MAX_HEADER_BLOCK {
                    return Err(FrameError::Compression);
                }
                out.reserve(out.capacity());
            }
            let (in_before, out_before) = (self.zlib.total_in(), out.len());
            if let Err(e) = self.zlib.decompress_vec(&block[consumed..], &mut out, FlushDecompress::Sync) {
                if e.needs_dictionary().is_none() {
                    return Err(FrameError::Compression);
                }
                self.zlib.set_dictionary(dictionary()).map_err(|_| FrameError::Compression)?;
            }
            consumed += (self.zlib.total_in() - in_before) as usize;
            if consumed == block.len() && out.len() < out.capacity() {
                break;
            }
            if self.zlib.total_in() == in_before && out.len() == out_before && consumed < block.len() {
                // No progress although input remains: the stream is corrupt.
                return Err(FrameError::Compression);
            }
        }
        parse_header_block(&out)
    }
}

fn parse_header_block(mut raw: &[u8]) -> Result<Headers, FrameError> {
    let bad = FrameError::Malformed("header block");
    fn take_string(raw: &mut &[u8]) -> Option<String> {
        if raw.remaining() < 4 {
            return None;
        }
        let len = raw.get_u32() as usize;
        if raw.remaining() < len {
            return None;
        }
        let s = String::from_utf8_lossy(&raw[..len]).into_owned();
        raw.advance(len);
        Some(s)
    }
    if raw.remaining() < 4 {
        return Err(bad);
    }
    let count = raw.get_u32();
    let mut headers = Vec::new();
    for _ in 0..count {
        let name = take_string(&mut raw).ok_or(FrameError::Malformed("header block"))?;
        let value = take_string(&mut raw).ok_or(FrameError::Malformed("header block"))?;
        headers.push((name.to_ascii_lowercase(), value));
    }
    Ok(headers)
}

/// Looks up a header by (case-insensitive) name; the first of several NUL-separated values.
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.split('\0').next().unwrap_or(""))
}

/// Reads one frame from `r`, decompressing header blocks with `decoder`.
/// Returns `Ok(None)` on a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    decoder: &mut HeaderDecoder,
) -> Result<Option<Frame>, FrameError> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let first = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let flags = head[4];
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    let fin = flags & FLAG_FIN != 0;
    if first & CONTROL_BIT == 0 {
        return Ok(Some(Frame::Data { stream_id: first, fin, data: Bytes::from(payload) }));
    }
    let version = ((first >> 16) & 0x7fff) as u16;
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let kind = (first & 0xffff) as u16;
    let mut p = payload.as_slice();
    let need =
        |p: &[u8], n: usize, what: &'static str| if p.len() < n { Err(FrameError::Malformed(what)) } else { Ok(()) };
    let frame = match kind {
        TYPE_SYN_STREAM => {
            need(p, 10, "SYN_STREAM")?;
            let stream_id = p.get_u32() & 0x7fff_ffff;
            let associated_to = p.get_u32() & 0x7fff_ffff;
            let priority = p.get_u8() >> 5;
            let _slot = p.get_u8();
            let headers = decoder.decode(p)?;
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                fin,
                unidirectional: flags & FLAG_UNIDIRECTIONAL != 0,
                headers,
            }
        }
        TYPE_SYN_REPLY => {
            need(p, 4, "SYN_REPLY")?;
            let stream_id = p.get_u32() & 0x7fff_ffff;
            Frame::SynReply { stream_id, fin, headers: decoder.decode(p)? }
        }
        TYPE_HEADERS => {
            need(p, 4, "HEADERS")?;
            let stream_id = p.get_u32() & 0x7fff_ffff;
            Frame::Headers { stream_id, fin, headers: decoder.decode(p)? }
        }
        TYPE_RST_STREAM => {
            need(p, 8, "RST_STREAM")?;
            Frame::RstStream { stream_id: p.get_u32() & 0x7fff_ffff, status: p.get_u32() }
        }
        TYPE_SETTINGS => {
            need(p, 4, "SETTINGS")?;
            let count = p.get_u32() as usize;
            need(p, count.saturating_mul(8), "SETTINGS")?;
            let entries = (0..count)
                .map(|_| {
                    let word = p.get_u32();
                    ((word >> 24) as u8, word & 0x00ff_ffff, p.get_u32())
                })
                .collect();
            Frame::Settings { entries }
        }
        TYPE_PING => {
            need(p, 4, "PING")?;
            Frame::Ping { id: p.get_u32() }
        }
        TYPE_GOAWAY => {
            need(p, 4, "GOAWAY")?;
            let last_good_stream_id = p.get_u32() & 0x7fff_ffff;
            // SPDY/3 added the status; tolerate its absence.
            let status = if p.len() >= 4 { p.get_u32() } else { 0 };
            Frame::GoAway { last_good_stream_id, status }
        }
        TYPE_WINDOW_UPDATE => {
            need(p, 8, "WINDOW_UPDATE")?;
            Frame::WindowUpdate { stream_id: p.get_u32() & 0x7fff_ffff, delta: p.get_u32() & 0x7fff_ffff }
        }
        kind => Frame::Unknown { kind },
    };
    Ok(Some(frame))
}

/// Serialises `frame` into `out`, compressing header blocks with `encoder`.
pub fn write_frame(frame: &Frame, encoder: &mut HeaderEncoder, out: &mut BytesMut) -> io::Result<()> {
    let control = |out: &mut BytesMut, kind: u16, flags: u8, payload: &[u8]| -> io::Result<()> {
        if payload.len() > MAX_FRAME_LEN {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "spdy frame too large"));
        }
        out.put_u32(CONTROL_BIT | (u32::from(VERSION) << 16) | u32::from(kind));
        out.put_u32((u32::from(flags) << 24) | payload.len() as u32);
        out.put_slice(payload);
        Ok(())
    };
    let fin_flag = |fin: bool| if fin { FLAG_FIN } else { 0 };
    match frame {
        Frame::Data { stream_id, fin, data } => {
            if data.len() > MAX_FRAME_LEN {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "spdy frame too large"));
            }
            out.put_u32(stream_id & 0x7fff_ffff);
            out.put_u32((u32::from(fin_flag(*fin)) << 24) | data.len() as u32);
            out.put_slice(data);
            Ok(())
        }
        Frame::SynStream { stream_id, associated_to, priority, fin, unidirectional, headers } => {
            let mut p = BytesMut::new();
            p.put_u32(*stream_id);
            p.put_u32(*associated_to);
            p.put_u8((priority & 0x7) << 5);
            p.put_u8(0);
            p.put_slice(&encoder.encode(headers)?);
            let flags = fin_flag(*fin) | if *unidirectional { FLAG_UNIDIRECTIONAL } else { 0 };
            control(out, TYPE_SYN_STREAM, flags, &p)
        }
        Frame::SynReply { stream_id, fin, headers } | Frame::Headers { stream_id, fin, headers } => {
            let kind = if matches!(frame, Frame::SynReply { .. }) { TYPE_SYN_REPLY } else { TYPE_HEADERS };
            let mut p = BytesMut::new();
            p.put_u32(*stream_id);
            p.put_slice(&encoder.encode(headers)?);
            control(out, kind, fin_flag(*fin), &p)
        }
        Frame::RstStream { stream_id, status } => {
            control(out, TYPE_RST_STREAM, 0, &[stream_id.to_be_bytes(), status.to_be_bytes()].concat())
        }
        Frame::Settings { entries } => {
            let mut p = BytesMut::new();
            p.put_u32(entries.len() as u32);
            for (flags, id, value) in entries {
                p.put_u32((u32::from(*flags) << 24) | (id & 0x00ff_ffff));
                p.put_u32(*value);
            }
            control(out, TYPE_SETTINGS, 0, &p)
        }
        Frame::Ping { id } => control(out, TYPE_PING, 0, &id.to_be_bytes()),
        Frame::GoAway { last_good_stream_id, status } => {
            control(out, TYPE_GOAWAY, 0, &[last_good_stream_id.to_be_bytes(), status.to_be_bytes()].concat())
        }
        Frame::WindowUpdate { stream_id, delta } => {
            control(out, TYPE_WINDOW_UPDATE, 0, &[stream_id.to_be_bytes(), delta.to_be_bytes()].concat())
        }
        Frame::Unknown { kind } => {
            Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cannot write frame {kind}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn round_trip(frames: &[Frame]) -> Vec<Frame> {
        let mut encoder = HeaderEncoder::default();
        let mut buf = BytesMut::new();
        for f in frames {
            write_frame(f, &mut encoder, &mut buf).unwrap();
        }
        let mut decoder = HeaderDecoder::default();
        let mut r = &buf[..];
        let mut out = Vec::new();
        while let Some(f) = read_frame(&mut r, &mut decoder).await.unwrap() {
            out.push(f);
        }
        out
    }

    #[test]
    fn the_dictionary_has_the_spdy3_length_and_boundaries() {
        let dict = dictionary();
        assert_eq!(dict.len(), 1423);
        assert_eq!(&dict[..11], b"\0\0\0\x07options");
        assert!(dict.ends_with(b",enq=0."));
    }

    #[tokio::test]
    async fn frames_survive_a_round_trip_with_one_compression_context_across_blocks() {
        let h = |v: &str| vec![("streamtype".to_string(), v.to_string()), ("port".to_string(), "80".to_string())];
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                fin: false,
                unidirectional: false,
                headers: h("error"),
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 0,
                priority: 0,
                fin: false,
                unidirectional: false,
                headers: h("data"),
            },
            Frame::SynReply { stream_id: 1, fin: false, headers: vec![] },
            Frame::Data { stream_id: 3, fin: true, data: Bytes::from_static(b"hello") },
            Frame::RstStream { stream_id: 5, status: RST_REFUSED_STREAM },
            Frame::Settings { entries: vec![(0, 7, 65536)] },
            Frame::Ping { id: 1 },
            Frame::GoAway { last_good_stream_id: 3, status: 0 },
            Frame::WindowUpdate { stream_id: 3, delta: 100 },
            Frame::Headers { stream_id: 3, fin: true, headers: h("x") },
        ];
        assert_eq!(round_trip(&frames).await, frames);
    }

    #[tokio::test]
    async fn a_data_frame_has_the_documented_layout() {
        let mut buf = BytesMut::new();
        let f = Frame::Data { stream_id: 5, fin: true, data: Bytes::from_static(b"ab") };
        write_frame(&f, &mut HeaderEncoder::default(), &mut buf).unwrap();
        assert_eq!(&buf[..], &[0, 0, 0, 5, 1, 0, 0, 2, b'a', b'b']);
        let mut buf = BytesMut::new();
        write_frame(&Frame::Ping { id: 7 }, &mut HeaderEncoder::default(), &mut buf).unwrap();
        assert_eq!(&buf[..], &[0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 7]);
    }

    #[tokio::test]
    async fn a_header_block_from_a_plain_zlib_with_the_dictionary_decodes() {
        // Compress a block independently of HeaderEncoder to check the framing of the block itself.
        let mut raw = BytesMut::new();
        raw.put_u32(1);
        raw.put_u32(10);
        raw.put_slice(b"streamtype");
        raw.put_u32(6);
        raw.put_slice(b"stdout");
        let mut z = Compress::new(Compression::best(), true);
        z.set_dictionary(dictionary()).unwrap();
        let mut block = Vec::with_capacity(512);
        z.compress_vec(&raw, &mut block, FlushCompress::Sync).unwrap();
        let mut frame = BytesMut::new();
        frame.put_u32(0x8003_0002);
        frame.put_u32(4 + block.len() as u32);
        frame.put_u32(9);
        frame.put_slice(&block);
        let got = read_frame(&mut &frame[..], &mut HeaderDecoder::default()).await.unwrap().unwrap();
        assert_eq!(
            got,
            Frame::SynReply { stream_id: 9, fin: false, headers: vec![("streamtype".into(), "stdout".into())] }
        );
    }

    #[tokio::test]
    async fn a_frame_with_another_version_is_rejected() {
        let raw = [0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1];
        let err = read_frame(&mut &raw[..], &mut HeaderDecoder::default()).await.unwrap_err();
        assert!(matches!(err, FrameError::Version(2)));
    }
}
