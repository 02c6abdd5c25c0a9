//! Requests whose HTTP/2 `:authority` is the socket path, as older grpc-go clients (crictl and
//! critest v1.29) send them, sent as hand-made frames to the real server on a temporary socket.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use berth_image::Images;
use berth_runtime::config::Config;
use berth_runtime::cri::{Cri, Options, grpc};
use berth_runtime::server;
use k8s_cri::v1 as cri;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    [&len[1..], &[frame_type, flags], &stream_id.to_be_bytes(), payload].concat()
}

/// A `Version` call on `stream_id` the way grpc-go 1.58 sends it over a unix socket.
fn version_call(encoder: &mut loona_hpack::Encoder<'static>, stream_id: u32, socket: &str) -> Vec<u8> {
    let headers: [(&[u8], &[u8]); 8] = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/runtime.v1.RuntimeService/Version"),
        (b":authority", socket.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"grpc-go/1.58.3"),
        (b"te", b"trailers"),
        (b"grpc-timeout", b"2S"),
    ];
    let block = encoder.encode(headers);
    let message = cri::VersionRequest { version: "v1".into() }.encode_to_vec();
    let mut body = vec![0];
    body.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&message);
    [frame(HEADERS, END_HEADERS, stream_id, &block), frame(DATA, END_STREAM, stream_id, &body)].concat()
}

#[derive(Default)]
struct Reply {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    done: bool,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Reads frames until every stream in `streams` has ended, answering the server's SETTINGS.
async fn replies(conn: &mut UnixStream, streams: &[u32]) -> HashMap<u32, Reply> {
    let mut decoder = loona_hpack::Decoder::new();
    let mut replies: HashMap<u32, Reply> = streams.iter().map(|&s| (s, Reply::default())).collect();
    let mut buf = Vec::new();
    loop {
        while let Some(len) = buf.get(..3).map(|l| usize::from(l[0]) << 16 | usize::from(l[1]) << 8 | usize::from(l[2]))
            && buf.len() >= 9 + len
        {
            let (frame_type, flags) = (buf[3], buf[4]);
            let stream_id = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]);
            let payload: Vec<u8> = buf.drain(..9 + len).skip(9).collect();
            match frame_type {
                SETTINGS if flags & ACK == 0 => conn.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap(),
                HEADERS => {
                    assert_ne!(flags & END_HEADERS, 0, "response headers fit one frame");
                    let reply = replies.get_mut(&stream_id).unwrap();
                    for (n, v) in decoder.decode(&payload).unwrap() {
                        reply.headers.push((String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()));
                    }
                    reply.done |= flags & END_STREAM != 0;
                }
                DATA => {
                    let reply = replies.get_mut(&stream_id).unwrap();
                    reply.body.extend_from_slice(&payload);
                    reply.done |= flags & END_STREAM != 0;
                }
                RST_STREAM => panic!("stream {stream_id} reset with error code {payload:?}"),
                GOAWAY => panic!("server sent GOAWAY: {payload:?}"),
                _ => {}
            }
        }
        if replies.values().all(|r| r.done) {
            return replies;
        }
        let mut chunk = [0; 4096];
        let n = conn.read(&mut chunk).await.unwrap();
        assert_ne!(n, 0, "server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn version_calls_with_the_socket_path_as_authority_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/cri.sock");
    let text = format!(
        "socket = {:?}\nroot = {:?}\n[handlers.runc]\nbinary = \"runc\"\n[cni]\nconf_dir = {:?}\n",
        socket,
        dir.path().join("root"),
        dir.path().join("cni")
    );
    let config = Config::from_toml(&text, OsStr::new("")).unwrap();
    let images = Images::open(config.images_config()).unwrap();
    let listener = server::bind(&config.socket).await.unwrap();
    let cri = Cri::open(config, Arc::new(images), Options::default()).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(listener.serve(grpc::routes(cri), async {
        let _ = stopped.await;
    }));

    let mut conn = UnixStream::connect(&socket).await.unwrap();
    let mut encoder = loona_hpack::Encoder::new();
    let authority = socket.to_str().unwrap();
    // The second call's headers are mostly references into the client's dynamic table.
    let client = [
        PREFACE,
        &frame(SETTINGS, 0, 0, &[]),
        &version_call(&mut encoder, 1, authority),
        &version_call(&mut encoder, 3, authority),
    ]
    .concat();
    conn.write_all(&client).await.unwrap();
    let replies = tokio::time::timeout(Duration::from_secs(10), replies(&mut conn, &[1, 3])).await.unwrap();

    for (stream_id, reply) in &replies {
        assert_eq!(reply.header(":status"), Some("200"), "stream {stream_id}");
        assert_eq!(reply.header("grpc-status"), Some("0"), "stream {stream_id}: {:?}", reply.headers);
        let (prefix, message) = reply.body.split_at(5);
        assert_eq!(prefix[0], 0, "uncompressed");
        let version = cri::VersionResponse::decode(message).unwrap();
        assert_eq!((version.runtime_name.as_str(), version.runtime_api_version.as_str()), ("berth", "v1"));
    }

    drop(conn);
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}
