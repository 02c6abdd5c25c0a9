//! The client against the crate's own server and its fake backend (`crate::tests`).

use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::{ClientError, CommandIo, ForwardEvent, PortForwarder, run_command};
use crate::TerminalSize;
use crate::tests::{echo_server, exec_req, server};

const WAIT: Duration = Duration::from_secs(10);

/// A writer for the session and the reader that collects what it wrote.
fn capture() -> (Box<DuplexStream>, DuplexStream) {
    let (writer, reader) = tokio::io::duplex(1 << 20);
    (Box::new(writer), reader)
}

async fn collected(mut reader: DuplexStream) -> String {
    let mut out = String::new();
    tokio::time::timeout(WAIT, reader.read_to_string(&mut out)).await.unwrap().unwrap();
    out
}

#[tokio::test]
async fn exec_sends_stdin_gets_stdout_and_stderr_and_returns_the_non_zero_exit_code() {
    let (server, backend) = server().await;
    let url = server.get_exec(exec_req(&["echo", "3"], true, true, true, false)).unwrap().url;
    let (stdout, stdout_seen) = capture();
    let (stderr, stderr_seen) = capture();
    let io = CommandIo {
        stdin: Some(Box::new(&b"hello over the wire"[..])),
        stdout: Some(stdout),
        stderr: Some(stderr),
        resize: None,
    };
    let code = tokio::time::timeout(WAIT, run_command(&url, io)).await.unwrap().unwrap();
    assert_eq!(code, 3);
    assert_eq!(collected(stdout_seen).await, "hello over the wire");
    assert_eq!(collected(stderr_seen).await, "to stderr\n");
    assert_eq!(backend.calls.lock().unwrap().as_slice(), ["exec c1 echo 3 tty=false"]);
}

#[tokio::test]
async fn exec_with_exit_code_zero_returns_zero() {
    let (server, _) = server().await;
    let url = server.get_exec(exec_req(&["echo", "0"], false, true, false, false)).unwrap().url;
    let code = tokio::time::timeout(WAIT, run_command(&url, CommandIo::default())).await.unwrap().unwrap();
    assert_eq!(code, 0);
}

#[tokio::test]
async fn terminal_sizes_reach_the_backend_in_order() {
    let (server, backend) = server().await;
    let url = server.get_exec(exec_req(&["resize"], true, true, false, true)).unwrap().url;
    let (stdout, stdout_seen) = capture();
    let (sizes_tx, sizes) = mpsc::channel(4);
    sizes_tx.send(TerminalSize { width: 80, height: 24 }).await.unwrap();
    sizes_tx.send(TerminalSize { width: 132, height: 43 }).await.unwrap();
    // Stdin that stays open, as a terminal's does.
    let (_keep_open, stdin) = tokio::io::duplex(64);
    let io = CommandIo { stdin: Some(Box::new(stdin)), stdout: Some(stdout), stderr: None, resize: Some(sizes) };
    let code = tokio::time::timeout(WAIT, run_command(&url, io)).await.unwrap().unwrap();
    assert_eq!(code, 0);
    assert_eq!(collected(stdout_seen).await, "80x24\n132x43\n");
    assert_eq!(backend.calls.lock().unwrap().as_slice(), ["exec c1 resize tty=true"]);
}

#[tokio::test]
async fn a_backend_failure_is_the_servers_message() {
    let (server, _) = server().await;
    let url = server.get_exec(exec_req(&["no-such-command"], false, true, false, false)).unwrap().url;
    let err = tokio::time::timeout(WAIT, run_command(&url, CommandIo::default())).await.unwrap().unwrap_err();
    assert!(matches!(err, ClientError::Remote(_)), "{err:?}");
    assert_eq!(err.to_string(), "Internal error occurred: error executing command in container: no such command");
}

#[tokio::test]
async fn attach_streams_the_containers_output_and_ends_with_zero() {
    let (server, backend) = server().await;
    let req = cri::AttachRequest { container_id: "c9".into(), stdin: false, tty: false, stdout: true, stderr: true };
    let url = server.get_attach(req).unwrap().url;
    let (stdout, stdout_seen) = capture();
    let io = CommandIo { stdout: Some(stdout), ..CommandIo::default() };
    assert_eq!(tokio::time::timeout(WAIT, run_command(&url, io)).await.unwrap().unwrap(), 0);
    assert_eq!(collected(stdout_seen).await, "attached\n");
    assert_eq!(backend.calls.lock().unwrap().as_slice(), ["attach c9 tty=false"]);
}

