//! The terminal of a container created with one: the console socket on which the OCI runtime
//! sends the pty master (runc's `--console-socket` protocol: one message, the master as an
//! `SCM_RIGHTS` descriptor), and the window size the runtime asks for.
//!
//! Resizing goes through the state dir: the runtime writes [`WINSIZE_FILE`] ("COLS ROWS") and
//! sends the monitor SIGWINCH ([`crate::control::resize`]); the monitor sets it on the master.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

/// The file in the state dir holding the window size the runtime asked for.
pub const WINSIZE_FILE: &str = "winsize";

/// Listening for the pty master; the path is removed on drop.
pub(crate) struct ConsoleListener {
    path: PathBuf,
    listener: UnixListener,
}

impl ConsoleListener {
    /// Listens at `path` (parent created, a stale socket replaced), mode 0600.
    pub(crate) fn bind(path: &Path) -> io::Result<Self> {
        let listener = bind_private(path)?;
        Ok(ConsoleListener { path: path.to_path_buf(), listener })
    }

    /// The master the OCI runtime sent (it connects and sends during create, so it is waiting
    /// in the backlog by the time create returns); at most `timeout` of waiting.
    pub(crate) fn receive_master(self, timeout: Duration) -> io::Result<OwnedFd> {
        let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        if poll(&mut fds, PollTimeout::from(millis)).map_err(io::Error::from)? == 0 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the OCI runtime sent no terminal"));
        }
        let (stream, _) = self.listener.accept()?;
        let mut name = [0u8; 4096];
        let mut iov = [io::IoSliceMut::new(&mut name)];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let msg = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(io::Error::from)?;
        for cmsg in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg
                && let Some(&fd) = fds.first()
            {
                // SAFETY: SCM_RIGHTS installed this descriptor in our table; nothing else owns it.
                #[allow(unsafe_code)]
                let master = unsafe { OwnedFd::from_raw_fd(fd) };
                for extra in &fds[1..] {
                    let _ = nix::unistd::close(*extra);
                }
                return Ok(master);
            }
        }
        Err(io::Error::new(io::ErrorKind::InvalidData, "the console socket message carried no descriptor"))
    }
}

impl Drop for ConsoleListener {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Listens on a unix socket at `path` (its parent created, a stale socket there replaced) that
/// only root may connect to (mode 0600); the path is removed again if that fails.
pub(crate) fn bind_private(path: &Path) -> io::Result<UnixListener> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    if let Err(e) = fs::set_permissions(path, fs::Permissions::from_mode(0o600)) {
        let _ = fs::remove_file(path);
        return Err(e);
    }
    Ok(listener)
}

/// Parses [`WINSIZE_FILE`]: "COLS ROWS".
pub(crate) fn parse_winsize(text: &str) -> Option<(u16, u16)> {
    let mut parts = text.split_whitespace().map(str::parse::<u16>);
    match (parts.next(), parts.next()) {
        (Some(Ok(cols)), Some(Ok(rows))) => Some((cols, rows)),
        _ => None,
    }
}

/// Sets the terminal size the runtime last asked for in `state_dir` on `master`.
pub(crate) fn apply_requested_size(state_dir: &Path, master: &OwnedFd) {
    let Some((cols, rows)) = fs::read_to_string(state_dir.join(WINSIZE_FILE)).ok().as_deref().and_then(parse_winsize)
    else {
        return;
    };
    let size = nix::libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which lives across the call.
    #[allow(unsafe_code)]
    unsafe {
        nix::libc::ioctl(master.as_raw_fd(), nix::libc::TIOCSWINSZ, &size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_size_is_columns_then_rows() {
        assert_eq!(parse_winsize("120 40\n"), Some((120, 40)));
        assert_eq!(parse_winsize("120"), None);
        assert_eq!(parse_winsize("wide 40"), None);
    }

    #[test]
    fn a_descriptor_sent_over_the_console_socket_is_received() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.console");
        let listener = ConsoleListener::bind(&path).unwrap();
        let (read_end, write_end) = nix::unistd::pipe().unwrap();
        let client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let fds = [write_end.as_raw_fd()];
        let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
        let iov = [io::IoSlice::new(b"/dev/pts/9")];
        nix::sys::socket::sendmsg::<()>(client.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).unwrap();
        drop(write_end);
        let received = listener.receive_master(Duration::from_secs(5)).unwrap();
        nix::unistd::write(&received, b"hi").unwrap();
        let mut buf = [0u8; 2];
        nix::unistd::read(&read_end, &mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        assert!(!path.exists(), "the socket is removed once the master arrived");
    }

    #[test]
    fn no_descriptor_in_time_is_a_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let listener = ConsoleListener::bind(&dir.path().join("c.console")).unwrap();
        let err = listener.receive_master(Duration::from_millis(50)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
