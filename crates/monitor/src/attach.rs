//! The attach protocol spoken on a monitor's `--attach-socket`: the frames that carry the
//! container's output and exit code to clients, and the parsing helpers clients use.
//!
//! # Wire protocol
//!
//! The monitor listens on a unix stream socket at the `--attach-socket` path (mode 0600; the
//! parent dir is created if missing) from before the container is created until its init has
//! exited; then it removes the path. Any number of clients may be connected at once; a client
//! that connects before `start` sees all of the container's output, a later one sees what is
//! written from then on (the past is in the CRI log). Once the container has exited the path is
//! gone: a client that cannot connect reads `exit.json` instead.
//!
//! **Monitor → client**: a sequence of frames, each a 5-byte header and a payload:
//!
//! ```text
//! +-----------+---------------------+------------------+
//! | type: u8  | len: u32 big-endian | len bytes        |
//! +-----------+---------------------+------------------+
//! type 1: stdout data     type 2: stderr data     type 3: exit, len = 4, payload = exit code i32 BE
//! ```
//!
//! Every chunk the monitor reads from the container's stdout or stderr pipe (as written to the
//! CRI log, at most 16 KiB; chunks are not aligned to lines) becomes one frame of type 1 or 2, in
//! the order the monitor read them. Data frames are never empty; `len` never exceeds
//! [`MAX_DATA_LEN`]. When the container's init has exited and the pipes are drained, the monitor
//! records `exit.json`, sends one exit frame (the code is the init's exit status, or 128 + the
//! signal that killed it, as in `exit.json`) and closes the connection. EOF without an exit frame
//! means the client was dropped, or the monitor died: see `exit.json`.
//!
//! **Client → monitor**: raw bytes, no framing. With `--stdin` they are written to the
//! container's stdin pipe, in the order the monitor reads them (bytes of clients that write at the
//! same time interleave at arbitrary points); without it they are read and discarded. A client
//! closing its write side (`shutdown(SHUT_WR)`) changes nothing for the container, except with
//! `--stdin-once`: then the end of the *first* client's input (its `SHUT_WR`, its close, or its
//! being dropped) closes the container's stdin once the bytes before it are written, and the
//! input of later clients is discarded.
//!
//! **Flow control**: a client never slows the container or the log. Each client has an output
//! buffer of [`CLIENT_BUFFER`] bytes in the monitor; a client that falls further behind is
//! disconnected (EOF without an exit frame). Input is bounded the other way round: while the
//! container does not read its stdin, the monitor stops reading from clients, whose writes then
//! block (or return `EAGAIN`).

use std::io::{self, Read};

pub(crate) mod server;

/// The frame type of stdout data.
pub const TYPE_STDOUT: u8 = 1;
/// The frame type of stderr data.
pub const TYPE_STDERR: u8 = 2;
/// The frame type of the exit code.
pub const TYPE_EXIT: u8 = 3;
/// The length of a frame header: type and payload length.
pub const HEADER_LEN: usize = 5;
/// The largest payload a client must accept (the monitor sends at most 16 KiB).
pub const MAX_DATA_LEN: usize = 1 << 20;
/// How far a client may fall behind the container's output before the monitor drops it.
pub const CLIENT_BUFFER: usize = 1 << 20;

/// One message from the monitor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The container's init exited with this code (128 + signal if killed); the last frame.
    Exit(i32),
}

/// A header that breaks the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    #[error("exit frame with a payload of {0} bytes, not 4")]
    BadExitLength(u32),
    #[error("frame payload of {0} bytes exceeds the maximum")]
    TooLong(u32),
}

impl Frame {
    /// Appends the frame's wire form to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Frame::Stdout(data) => encode_data(TYPE_STDOUT, data, out),
            Frame::Stderr(data) => encode_data(TYPE_STDERR, data, out),
            Frame::Exit(code) => {
                push_header(TYPE_EXIT, 4, out);
                out.extend_from_slice(&code.to_be_bytes());
            }
        }
    }
}

/// Appends a data frame of type `kind` (no [`Frame`] needed, so no copy of `data`).
pub(crate) fn encode_data(kind: u8, data: &[u8], out: &mut Vec<u8>) {
    push_header(kind, data.len() as u32, out);
    out.extend_from_slice(data);
}

fn push_header(kind: u8, len: u32, out: &mut Vec<u8>) {
    out.push(kind);
    out.extend_from_slice(&len.to_be_bytes());
}