#[tokio::test]
async fn a_spent_token_is_refused_with_the_servers_reason() {
    let (server, _) = server().await;
    let url = server.get_exec(exec_req(&["echo", "0"], false, true, false, false)).unwrap().url;
    run_command(&url, CommandIo::default()).await.unwrap();
    let err = run_command(&url, CommandIo::default()).await.unwrap_err();
    assert_eq!(err.to_string(), "unable to upgrade connection: token not found or expired");
}

/// A connected pair of loopback sockets: (ours, the one handed to the forwarder).
async fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ours = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (theirs, _) = listener.accept().await.unwrap();
    (ours, theirs)
}

async fn round_trip(mut conn: TcpStream, message: &[u8]) -> Vec<u8> {
    conn.write_all(message).await.unwrap();
    conn.shutdown().await.unwrap();
    let mut echoed = Vec::new();
    tokio::time::timeout(WAIT, conn.read_to_end(&mut echoed)).await.unwrap().unwrap();
    echoed
}

#[tokio::test]
async fn port_forward_carries_concurrent_connections_over_one_url() {
    let (server, backend) = server().await;
    let port = echo_server().await;
    let req = cri::PortForwardRequest { pod_sandbox_id: "sb1".into(), port: vec![i32::from(port)] };
    let url = server.get_port_forward(req).unwrap().url;
    let forwarder = Arc::new(PortForwarder::connect(&url).await.unwrap());

    let mut sessions = Vec::new();
    for i in 0..3u8 {
        let (ours, theirs) = tcp_pair().await;
        let forwarder = forwarder.clone();
        let forwarding = tokio::spawn(async move { forwarder.forward(theirs, port).await });
        // Large enough to span several frames, and different per connection.
        let message: Vec<u8> = (0..100_000u32).map(|n| (n % 251) as u8 ^ i).collect();
        let echo = {
            let message = message.clone();
            tokio::spawn(async move { round_trip(ours, &message).await })
        };
        sessions.push((forwarding, echo, message));
    }
    for (forwarding, echo, message) in sessions {
        let echoed = echo.await.unwrap();
        assert!(echoed == message, "the echo differs from what was sent");
        tokio::time::timeout(WAIT, forwarding).await.unwrap().unwrap().unwrap();
    }
    assert_eq!(backend.calls.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_port_nothing_listens_on_fails_with_the_servers_message() {
    let (server, _) = server().await;
    let closed_port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let req = cri::PortForwardRequest { pod_sandbox_id: "sb1".into(), port: vec![i32::from(closed_port)] };
    let url = server.get_port_forward(req).unwrap().url;
    let forwarder = PortForwarder::connect(&url).await.unwrap();
    let (_ours, theirs) = tcp_pair().await;
    let err = tokio::time::timeout(WAIT, forwarder.forward(theirs, closed_port)).await.unwrap().unwrap_err();
    assert!(err.to_string().starts_with(&format!("error forwarding port {closed_port} to pod sb1")), "{err}");
}

#[tokio::test]
async fn a_served_listener_forwards_each_accepted_connection_and_reports_it() {
    let (server, _) = server().await;
    let port = echo_server().await;
    let req = cri::PortForwardRequest { pod_sandbox_id: "sb1".into(), port: vec![i32::from(port)] };
    let url = server.get_port_forward(req).unwrap().url;
    let forwarder = Arc::new(PortForwarder::connect(&url).await.unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let report = Arc::new(move |e: ForwardEvent| {
        let _ = events_tx.send(format!("{e:?}"));
    });
    let serving = tokio::spawn(forwarder.clone().serve(listener, port, report));
    for message in [&b"first"[..], b"second"] {
        let echoed = round_trip(TcpStream::connect(local).await.unwrap(), message).await;
        assert_eq!(echoed, message);
        let event = events.recv().await.unwrap();
        assert_eq!(event, format!("Connection {{ local: {local}, remote: {port} }}"));
    }
    serving.abort();
}

/// A server that upgrades to SPDY as asked and then hangs up at once.
async fn upgrade_then_hang_up() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(conn.read_u8().await.unwrap());
        }
        let response = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
                        X-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n";
        conn.write_all(response.as_bytes()).await.unwrap();
    });
    format!("http://{addr}/portforward/token")
}

#[tokio::test]
async fn a_dropped_connection_ends_the_forwarder_and_fails_new_forwards() {
    let forwarder = PortForwarder::connect(&upgrade_then_hang_up().await).await.unwrap();
    tokio::time::timeout(WAIT, forwarder.closed()).await.expect("the forwarder noticed the hang-up");
    let (_ours, theirs) = tcp_pair().await;
    let err = forwarder.forward(theirs, 80).await.unwrap_err();
    assert!(matches!(err, ClientError::LostConnection), "{err:?}");
    assert_eq!(err.to_string(), "lost connection to pod");
}
