//! The monitor's side of attach: the listening socket, each client's bounded output buffer, and
//! the container's stdin pipe that clients' input goes to (protocol in [`crate::attach`]).
//!
//! Everything is non-blocking and driven by the monitor's one poll(2) loop: [`AttachServer::register`]
//! adds the descriptors that have something to wait for, [`AttachServer::handle`] acts on their
//! readiness, [`AttachServer::broadcast`] queues output, [`AttachServer::finish`] sends the exit.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::{CLIENT_BUFFER, Frame, TYPE_STDERR, TYPE_STDOUT, encode_data};
use crate::cri_log::Stream;

/// Client input held for the container's stdin at most; beyond it clients are not read.
const STDIN_BUFFER: usize = 64 * 1024;
/// A drained buffer keeps at most this much capacity (a burst's memory goes back).
const KEEP_CAPACITY: usize = 64 * 1024;
/// Input read from one client per readiness event.
const READ_CHUNK: usize = 16 * 1024;

/// What one entry of the poll set that [`AttachServer::register`] filled stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Polled {
    Listener,
    Stdin,
    Client(usize),
}

/// The container's stdin pipe (write end) and the client input not yet written to it.
struct Stdin {
    /// `None` without `--stdin`, and once closed: client input is then discarded.
    pipe: Option<File>,
    pending: Vec<u8>,
    /// `--stdin-once` and the first client's input ended: close when `pending` is written.
    close_when_drained: bool,
}

impl Stdin {
    /// How many more input bytes may be read from clients now.
    fn room(&self) -> usize {
        match self.pipe {
            Some(_) => STDIN_BUFFER.saturating_sub(self.pending.len()),
            None => READ_CHUNK,
        }
    }

    fn accept(&mut self, input: &[u8]) {
        if self.pipe.is_some() {
            self.pending.extend_from_slice(input);
            self.write();
        }
    }

    /// Writes what it can of `pending`; closes the pipe when the container closed its end, or
    /// when told to close once drained.
    fn write(&mut self) {
        let Some(pipe) = &mut self.pipe else { return };
        let mut written = 0;
        while written < self.pending.len() {
            match pipe.write(&self.pending[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // EPIPE: nobody reads the container's stdin any more.
                    self.close();
                    return;
                }
            }
        }
        self.pending.drain(..written);
        if self.pending.is_empty() {
            release(&mut self.pending);
            if self.close_when_drained {
                self.close();
            }
        }
    }

    fn close(&mut self) {
        self.pipe = None;
        self.pending = Vec::new();
    }
}

/// One connected client.
struct Client {
    stream: UnixStream,
    /// Encoded frames; `out[sent..]` is still to be written.
    out: Vec<u8>,
    sent: usize,
    /// Its input has not ended yet.
    reading: bool,
    /// The peer has closed both directions (POLLHUP): only its remaining input matters.
    hung_up: bool,
    /// The first client with `--stdin-once`: the end of its input closes the container's stdin.
    first: bool,
    /// To be disconnected.
    dead: bool,
}