/// Checks a header; returns its type and payload length.
fn parse_header(header: &[u8; HEADER_LEN]) -> Result<(u8, usize), FrameError> {
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    match header[0] {
        TYPE_STDOUT | TYPE_STDERR if len as usize > MAX_DATA_LEN => Err(FrameError::TooLong(len)),
        TYPE_STDOUT | TYPE_STDERR => Ok((header[0], len as usize)),
        TYPE_EXIT if len != 4 => Err(FrameError::BadExitLength(len)),
        TYPE_EXIT => Ok((TYPE_EXIT, 4)),
        other => Err(FrameError::UnknownType(other)),
    }
}

fn frame_of(kind: u8, payload: Vec<u8>) -> Frame {
    match kind {
        TYPE_STDOUT => Frame::Stdout(payload),
        TYPE_STDERR => Frame::Stderr(payload),
        _ => Frame::Exit(i32::from_be_bytes(payload[..4].try_into().expect("exit payloads are 4 bytes"))),
    }
}

/// Parses the first frame in `buf`: the frame and the number of bytes it took, or `None` if
/// `buf` does not hold a whole frame yet. For clients that read into their own buffer (async
/// ones): parse, consume the bytes, repeat.
pub fn parse_frame(buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(header) = buf.first_chunk::<HEADER_LEN>() else { return Ok(None) };
    let (kind, len) = parse_header(header)?;
    let Some(payload) = buf[HEADER_LEN..].get(..len) else { return Ok(None) };
    Ok(Some((frame_of(kind, payload.to_vec()), HEADER_LEN + len)))
}

/// Reads one frame; `None` at a clean end of the stream (between frames). A stream that ends
/// inside a frame is `UnexpectedEof`, a malformed header `InvalidData`.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<Frame>> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let (kind, len) = parse_header(&header).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some(frame_of(kind, payload)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(frames: &[Frame]) -> Vec<u8> {
        let mut out = Vec::new();
        for frame in frames {
            frame.encode(&mut out);
        }
        out
    }

    #[test]
    fn frames_have_the_documented_wire_form() {
        assert_eq!(wire(&[Frame::Stdout(b"hi".to_vec())]), b"\x01\x00\x00\x00\x02hi");
        assert_eq!(wire(&[Frame::Stderr(vec![])]), b"\x02\x00\x00\x00\x00");
        assert_eq!(wire(&[Frame::Exit(3)]), b"\x03\x00\x00\x00\x04\x00\x00\x00\x03");
        assert_eq!(wire(&[Frame::Exit(-1)]), b"\x03\x00\x00\x00\x04\xff\xff\xff\xff");
    }

    #[test]
    fn parsing_a_buffer_yields_each_frame_and_its_length_then_waits_for_more() {
        let frames = [Frame::Stdout(b"hello\n".to_vec()), Frame::Stderr(b"oops".to_vec()), Frame::Exit(137)];
        let bytes = wire(&frames);
        let mut rest = &bytes[..];
        for frame in &frames {
            // Every strict prefix of a frame is incomplete, not an error.
            let whole = frame_len(frame);
            for cut in 0..whole {
                assert_eq!(parse_frame(&rest[..cut]), Ok(None), "cut at {cut}");
            }
            let (parsed, used) = parse_frame(rest).unwrap().unwrap();
            assert_eq!((&parsed, used), (frame, whole));
            rest = &rest[used..];
        }
        assert_eq!(parse_frame(rest), Ok(None));
    }

    fn frame_len(frame: &Frame) -> usize {
        wire(std::slice::from_ref(frame)).len()
    }

    #[test]
    fn malformed_headers_are_errors() {
        assert_eq!(parse_frame(b"\x07\x00\x00\x00\x00"), Err(FrameError::UnknownType(7)));
        assert_eq!(parse_frame(b"\x03\x00\x00\x00\x02\x00\x00"), Err(FrameError::BadExitLength(2)));
        assert_eq!(parse_frame(b"\x01\x7f\x00\x00\x00"), Err(FrameError::TooLong(0x7f00_0000)));
    }

    #[test]
    fn reading_frames_ends_cleanly_only_between_frames() {
        let bytes = wire(&[Frame::Stdout(b"a".to_vec()), Frame::Exit(0)]);
        let mut r = &bytes[..];
        assert_eq!(read_frame(&mut r).unwrap(), Some(Frame::Stdout(b"a".to_vec())));
        assert_eq!(read_frame(&mut r).unwrap(), Some(Frame::Exit(0)));
        assert_eq!(read_frame(&mut r).unwrap(), None);

        let cut = &bytes[..3];
        assert_eq!(read_frame(&mut &cut[..]).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        let cut = &bytes[..5];
        assert_eq!(read_frame(&mut &cut[..]).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(read_frame(&mut &b"\x09\x00\x00\x00\x00"[..]).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
