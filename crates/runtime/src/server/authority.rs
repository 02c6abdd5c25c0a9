//! Makes requests whose HTTP/2 `:authority` h2 would reject acceptable to it, by rewriting the
//! client's header blocks before h2 reads them.
//!
//! Older grpc-go (crictl, critest and kubelets of the v1.29 era) sends the unix socket path, e.g.
//! `/run/berth/runtime.sock`, as `:authority`. h2 refuses that as a malformed authority and
//! resets every stream (hyperium/h2#487), while containerd accepts it. So every connection is
//! wrapped: the 24-byte preface and all frames other than HEADERS/CONTINUATION pass through
//! unchanged; each header block is HPACK-decoded with the client's dynamic table, an
//! `:authority` that is not a valid URI authority becomes `localhost`, and the block is
//! re-encoded without touching the dynamic table. Every block is re-encoded, not only the bad
//! ones: the client's blocks may refer to its dynamic table, which h2's decoder never sees.
//! Server→client bytes are not touched.

use std::borrow::Cow;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Stream dependency (4 bytes) and weight (1) carried by a HEADERS frame with PRIORITY set.
const PRIORITY_LEN: usize = 5;
/// The frame size every peer must accept; h2 advertises no larger, so re-encoded blocks are split
/// at it.
const MAX_FRAME_LEN: usize = 16_384;
/// Bounds what one header block may buffer here; far above any real gRPC metadata.
const MAX_BLOCK_LEN: usize = 1 << 20;
/// Bounds the client's HPACK table. h2 advertises the default 4096, so anything legal fits.
const MAX_TABLE_SIZE: usize = 1 << 16;
/// What replaces an `:authority` h2 would reject.
const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";
const READ_CHUNK: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("header block on stream {stream_id} is larger than {MAX_BLOCK_LEN} bytes")]
    BlockTooLarge { stream_id: u32 },
    #[error("frame of type {frame_type} on stream {stream_id} interrupts a header block")]
    Interrupted { frame_type: u8, stream_id: u32 },
    #[error("HEADERS frame on stream {stream_id} has more padding or priority than payload")]
    BadPadding { stream_id: u32 },
    #[error("cannot decode header block on stream {stream_id}")]
    Decode {
        stream_id: u32,
        #[source]
        source: loona_hpack::decoder::DecoderError,
    },
}

/// A header block being collected from a HEADERS frame and its CONTINUATIONs.
struct Block {
    stream_id: u32,
    end_stream: bool,
    fragments: Vec<u8>,
}

/// The client→server half of one connection, as a pure byte transformer.
///
/// Bytes that pass unchanged (the preface and frame payloads) are left in the input for the
/// caller to copy in one go ([`Rewriter::verbatim`]); [`Rewriter::rewrite`] handles what lies
/// between them.
pub struct Rewriter {
    preface_left: usize,
    payload_left: usize,
    block: Option<Block>,
    decoder: loona_hpack::Decoder<'static>,
    encoded: Vec<u8>,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE_SIZE);
        Rewriter { preface_left: PREFACE_LEN, payload_left: 0, block: None, decoder, encoded: Vec::new() }
    }
}

impl Rewriter {
    /// How many bytes at the front of the input go to the server unchanged.
    pub fn verbatim(&self) -> usize {
        self.preface_left + self.payload_left
    }

    /// Records that the caller passed `n` (at most [`Rewriter::verbatim`]) bytes on unchanged.
    pub fn consume_verbatim(&mut self, n: usize) {
        let from_preface = n.min(self.preface_left);
        self.preface_left -= from_preface;
        self.payload_left -= n - from_preface;
    }

