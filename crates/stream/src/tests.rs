//! End-to-end tests: a real server on a loopback port, a fake backend, and small SPDY and
//! WebSocket clients that speak the wire protocols the way kubectl/crictl do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use k8s_cri::v1 as cri;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::spdy::frame::{self, Frame, HeaderDecoder, HeaderEncoder};
use crate::{AsyncStream, Backend, BackendError, StreamServer, Streams, TerminalSize};

const WAIT: Duration = Duration::from_secs(10);

/// A runtime stand-in whose behaviour is picked by the command's first word.
#[derive(Default)]
pub(crate) struct FakeBackend {
    pub(crate) calls: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Backend for FakeBackend {
    async fn exec(&self, container_id: &str, cmd: Vec<String>, tty: bool, mut s: Streams) -> Result<i32, BackendError> {
        self.calls.lock().unwrap().push(format!("exec {container_id} {} tty={tty}", cmd.join(" ")));
        match cmd[0].as_str() {
            // Echo stdin to stdout, say something on stderr, exit with the given code.
            "echo" => {
                let mut input = Vec::new();
                if let Some(stdin) = s.stdin.as_mut() {
                    stdin.read_to_end(&mut input).await.unwrap();
                }
                let stdout = s.stdout.as_mut().unwrap();
                stdout.write_all(&input).await.unwrap();
                if let Some(stderr) = s.stderr.as_mut() {
                    stderr.write_all(b"to stderr\n").await.unwrap();
                }
                Ok(cmd[1].parse().unwrap())
            }
            // Report two terminal sizes on stdout.
            "resize" => {
                let mut resize = s.resize.take().expect("resize channel with a tty");
                let stdout = s.stdout.as_mut().unwrap();
                for _ in 0..2 {
                    let TerminalSize { width, height } = resize.recv().await.unwrap();
                    stdout.write_all(format!("{width}x{height}\n").as_bytes()).await.unwrap();
                }
                Ok(0)
            }
            // A large output to check chunking and ordering.
            "big" => {
                let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
                s.stdout.as_mut().unwrap().write_all(&data).await.unwrap();
                Ok(0)
            }
            _ => Err(BackendError::Failed("no such command".into())),
        }
    }

    async fn attach(&self, container_id: &str, tty: bool, mut s: Streams) -> Result<(), BackendError> {
        self.calls.lock().unwrap().push(format!("attach {container_id} tty={tty}"));
        s.stdout.as_mut().unwrap().write_all(b"attached\n").await.unwrap();
        Ok(())
    }

    async fn port_forward(&self, pod_sandbox_id: &str, port: u16) -> Result<Box<dyn AsyncStream>, BackendError> {
        self.calls.lock().unwrap().push(format!("portforward {pod_sandbox_id} {port}"));
        // Port numbers map straight to loopback, where the test's echo server listens.
        match TcpStream::connect(("127.0.0.1", port)).await {
            Ok(c) => Ok(Box::new(c)),
            Err(e) => Err(BackendError::Failed(e.to_string())),
        }
    }
}

pub(crate) async fn server() -> (StreamServer, Arc<FakeBackend>) {
    let backend = Arc::new(FakeBackend::default());
    let server = StreamServer::start("127.0.0.1:0".parse().unwrap(), backend.clone()).await.unwrap();
    (server, backend)
}

pub(crate) fn exec_req(cmd: &[&str], stdin: bool, stdout: bool, stderr: bool, tty: bool) -> cri::ExecRequest {
    cri::ExecRequest {
        container_id: "c1".into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        tty,
        stdin,
        stdout,
        stderr,
    }
}

/// Splits `http://host:port/path` into the address and the path.
fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    (host.to_string(), format!("/{path}"))
}

/// Sends a raw HTTP/1.1 request and reads the response head; returns status, headers and the socket.
async fn http_request(url: &str, method: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>, TcpStream) {
    let (host, path) = split_url(url);
    let mut tcp = TcpStream::connect(&host).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    // Byte by byte so that nothing after the head (SPDY frames) is swallowed.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let b = tcp.read_u8().await.unwrap();
        head.push(b);
    }
    let head = String::from_utf8(head).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, tcp)
}

fn get<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A minimal SPDY client in the manner of the Go spdystream client.
struct SpdyClient {
    write: OwnedWriteHalf,
    encoder: HeaderEncoder,
    frames: mpsc::UnboundedReceiver<Frame>,
    next_id: u32,
    protocol: String,
}