impl Client {
    fn backlog(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Queues a frame: all of it, or none and the client is dropped for falling behind (unless
    /// `always`, for the last frame, which is tiny).
    fn queue(&mut self, encode: impl FnOnce(&mut Vec<u8>), frame_len: usize, always: bool) {
        if self.dead {
            return;
        }
        if !always && self.backlog() + frame_len > CLIENT_BUFFER {
            self.dead = true;
            return;
        }
        if self.sent > 0 {
            self.out.drain(..self.sent);
            self.sent = 0;
        }
        encode(&mut self.out);
        self.flush();
    }

    /// Writes what the socket takes now.
    fn flush(&mut self) {
        while self.sent < self.out.len() {
            match self.stream.write(&self.out[self.sent..]) {
                Ok(n) if n > 0 => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                _ => {
                    self.dead = true;
                    return;
                }
            }
        }
        self.out.clear();
        self.sent = 0;
        release(&mut self.out);
    }

    /// Reads once into the container's stdin (or nowhere); notes the end of its input.
    fn read_input(&mut self, stdin: &mut Stdin, buf: &mut [u8]) {
        let room = stdin.room().min(buf.len()).min(READ_CHUNK);
        if room == 0 {
            return;
        }
        match self.stream.read(&mut buf[..room]) {
            Ok(0) => self.reading = false,
            Ok(n) => stdin.accept(&buf[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => {}
            Err(_) => self.dead = true,
        }
    }

    /// Reads and drops whatever input is buffered (so that closing the socket is a clean EOF for
    /// the peer, not a reset).
    fn discard_input(&mut self) {
        let mut buf = [0u8; 4096];
        for _ in 0..64 {
            match self.stream.read(&mut buf) {
                Ok(n) if n > 0 => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => return,
            }
        }
    }
}

/// The attach socket and its clients.
pub(crate) struct AttachServer {
    path: PathBuf,
    listener: Option<UnixListener>,
    clients: Vec<Client>,
    stdin: Stdin,
    stdin_once: bool,
    had_client: bool,
}

impl AttachServer {
    /// Listens at `path` (its parent created, a stale socket there replaced), sending client
    /// input to `stdin` (the non-blocking write end of the container's stdin pipe) if given.
    pub(crate) fn bind(path: &Path, stdin: Option<File>, stdin_once: bool) -> io::Result<Self> {
        let listener = crate::console::bind_private(path)?;
        let server = AttachServer {
            path: path.to_path_buf(),
            listener: Some(listener),
            clients: Vec::new(),
            stdin: Stdin { pipe: stdin, pending: Vec::new(), close_when_drained: false },
            stdin_once,
            had_client: false,
        };
        // Dropping `server` on an error removes the path again.
        server.listener.as_ref().expect("just bound").set_nonblocking(true)?;
        Ok(server)
    }

    /// Sends client input to `stdin` from now on (a terminal's master, which exists only once
    /// the container does).
    pub(crate) fn set_input(&mut self, stdin: File) {
        self.stdin.pipe = Some(stdin);
    }

    /// Adds to `fds` what there is to wait for, and to `polled` what each entry is.
    pub(crate) fn register<'a>(&'a self, fds: &mut Vec<PollFd<'a>>, polled: &mut Vec<Polled>) {
        if let Some(listener) = &self.listener {
            fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
            polled.push(Polled::Listener);
        }
        if let Some(pipe) = &self.stdin.pipe
            && !self.stdin.pending.is_empty()
        {
            fds.push(PollFd::new(pipe.as_fd(), PollFlags::POLLOUT));
            polled.push(Polled::Stdin);
        }
        let can_read = self.stdin.room() > 0;
        for (i, client) in self.clients.iter().enumerate() {
            let mut events = PollFlags::empty();
            if client.reading && can_read {
                events |= PollFlags::POLLIN;
            }
            if client.backlog() > 0 {
                events |= PollFlags::POLLOUT;
            }
            // A hung-up socket is always ready: poll it only when it can be acted on.
            if client.hung_up && events.is_empty() {
                continue;
            }
            fds.push(PollFd::new(client.stream.as_fd(), events));
            polled.push(Polled::Client(i));
        }
    }

    /// Acts on the readiness poll(2) reported for the entries [`AttachServer::register`] added.
    pub(crate) fn handle(&mut self, polled: &[Polled], revents: &[PollFlags], buf: &mut [u8]) {
        for (&what, &ready) in polled.iter().zip(revents) {
            if ready.is_empty() {
                continue;
            }
            match what {
                Polled::Listener => self.accept(),
                Polled::Stdin if ready.intersects(PollFlags::POLLERR | PollFlags::POLLHUP) => self.stdin.close(),
                Polled::Stdin => self.stdin.write(),
                Polled::Client(i) => {
                    let client = &mut self.clients[i];
                    if ready.contains(PollFlags::POLLERR) {
                        client.dead = true;
                        continue;
                    }
                    client.hung_up |= ready.contains(PollFlags::POLLHUP);
                    if ready.intersects(PollFlags::POLLIN | PollFlags::POLLHUP) && client.reading {
                        client.read_input(&mut self.stdin, buf);
                    }
                    if ready.contains(PollFlags::POLLOUT) {
                        client.flush();
                    }
                    if client.hung_up && !client.reading {
                        client.dead = true;
                    }
                }
            }
        }
        self.reap();
    }

    /// Sends one chunk of the container's output to every client.
    pub(crate) fn broadcast(&mut self, stream: Stream, data: &[u8]) {
        if data.is_empty() || self.clients.is_empty() {
            return;
        }
        let kind = match stream {
            Stream::Stdout => TYPE_STDOUT,
            Stream::Stderr => TYPE_STDERR,
        };
        for client in &mut self.clients {
            client.queue(|out| encode_data(kind, data, out), super::HEADER_LEN + data.len(), false);
        }
        self.reap();
    }

    /// The container has exited: stop listening, close its stdin, send every client the exit
    /// frame and what it has not received yet (waiting at most `timeout` for slow ones), and
    /// disconnect them.
    pub(crate) fn finish(mut self, exit_code: i32, timeout: Duration) {
        self.unlink();
        self.stdin.close();
        let exit = Frame::Exit(exit_code);
        for client in &mut self.clients {
            client.queue(|out| exit.encode(out), super::HEADER_LEN + 4, true);
        }
        let deadline = Instant::now() + timeout;
        loop {
            self.clients.retain_mut(|c| {
                let keep = !c.dead && c.backlog() > 0;
                if !keep {
                    c.discard_input();
                }
                keep
            });
            let left = deadline.saturating_duration_since(Instant::now());
            if self.clients.is_empty() || left.is_zero() {
                break;
            }
            let mut fds: Vec<PollFd> =
                self.clients.iter().map(|c| PollFd::new(c.stream.as_fd(), PollFlags::POLLOUT)).collect();
            let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => break,
            }
            let ready: Vec<PollFlags> = fds.iter().map(|fd| fd.revents().unwrap_or(PollFlags::empty())).collect();
            drop(fds);
            for (client, ready) in self.clients.iter_mut().zip(ready) {
                if ready.intersects(PollFlags::POLLERR | PollFlags::POLLHUP) {
                    client.dead = true;
                } else if ready.contains(PollFlags::POLLOUT) {
                    client.flush();
                }
            }
        }
    }

    /// Accepts every pending connection.
    fn accept(&mut self) {
        let Some(listener) = &self.listener else { return };
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let first = self.stdin_once && !self.had_client;
                    self.had_client = true;
                    self.clients.push(Client {
                        stream,
                        out: Vec::new(),
                        sent: 0,
                        reading: true,
                        hung_up: false,
                        first,
                        dead: false,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // WouldBlock: all taken. EMFILE and the like: the connection waits in the backlog.
                Err(_) => return,
            }
        }
    }

    /// Disconnects dead clients; applies `--stdin-once` when the first client's input ended.
    fn reap(&mut self) {
        for client in &mut self.clients {
            if client.first && (client.dead || !client.reading) {
                client.first = false;
                self.stdin.close_when_drained = true;
                self.stdin.write();
            }
        }
        self.clients.retain(|c| !c.dead);
    }

    fn unlink(&mut self) {
        if self.listener.take().is_some() {
            let _ = fs::remove_file(&self.path);
        }
    }

    #[cfg(test)]
    fn client_count(&self) -> usize {
        self.clients.len()
    }
}

impl Drop for AttachServer {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Gives back a drained buffer's memory if it grew large.
fn release(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP_CAPACITY {
        *buf = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::read_frame;
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixStream;

    /// One round of the monitor's loop for the server alone (waits at most 100 ms).
    fn step(server: &mut AttachServer) {
        step_within(server, 100);
    }

    fn step_within(server: &mut AttachServer, millis: u8) {
        let mut fds = Vec::new();
        let mut polled = Vec::new();
        server.register(&mut fds, &mut polled);
        poll(&mut fds, PollTimeout::from(millis)).unwrap();
        let ready: Vec<PollFlags> = fds.iter().map(|fd| fd.revents().unwrap_or(PollFlags::empty())).collect();
        drop(fds);
        server.handle(&polled, &ready, &mut [0u8; 16 * 1024]);
    }

    fn stdin_pipe() -> (File, File) {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        (File::from(r), File::from(w))
    }

    fn until(server: &mut AttachServer, mut done: impl FnMut(&AttachServer) -> bool) {
        for _ in 0..50 {
            if done(server) {
                return;
            }
            step(server);
        }
        panic!("condition not reached");
    }

    #[test]
    fn output_reaches_every_client_then_the_exit_frame_and_the_path_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/c.sock");
        let mut server = AttachServer::bind(&path, None, false).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let mut a = UnixStream::connect(&path).unwrap();
        let mut b = UnixStream::connect(&path).unwrap();
        until(&mut server, |s| s.client_count() == 2);
        server.broadcast(Stream::Stdout, b"hello\n");
        server.broadcast(Stream::Stderr, b"oops");
        server.finish(3, Duration::from_secs(1));
        assert!(!path.exists());
        for client in [&mut a, &mut b] {
            assert_eq!(read_frame(client).unwrap(), Some(Frame::Stdout(b"hello\n".to_vec())));
            assert_eq!(read_frame(client).unwrap(), Some(Frame::Stderr(b"oops".to_vec())));
            assert_eq!(read_frame(client).unwrap(), Some(Frame::Exit(3)));
            assert_eq!(read_frame(client).unwrap(), None);
        }
    }

    #[test]
    fn a_client_that_falls_a_megabyte_behind_is_dropped_and_the_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let mut server = AttachServer::bind(&path, None, false).unwrap();
        let stalled = UnixStream::connect(&path).unwrap();
        until(&mut server, |s| s.client_count() == 1);
        let mut reader = UnixStream::connect(&path).unwrap();
        until(&mut server, |s| s.client_count() == 2);
        let chunk = vec![b'x'; 16 * 1024];
        let reading = std::thread::spawn(move || {
            let mut total = 0;
            while let Some(Frame::Stdout(data)) = read_frame(&mut reader).unwrap() {
                total += data.len();
            }
            total
        });
        let mut sent = 0;
        for _ in 0..256 {
            server.broadcast(Stream::Stdout, &chunk);
            sent += chunk.len();
            // The reader (the last client) keeps up; the stalled one does not.
            while server.clients.last().unwrap().backlog() > 0 {
                step_within(&mut server, 10);
            }
        }
        assert_eq!(server.client_count(), 1, "the stalled client is gone");
        server.finish(0, Duration::from_secs(5));
        assert_eq!(reading.join().unwrap(), sent);
        drop(stalled);
    }

    #[test]
    fn client_input_goes_to_stdin_and_a_half_close_leaves_it_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let (mut stdin_r, stdin_w) = stdin_pipe();
        let mut server = AttachServer::bind(&path, Some(stdin_w), false).unwrap();
        let mut a = UnixStream::connect(&path).unwrap();
        a.write_all(b"echo hello\n").unwrap();
        a.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        until(&mut server, |_| {
            let mut buf = [0u8; 64];
            if let Ok(n) = stdin_r.read(&mut buf) {
                got.extend_from_slice(&buf[..n]);
            }
            got == b"echo hello\n"
        });
        for _ in 0..3 {
            step(&mut server);
        }
        let err = stdin_r.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "stdin is still open");
        assert_eq!(server.client_count(), 1, "a half-closed client still receives output");
    }

    #[test]
    fn with_stdin_once_the_end_of_the_first_clients_input_closes_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let (mut stdin_r, stdin_w) = stdin_pipe();
        let mut server = AttachServer::bind(&path, Some(stdin_w), true).unwrap();
        let mut a = UnixStream::connect(&path).unwrap();
        until(&mut server, |s| s.client_count() == 1);
        let mut b = UnixStream::connect(&path).unwrap();
        until(&mut server, |s| s.client_count() == 2);
        a.write_all(b"abc").unwrap();
        a.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        until(&mut server, |_| stdin_r.read_to_end(&mut got).is_ok());
        assert_eq!(got, b"abc", "stdin ends after the first client's input");
        b.write_all(b"late").unwrap();
        step(&mut server);
        assert_eq!(server.client_count(), 2);
    }

    #[test]
    fn dropping_the_server_removes_the_socket_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        drop(AttachServer::bind(&path, None, false).unwrap());
        assert!(!path.exists());
        // A stale socket left by a dead monitor is replaced.
        let stale = UnixListener::bind(&path).unwrap();
        drop(AttachServer::bind(&path, None, false).unwrap());
        drop(stale);
    }
}