    /// Takes whole frame headers and header blocks from `input` and appends what h2 should see to
    /// `out`. Stops when `input` holds no complete unit or verbatim bytes are due.
    pub fn rewrite(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> Result<(), RewriteError> {
        while self.verbatim() == 0 && input.len() >= FRAME_HEADER_LEN {
            let len = usize::from(input[0]) << 16 | usize::from(input[1]) << 8 | usize::from(input[2]);
            let (frame_type, flags) = (input[3], input[4]);
            let stream_id = u32::from_be_bytes([input[5], input[6], input[7], input[8]]) & 0x7fff_ffff;

            let collecting = self.block.as_ref().map(|b| b.stream_id);
            let is_header_frame = frame_type == HEADERS || (frame_type == CONTINUATION && collecting.is_some());
            if !is_header_frame {
                if collecting.is_some() {
                    return Err(RewriteError::Interrupted { frame_type, stream_id });
                }
                // A stray CONTINUATION lands here too: h2 answers it with the protocol error.
                out.extend_from_slice(&input[..FRAME_HEADER_LEN]);
                input.advance(FRAME_HEADER_LEN);
                self.payload_left = len;
                continue;
            }
            if len > MAX_BLOCK_LEN {
                return Err(RewriteError::BlockTooLarge { stream_id });
            }
            if input.len() < FRAME_HEADER_LEN + len {
                input.reserve(FRAME_HEADER_LEN + len - input.len());
                return Ok(());
            }
            let frame = input.split_to(FRAME_HEADER_LEN + len);
            let payload = &frame[FRAME_HEADER_LEN..];

            let fragment = if frame_type == HEADERS {
                if collecting.is_some() {
                    return Err(RewriteError::Interrupted { frame_type, stream_id });
                }
                self.block = Some(Block { stream_id, end_stream: flags & END_STREAM != 0, fragments: Vec::new() });
                headers_fragment(payload, flags).ok_or(RewriteError::BadPadding { stream_id })?
            } else if collecting != Some(stream_id) {
                return Err(RewriteError::Interrupted { frame_type, stream_id });
            } else {
                payload
            };
            let block = self.block.as_mut().expect("a block is being collected");
            if block.fragments.len() + fragment.len() > MAX_BLOCK_LEN {
                return Err(RewriteError::BlockTooLarge { stream_id });
            }
            block.fragments.extend_from_slice(fragment);

            if flags & END_HEADERS != 0 {
                let block = self.block.take().expect("a block is being collected");
                self.reencode(&block)?;
                write_block(out, &self.encoded, block.stream_id, block.end_stream);
            }
        }
        Ok(())
    }

    /// Decodes `block` with the client's table into `self.encoded` as literals that are never
    /// indexed, so h2's decoder table stays empty and every block stands on its own.
    fn reencode(&mut self, block: &Block) -> Result<(), RewriteError> {
        let encoded = &mut self.encoded;
        encoded.clear();
        let stream_id = block.stream_id;
        self.decoder
            .decode_with_cb(&block.fragments, |name: Cow<[u8]>, value: Cow<[u8]>| {
                let value = if &*name == b":authority" && http::uri::Authority::try_from(&*value).is_err() {
                    tracing::debug!(stream_id, authority = %String::from_utf8_lossy(&value), "replacing authority");
                    REPLACEMENT_AUTHORITY
                } else {
                    &value[..]
                };
                encode_literal(encoded, &name, value);
            })
            .map_err(|source| RewriteError::Decode { stream_id, source })
    }
}

/// The header block fragment of a HEADERS payload, without padding and priority; `None` if those
/// claim more bytes than there are.
fn headers_fragment(payload: &[u8], flags: u8) -> Option<&[u8]> {
    let mut fragment = payload;
    if flags & PADDED != 0 {
        let (&pad, rest) = fragment.split_first()?;
        fragment = rest.get(..rest.len().checked_sub(usize::from(pad))?)?;
    }
    if flags & PRIORITY != 0 {
        fragment = fragment.get(PRIORITY_LEN..)?;
    }
    Some(fragment)
}

/// Writes `block` as one HEADERS frame and as many CONTINUATIONs as it needs.
fn write_block(out: &mut BytesMut, block: &[u8], stream_id: u32, end_stream: bool) {
    let first = block.len().min(MAX_FRAME_LEN);
    let mut flags = if end_stream { END_STREAM } else { 0 };
    if first == block.len() {
        flags |= END_HEADERS;
    }
    out.reserve(block.len() + FRAME_HEADER_LEN * (1 + block.len() / MAX_FRAME_LEN));
    write_frame(out, HEADERS, flags, stream_id, &block[..first]);
    let mut rest = &block[first..];
    while !rest.is_empty() {
        let n = rest.len().min(MAX_FRAME_LEN);
        let flags = if n == rest.len() { END_HEADERS } else { 0 };
        write_frame(out, CONTINUATION, flags, stream_id, &rest[..n]);
        rest = &rest[n..];
    }
}

fn write_frame(out: &mut BytesMut, frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("frame payloads are at most MAX_FRAME_LEN");
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_u8(frame_type);
    out.put_u8(flags);
    out.put_u32(stream_id);
    out.put_slice(payload);
}

/// RFC 7541 §6.2.2, literal header field without indexing, new name, no Huffman coding.
fn encode_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0);
    encode_string(out, name);
    encode_string(out, value);
}