impl SpdyClient {
    async fn connect(url: &str, protocols: &[&str]) -> SpdyClient {
        let offer = protocols.join(", ");
        let mut headers = vec![("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")];
        if !protocols.is_empty() {
            headers.push(("X-Stream-Protocol-Version", &offer));
        }
        let (status, headers, tcp) = http_request(url, "POST", &headers).await;
        assert_eq!(status, 101, "upgrade refused: {headers:?}");
        assert_eq!(get(&headers, "upgrade"), Some("SPDY/3.1"));
        let protocol = get(&headers, "x-stream-protocol-version").unwrap_or("").to_string();
        let (mut read, write) = tcp.into_split();
        let (tx, frames) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut decoder = HeaderDecoder::default();
            while let Ok(Some(f)) = frame::read_frame(&mut read, &mut decoder).await {
                if tx.send(f).is_err() {
                    return;
                }
            }
        });
        SpdyClient { write, encoder: HeaderEncoder::default(), frames, next_id: 1, protocol }
    }

    async fn send(&mut self, f: Frame) {
        let mut buf = BytesMut::new();
        frame::write_frame(&f, &mut self.encoder, &mut buf).unwrap();
        self.write.write_all(&buf).await.unwrap();
    }

    /// Opens a stream with the given headers and returns its id.
    async fn open(&mut self, headers: &[(&str, &str)]) -> u32 {
        let stream_id = self.next_id;
        self.next_id += 2;
        let headers = headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.to_string())).collect();
        self.send(Frame::SynStream {
            stream_id,
            associated_to: 0,
            priority: 0,
            fin: false,
            unidirectional: false,
            headers,
        })
        .await;
        stream_id
    }

    async fn data(&mut self, stream_id: u32, data: &[u8], fin: bool) {
        self.send(Frame::Data { stream_id, fin, data: Bytes::copy_from_slice(data) }).await;
    }

    /// Reads frames, collecting data per stream, until `stream_id` is finished; returns all data seen.
    async fn collect_until_fin(&mut self, stream_id: u32, out: &mut HashMap<u32, Vec<u8>>) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let f = tokio::time::timeout_at(deadline, self.frames.recv())
                .await
                .expect("timed out waiting for the stream to finish")
                .expect("connection closed before the stream finished");
            match f {
                Frame::Data { stream_id: id, fin, data } => {
                    out.entry(id).or_default().extend_from_slice(&data);
                    if fin && id == stream_id {
                        return;
                    }
                }
                Frame::SynReply { stream_id: id, fin: true, .. } | Frame::RstStream { stream_id: id, .. }
                    if id == stream_id =>
                {
                    return;
                }
                _ => {}
            }
        }
    }
}

/// Opens the remotecommand streams in the order kubectl does: error first, then the rest.
async fn open_command_streams(c: &mut SpdyClient, kinds: &[&str]) -> HashMap<String, u32> {
    let mut ids = HashMap::new();
    for kind in kinds {
        ids.insert(kind.to_string(), c.open(&[("streamType", kind)]).await);
    }
    ids
}

#[tokio::test]
async fn exec_over_spdy_v4_streams_stdio_and_reports_a_non_zero_exit_code() {
    let (server, backend) = server().await;
    let url = server.get_exec(exec_req(&["echo", "3"], true, true, true, false)).unwrap().url;
    let mut c = SpdyClient::connect(&url, &["v4.channel.k8s.io", "v3.channel.k8s.io"]).await;
    assert_eq!(c.protocol, "v4.channel.k8s.io");
    let ids = open_command_streams(&mut c, &["error", "stdin", "stdout", "stderr"]).await;
    c.data(ids["stdin"], b"hello ", false).await;
    c.data(ids["stdin"], b"world", true).await;

    let mut out = HashMap::new();
    c.collect_until_fin(ids["error"], &mut out).await;
    assert_eq!(out.get(&ids["stdout"]).map(Vec::as_slice), Some(&b"hello world"[..]));
    assert_eq!(out.get(&ids["stderr"]).map(Vec::as_slice), Some(&b"to stderr\n"[..]));
    let status: serde_json::Value = serde_json::from_slice(&out[&ids["error"]]).unwrap();
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(status["details"]["causes"][0]["reason"], "ExitCode");
    assert_eq!(status["details"]["causes"][0]["message"], "3");
    assert!(status["message"].as_str().unwrap().starts_with("command terminated with non-zero exit code"));
    assert_eq!(backend.calls.lock().unwrap().as_slice(), ["exec c1 echo 3 tty=false"]);
}