/// RFC 7541 §5.2 string literal (H = 0) with its §5.1 length prefix of 7 bits.
fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    const PREFIX_MAX: usize = 0x7f;
    if s.len() < PREFIX_MAX {
        out.push(s.len() as u8);
    } else {
        out.push(PREFIX_MAX as u8);
        let mut rest = s.len() - PREFIX_MAX;
        while rest >= 0x80 {
            out.push((rest & 0x7f) as u8 | 0x80);
            rest >>= 7;
        }
        out.push(rest as u8);
    }
    out.extend_from_slice(s);
}

/// A client connection whose incoming bytes pass through a [`Rewriter`]; writes go straight to
/// the socket.
pub struct AuthorityRewrite<S> {
    inner: S,
    rewriter: Rewriter,
    /// Bytes read from the client and not yet handed to h2.
    input: BytesMut,
    /// Rewritten bytes ready for h2.
    output: BytesMut,
    eof: bool,
}

impl<S> AuthorityRewrite<S> {
    pub fn new(inner: S) -> Self {
        AuthorityRewrite {
            inner,
            rewriter: Rewriter::default(),
            input: BytesMut::new(),
            output: BytesMut::new(),
            eof: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityRewrite<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            // Unchanged bytes (mostly DATA payloads) skip the output buffer.
            let n = this.rewriter.verbatim().min(this.input.len()).min(buf.remaining());
            if n > 0 {
                buf.put_slice(&this.input[..n]);
                this.input.advance(n);
                this.rewriter.consume_verbatim(n);
                return Poll::Ready(Ok(()));
            }
            this.rewriter
                .rewrite(&mut this.input, &mut this.output)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if !this.output.is_empty() || (this.rewriter.verbatim() > 0 && !this.input.is_empty()) {
                continue;
            }
            if this.eof {
                // A frame cut short by the client goes to h2 as it is, for h2 to report.
                this.output = this.input.split();
                if this.output.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            this.input.reserve(READ_CHUNK);
            if ready!(tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.input))? == 0 {
                this.eof = true;
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityRewrite<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for AuthorityRewrite<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8; PREFACE_LEN] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const SETTINGS: u8 = 0x4;
    const DATA: u8 = 0x0;

    type Headers = Vec<(Vec<u8>, Vec<u8>)>;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
    }

    fn request(authority: &str) -> Headers {
        headers(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/runtime.v1.RuntimeService/Version"),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("user-agent", "grpc-go/1.58.3"),
            ("te", "trailers"),
        ])
    }

    fn frame(frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        write_frame(&mut out, frame_type, flags, stream_id, payload);
        out.to_vec()
    }

    fn encode(encoder: &mut loona_hpack::Encoder<'static>, headers: &Headers) -> Vec<u8> {
        encoder.encode(headers.iter().map(|(n, v)| (&n[..], &v[..])))
    }

    /// Splits a byte stream after the preface into (type, flags, stream id, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut frames = Vec::new();
        while !bytes.is_empty() {
            let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream_id = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            frames.push((bytes[3], bytes[4], stream_id, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        frames
    }

    /// Runs the rewriter over `chunks` as they would arrive from a socket.
    fn rewrite<'a>(rewriter: &mut Rewriter, chunks: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
        let (mut input, mut out) = (BytesMut::new(), BytesMut::new());
        for chunk in chunks {
            input.extend_from_slice(chunk);
            loop {
                let n = rewriter.verbatim().min(input.len());
                out.extend_from_slice(&input.split_to(n));
                rewriter.consume_verbatim(n);
                let before = input.len();
                rewriter.rewrite(&mut input, &mut out).unwrap();
                if input.len() == before && (rewriter.verbatim() == 0 || input.is_empty()) {
                    break;
                }
            }
        }
        assert!(input.is_empty(), "everything was consumed");
        out.to_vec()
    }

    /// What h2 would decode from a rewritten block, with a decoder that has seen nothing else.
    fn decode_alone(block: &[u8]) -> Headers {
        loona_hpack::Decoder::new().decode(block).unwrap()
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_everything_else_is_unchanged() {
        let mut encoder = loona_hpack::Encoder::new();
        let settings = frame(SETTINGS, 0, 0, &[0, 4, 0, 0x10, 0, 0]);
        let data = frame(DATA, END_STREAM, 1, b"\0\0\0\0\x07\n\x050.1.0");
        let block = encode(&mut encoder, &request("/run/berth/runtime.sock"));
        let client = [&PREFACE[..], &settings, &frame(HEADERS, END_HEADERS, 1, &block), &data].concat();

        let out = rewrite(&mut Rewriter::default(), [&client[..]]);

        assert_eq!(&out[..PREFACE_LEN], PREFACE);
        let frames = frames(&out[PREFACE_LEN..]);
        assert_eq!(frames.len(), 3);
        assert_eq!(frame(frames[0].0, frames[0].1, frames[0].2, &frames[0].3), settings);
        let (frame_type, flags, stream_id, block) = &frames[1];
        assert_eq!((*frame_type, *flags, *stream_id), (HEADERS, END_HEADERS, 1));
        assert_eq!(decode_alone(block), request("localhost"));
        assert_eq!(frame(frames[2].0, frames[2].1, frames[2].2, &frames[2].3), data);
    }

    #[test]
    fn a_valid_authority_is_kept() {
        let block = encode(&mut loona_hpack::Encoder::new(), &request("localhost:1234"));
        let client = [&PREFACE[..], &frame(HEADERS, END_HEADERS | END_STREAM, 3, &block)].concat();
        let out = rewrite(&mut Rewriter::default(), [&client[..]]);
        let frames = frames(&out[PREFACE_LEN..]);
        assert_eq!((frames[0].0, frames[0].1), (HEADERS, END_HEADERS | END_STREAM));
        assert_eq!(decode_alone(&frames[0].3), request("localhost:1234"));
    }

    #[test]
    fn empty_and_percent_encoded_authorities_are_replaced_too() {
        for bad in ["", "%2Frun%2Fberth.sock", "unix:///run/x.sock"] {
            let block = encode(&mut loona_hpack::Encoder::new(), &request(bad));
            let client = [&PREFACE[..], &frame(HEADERS, END_HEADERS, 1, &block)].concat();
            let out = rewrite(&mut Rewriter::default(), [&client[..]]);
            assert_eq!(decode_alone(&frames(&out[PREFACE_LEN..])[0].3), request("localhost"), "{bad:?}");
        }
    }

    #[test]
    fn padding_priority_and_continuations_are_folded_into_one_headers_frame() {
        let block = encode(&mut loona_hpack::Encoder::new(), &request("/tmp/x.sock"));
        let (a, rest) = block.split_at(10);
        let (b, c) = rest.split_at(20);
        let mut first = vec![3]; // pad length
        first.extend_from_slice(&[0x80, 0, 0, 0, 15]); // exclusive dependency on stream 0, weight 16
        first.extend_from_slice(a);
        first.extend_from_slice(&[0, 0, 0]);
        let client = [
            &PREFACE[..],
            &frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &first),
            &frame(CONTINUATION, 0, 5, b),
            &frame(CONTINUATION, END_HEADERS, 5, c),
        ]
        .concat();

        let out = rewrite(&mut Rewriter::default(), [&client[..]]);

        let frames = frames(&out[PREFACE_LEN..]);
        assert_eq!(frames.len(), 1);
        assert_eq!((frames[0].0, frames[0].1, frames[0].2), (HEADERS, END_HEADERS | END_STREAM, 5));
        assert_eq!(decode_alone(&frames[0].3), request("localhost"));
    }

    #[test]
    fn later_requests_that_refer_to_the_clients_dynamic_table_still_decode() {
        fn literal_indexed(out: &mut Vec<u8>, name_index: u8, value: &str) {
            out.push(0x40 | name_index); // RFC 7541 §6.2.1, indexed name
            encode_string(out, value.as_bytes());
        }
        // The first request adds :path, :authority, content-type and te to the client's table,
        // newest first at index 62; the second sends a table size update and refers to them all.
        let mut first = vec![0x83, 0x86];
        literal_indexed(&mut first, 4, "/runtime.v1.RuntimeService/Version");
        literal_indexed(&mut first, 1, "/tmp/x.sock");
        literal_indexed(&mut first, 31, "application/grpc");
        first.push(0x40);
        encode_string(&mut first, b"te");
        encode_string(&mut first, b"trailers");
        let second = [0x3f, 0xe1, 0x1f, 0x83, 0x86, 0xc1, 0xc0, 0xbf, 0xbe];
        let client =
            [&PREFACE[..], &frame(HEADERS, END_HEADERS, 1, &first), &frame(HEADERS, END_HEADERS, 3, &second)].concat();

        let out = rewrite(&mut Rewriter::default(), [&client[..]]);

        let frames = frames(&out[PREFACE_LEN..]);
        assert_eq!(frames.len(), 2);
        let expected = headers(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/runtime.v1.RuntimeService/Version"),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]);
        for (_, _, _, block) in &frames {
            assert_eq!(decode_alone(block), expected);
        }
    }

    #[test]
    fn huffman_coded_requests_from_rfc_7541_decode_with_their_table() {
        // RFC 7541 C.4.1 and C.4.2: the second refers to an entry the first added.
        let first =
            [0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff];
        let second = [0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf];
        let client = [
            &PREFACE[..],
            &frame(HEADERS, END_HEADERS | END_STREAM, 1, &first),
            &frame(HEADERS, END_HEADERS | END_STREAM, 3, &second),
        ]
        .concat();

        let out = rewrite(&mut Rewriter::default(), [&client[..]]);

        let frames = frames(&out[PREFACE_LEN..]);
        let base = [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")];
        assert_eq!(decode_alone(&frames[0].3), headers(&base));
        assert_eq!(decode_alone(&frames[1].3), headers(&[&base[..], &[("cache-control", "no-cache")]].concat()));
    }

    #[test]
    fn a_block_larger_than_a_frame_is_split_into_continuations() {
        let mut big = request("/tmp/x.sock");
        big.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let block = encode(&mut loona_hpack::Encoder::new(), &big);
        let client = [&PREFACE[..], &frame(HEADERS, END_HEADERS | END_STREAM, 1, &block)].concat();

        let out = rewrite(&mut Rewriter::default(), [&client[..]]);

        let frames = frames(&out[PREFACE_LEN..]);
        let kinds: Vec<_> = frames.iter().map(|f| (f.0, f.1, f.3.len() == MAX_FRAME_LEN)).collect();
        assert_eq!(kinds, [(HEADERS, END_STREAM, true), (CONTINUATION, 0, true), (CONTINUATION, END_HEADERS, false)]);
        big[3].1 = b"localhost".to_vec();
        assert_eq!(decode_alone(&frames.iter().flat_map(|f| f.3.clone()).collect::<Vec<_>>()), big);
    }

    #[test]
    fn input_arriving_a_byte_at_a_time_comes_out_the_same() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encode(&mut encoder, &request("/tmp/x.sock"));
        let client = [
            &PREFACE[..],
            &frame(SETTINGS, 0, 0, &[]),
            &frame(HEADERS, END_HEADERS, 1, &block),
            &frame(DATA, END_STREAM, 1, &[7; 300]),
            &frame(HEADERS, END_HEADERS | END_STREAM, 3, &encode(&mut encoder, &request("/tmp/x.sock"))),
        ]
        .concat();
        let whole = rewrite(&mut Rewriter::default(), [&client[..]]);
        let bytewise = rewrite(&mut Rewriter::default(), client.chunks(1));
        assert_eq!(whole, bytewise);
        assert_eq!(frames(&whole[PREFACE_LEN..]).len(), 4);
    }

    #[test]
    fn a_frame_interrupting_a_header_block_is_an_error() {
        let block = encode(&mut loona_hpack::Encoder::new(), &request("/tmp/x.sock"));
        let client = [&PREFACE[..], &frame(HEADERS, 0, 1, &block), &frame(DATA, 0, 1, b"x")].concat();
        let (mut rewriter, mut out) = (Rewriter::default(), BytesMut::new());
        let mut input = BytesMut::from(&client[PREFACE_LEN..]);
        rewriter.consume_verbatim(PREFACE_LEN);
        let err = rewriter.rewrite(&mut input, &mut out).unwrap_err();
        assert!(matches!(err, RewriteError::Interrupted { frame_type: DATA, stream_id: 1 }), "{err}");
    }

    #[tokio::test]
    async fn the_connection_wrapper_hands_h2_the_rewritten_stream() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut encoder = loona_hpack::Encoder::new();
        let client = [
            &PREFACE[..],
            &frame(SETTINGS, 0, 0, &[]),
            &frame(HEADERS, END_HEADERS, 1, &encode(&mut encoder, &request("/tmp/x.sock"))),
            &frame(DATA, END_STREAM, 1, &[7; 50_000]),
            &frame(HEADERS, END_HEADERS | END_STREAM, 3, &encode(&mut encoder, &request("/tmp/x.sock"))),
        ]
        .concat();
        let expected = rewrite(&mut Rewriter::default(), [&client[..]]);

        // A small pipe makes reads end mid-frame, as on a real socket.
        let (mut near, far) = tokio::io::duplex(1000);
        let writer = tokio::spawn(async move {
            near.write_all(&client).await.unwrap();
            near.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        AuthorityRewrite::new(far).read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got, expected);
    }
}