#[tokio::test]
async fn exec_over_spdy_v4_with_exit_code_zero_reports_success() {
    let (server, _) = server().await;
    let url = server.get_exec(exec_req(&["echo", "0"], false, true, false, false)).unwrap().url;
    let mut c = SpdyClient::connect(&url, &["v4.channel.k8s.io"]).await;
    let ids = open_command_streams(&mut c, &["error", "stdout"]).await;
    let mut out = HashMap::new();
    c.collect_until_fin(ids["error"], &mut out).await;
    assert_eq!(&out[&ids["error"]][..], br#"{"metadata":{},"status":"Success"}"#);
}

#[tokio::test]
async fn exec_over_spdy_v2_writes_only_the_failure_message() {
    let (server, _) = server().await;
    let url = server.get_exec(exec_req(&["echo", "7"], false, true, false, false)).unwrap().url;
    let mut c = SpdyClient::connect(&url, &["v2.channel.k8s.io"]).await;
    assert_eq!(c.protocol, "v2.channel.k8s.io");
    let ids = open_command_streams(&mut c, &["error", "stdout"]).await;
    let mut out = HashMap::new();
    c.collect_until_fin(ids["error"], &mut out).await;
    let msg = String::from_utf8(out[&ids["error"]].clone()).unwrap();
    assert!(msg.starts_with("command terminated with non-zero exit code") && msg.contains("exit code 7"), "{msg}");
}

#[tokio::test]
async fn exec_output_larger_than_a_frame_arrives_complete_and_in_order() {
    let (server, _) = server().await;
    let url = server.get_exec(exec_req(&["big"], false, true, false, false)).unwrap().url;
    let mut c = SpdyClient::connect(&url, &["v4.channel.k8s.io"]).await;
    let ids = open_command_streams(&mut c, &["error", "stdout"]).await;
    let mut out = HashMap::new();
    c.collect_until_fin(ids["error"], &mut out).await;
    let expected: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    assert!(out[&ids["stdout"]] == expected, "stdout differs");
}

#[tokio::test]
async fn tty_resize_events_reach_the_backend() {
    let (server, backend) = server().await;
    let url = server.get_exec(exec_req(&["resize"], true, true, false, true)).unwrap().url;
    let mut c = SpdyClient::connect(&url, &["v4.channel.k8s.io"]).await;
    let ids = open_command_streams(&mut c, &["error", "stdin", "stdout", "resize"]).await;
    c.data(ids["resize"], b"{\"Width\":80,\"Height\":24}\n", false).await;
    c.data(ids["resize"], b"{\"Width\":100,\"Height\":40}\n", false).await;
    let mut out = HashMap::new();
    c.collect_until_fin(ids["error"], &mut out).await;
    assert_eq!(String::from_utf8_lossy(&out[&ids["stdout"]]), "80x24\n100x40\n");
    assert_eq!(&out[&ids["error"]][..], br#"{"metadata":{},"status":"Success"}"#);
    assert_eq!(backend.calls.lock().unwrap().as_slice(), ["exec c1 resize tty=true"]);
}

#[tokio::test]
async fn attach_over_spdy_streams_the_containers_output() {
    let (server, backend) = server().await;
    let req = cri::AttachRequest { container_id: "c9".into(), stdin: false, tty: false, stdout: true, stderr: true };
    let url = server.get_attach(req).unwrap().url;
    assert!(url.contains("/attach/"));
    let mut c = SpdyClient::connect(&url, &["v4.channel.k8s.io"]).await;
    let ids = open_command_streams(&mut c, &["error", "stdout", "stderr"]).await;
    let mut out = HashMap::new();
    c.collect_until_fin(ids["error"], &mut out).await;
    assert_eq!(&out[&ids["stdout"]][..], b"attached\n");
    assert_eq!(backend.calls.lock().unwrap().as_slice(), ["attach c9 tty=false"]);
}

#[tokio::test]
async fn the_server_answers_pings_and_replies_to_each_stream() {
    let (server, _) = server().await;
    let url = server.get_exec(exec_req(&["echo", "0"], true, true, false, false)).unwrap().url;
    let mut c = SpdyClient::connect(&url, &["v4.channel.k8s.io"]).await;
    c.send(Frame::Ping { id: 1 }).await;
    let error = c.open(&[("streamType", "error")]).await;
    let mut pong = false;
    let mut replied = false;
    while !(pong && replied) {
        match tokio::time::timeout(WAIT, c.frames.recv()).await.unwrap().unwrap() {
            Frame::Ping { id: 1 } => pong = true,
            Frame::SynReply { stream_id, .. } if stream_id == error => replied = true,
            _ => {}
        }
    }
}

/// A loopback TCP server that echoes each connection back until EOF.
pub(crate) async fn echo_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn port_forward_over_spdy_pairs_streams_by_request_id_and_copies_both_ways() {
    let (server, backend) = server().await;
    let port = echo_server().await;
    let req = cri::PortForwardRequest { pod_sandbox_id: "sb1".into(), port: vec![i32::from(port)] };
    let url = server.get_port_forward(req).unwrap().url;
    let mut c = SpdyClient::connect(&url, &["portforward.k8s.io"]).await;
    assert_eq!(c.protocol, "portforward.k8s.io");
    let port_s = port.to_string();
    for request_id in ["0", "1"] {
        let error = c.open(&[("streamType", "error"), ("port", &port_s), ("requestID", request_id)]).await;
        c.data(error, b"", true).await;
        let data = c.open(&[("streamType", "data"), ("port", &port_s), ("requestID", request_id)]).await;
        c.data(data, format!("ping {request_id}").as_bytes(), true).await;
        let mut out = HashMap::new();
        c.collect_until_fin(data, &mut out).await;
        assert_eq!(out[&data], format!("ping {request_id}").as_bytes());
        assert!(!out.contains_key(&error), "unexpected error: {:?}", out.get(&error));
    }
    assert_eq!(backend.calls.lock().unwrap().len(), 2);
    assert_eq!(backend.calls.lock().unwrap()[0], format!("portforward sb1 {port}"));
}

#[tokio::test]
async fn a_port_forward_that_cannot_connect_reports_on_the_error_stream() {
    let (server, _) = server().await;
    // Bind then drop a listener to get a loopback port with nothing behind it.
    let closed_port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let req = cri::PortForwardRequest { pod_sandbox_id: "sb1".into(), port: vec![] };
    let url = server.get_port_forward(req).unwrap().url;
    let mut c = SpdyClient::connect(&url, &["portforward.k8s.io"]).await;
    let port_s = closed_port.to_string();
    let error = c.open(&[("streamType", "error"), ("port", &port_s), ("requestID", "0")]).await;
    let _data = c.open(&[("streamType", "data"), ("port", &port_s), ("requestID", "0")]).await;
    let mut out = HashMap::new();
    c.collect_until_fin(error, &mut out).await;
    let msg = String::from_utf8(out[&error].clone()).unwrap();
    assert!(msg.starts_with(&format!("error forwarding port {closed_port} to pod sb1")), "{msg}");
}

#[tokio::test]
async fn unknown_and_already_used_tokens_get_404() {
    let (server, _) = server().await;
    let base = format!("http://{}", server.local_addr());
    let upgrade =
        [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"), ("X-Stream-Protocol-Version", "v4.channel.k8s.io")];
    let (status, _, _) = http_request(&format!("{base}/exec/nosuchtoken"), "POST", &upgrade).await;
    assert_eq!(status, 404);

    let url = server.get_exec(exec_req(&["echo", "0"], false, true, false, false)).unwrap().url;
    let (status, _, _) = http_request(&url, "POST", &upgrade).await;
    assert_eq!(status, 101);
    let (status, _, _) = http_request(&url, "POST", &upgrade).await;
    assert_eq!(status, 404, "a token must work only once");

    // A token is only good for the kind of request it was made for.
    let url = server.get_exec(exec_req(&["echo", "0"], false, true, false, false)).unwrap().url;
    let (status, _, _) = http_request(&url.replace("/exec/", "/attach/"), "POST", &upgrade).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn requests_without_an_upgrade_or_with_a_wrong_method_are_refused_without_spending_the_token() {
    let (server, _) = server().await;
    let url = server.get_exec(exec_req(&["echo", "0"], false, true, false, false)).unwrap().url;
    let (status, _, _) = http_request(&url, "GET", &[]).await;
    assert_eq!(status, 400);
    let (status, _, _) = http_request(&url, "DELETE", &[("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")]).await;
    assert_eq!(status, 405);
    let (status, _, _) = http_request(
        &url,
        "POST",
        &[("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"), ("X-Stream-Protocol-Version", "v9")],
    )
    .await;
    assert_eq!(status, 403, "no common protocol");
    let (status, _, _) = http_request(&url, "POST", &[("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")]).await;
    assert_eq!(status, 101, "the token is still good after refused attempts");
}

#[tokio::test]
async fn invalid_stream_requests_are_rejected_with_invalid_argument() {
    let (server, _) = server().await;
    let cases = [
        (exec_req(&[], false, true, false, false), "cmd"),
        (exec_req(&["ls"], false, true, true, true), "tty and stderr"),
        (exec_req(&["ls"], false, false, false, false), "one of stdin, stdout, or stderr"),
        (
            cri::ExecRequest { container_id: String::new(), ..exec_req(&["ls"], false, true, false, false) },
            "container_id",
        ),
    ];
    for (req, words) in cases {
        let err = server.get_exec(req).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(words), "{}", err.message());
    }
    let attach = cri::AttachRequest { container_id: "c".into(), stdin: false, tty: true, stdout: true, stderr: true };
    assert_eq!(server.get_attach(attach).unwrap_err().code(), tonic::Code::InvalidArgument);
    let pf = cri::PortForwardRequest { pod_sandbox_id: String::new(), port: vec![80] };
    assert_eq!(server.get_port_forward(pf).unwrap_err().code(), tonic::Code::InvalidArgument);
    let pf = cri::PortForwardRequest { pod_sandbox_id: "p".into(), port: vec![70000] };
    assert_eq!(server.get_port_forward(pf).unwrap_err().code(), tonic::Code::InvalidArgument);
}

async fn ws_connect(url: &str, protocol: &str) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let (host, _) = split_url(url);
    let mut req = url.replace("http://", "ws://").into_client_request().unwrap();
    req.headers_mut().insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
    let tcp = TcpStream::connect(host).await.unwrap();
    let (ws, resp) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
    assert_eq!(resp.headers().get("sec-websocket-protocol").unwrap(), protocol);
    ws
}

#[tokio::test]
async fn exec_over_websocket_v5_uses_channel_bytes_and_the_close_signal_for_stdin() {
    let (server, _) = server().await;
    let url = server.get_exec(exec_req(&["echo", "3"], true, true, true, false)).unwrap().url;
    let mut ws = ws_connect(&url, "v5.channel.k8s.io").await;
    ws.send(Message::binary(b"\x00hello".to_vec())).await.unwrap();
    ws.send(Message::binary(vec![255, 0])).await.unwrap();
    let mut channels: HashMap<u8, Vec<u8>> = HashMap::new();
    while let Some(msg) = tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
        match msg.unwrap() {
            Message::Binary(b) => channels.entry(b[0]).or_default().extend_from_slice(&b[1..]),
            Message::Close(_) => break,
            _ => {}
        }
    }
    assert_eq!(channels[&1], b"hello");
    assert_eq!(channels[&2], b"to stderr\n");
    let status: serde_json::Value = serde_json::from_slice(&channels[&3]).unwrap();
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(status["details"]["causes"][0]["message"], "3");
}

#[tokio::test]
async fn port_forward_over_websocket_prefixes_each_channel_with_the_port_and_echoes_data() {
    let (server, _) = server().await;
    let port = echo_server().await;
    let req = cri::PortForwardRequest { pod_sandbox_id: "sb1".into(), port: vec![] };
    let url = format!("{}?port={port}", server.get_port_forward(req).unwrap().url);
    let mut ws = ws_connect(&url, "v4.channel.k8s.io").await;
    let mut prefixes = HashMap::new();
    while prefixes.len() < 2 {
        if let Message::Binary(b) = tokio::time::timeout(WAIT, ws.next()).await.unwrap().unwrap().unwrap() {
            prefixes.insert(b[0], b[1..].to_vec());
        }
    }
    assert_eq!(prefixes[&0], port.to_le_bytes());
    assert_eq!(prefixes[&1], port.to_le_bytes());
    ws.send(Message::binary(b"\x00over websocket".to_vec())).await.unwrap();
    let mut echoed = Vec::new();
    while echoed.len() < b"over websocket".len() {
        if let Message::Binary(b) = tokio::time::timeout(WAIT, ws.next()).await.unwrap().unwrap().unwrap() {
            assert_eq!(b[0], 0, "data comes back on the data channel");
            echoed.extend_from_slice(&b[1..]);
        }
    }
    assert_eq!(echoed, b"over websocket");
}
