//! The proxy's incremental transactions written to the kernel directly: one nfnetlink batch on
//! a `NETLINK_NETFILTER` socket, every message acknowledged, a refusal reported with its errno
//! and the step it was about. `nft` reads the kernel's whole ruleset before each run, which
//! costs tens of milliseconds with thousands of chains; a batch costs what the kernel does.
//!
//! [`expr`] turns a rule's statements into kernel expressions, [`message`] lays out the bytes;
//! this module owns the socket.

pub mod expr;
mod message;

use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send, setsockopt, socket,
    sockopt,
};
use nix::sys::time::TimeVal;

use crate::command::Command;
use crate::proxier::ProxyError;

use self::message::Batch;

/// `NLMSG_ERROR`: the kernel's answer to an acknowledged message (errno 0 for success).
const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
/// How long the kernel may take to answer a batch.
const ANSWER_TIMEOUT_SECS: i64 = 30;
/// Receive buffer room per acknowledged message: an ack is small, but each one is its own
/// socket buffer in the kernel's accounting.
const RCVBUF_PER_ACK: usize = 1024;
const MIN_BUF: usize = 1 << 20;

/// A netfilter netlink socket, bound to the network namespace of the thread that opened it.
#[derive(Debug)]
pub struct Netlink {
    fd: OwnedFd,
    /// The next batch's first sequence number.
    seq: u32,
    /// The socket buffer sizes asked for so far.
    rcvbuf: usize,
    sndbuf: usize,
}

fn failed(action: &'static str) -> impl FnOnce(Errno) -> ProxyError {
    move |source| ProxyError::Netlink { action, source }
}

impl Netlink {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Netlink, ProxyError> {
        let fd = socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkNetFilter)
            .map_err(failed("open a netfilter netlink socket"))?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(failed("bind the netlink socket"))?;
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(ANSWER_TIMEOUT_SECS, 0))
            .map_err(failed("set the netlink socket's timeout"))?;
        // Sequence numbers only tell this socket's batches apart; start away from 0.
        let seq = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs() as u32);
        Ok(Netlink { fd, seq, rcvbuf: 0, sndbuf: 0 })
    }

    /// Applies `commands` to `table` (family ip) as one transaction: all of them or, on an
    /// error, none. A command without a netlink encoding fails the call before anything is sent.
    pub fn apply(&mut self, table: &str, commands: &[Command]) -> Result<(), ProxyError> {
        if commands.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::new(self.seq);
        batch.extend(table, commands)?;
        let first = batch.first_seq().wrapping_add(1);
        let (bytes, owners) = batch.finish();
        self.seq = self.seq.wrapping_add(owners.len() as u32 + 2);
        self.make_room(bytes.len(), owners.len())?;
        let sent = send(self.fd.as_raw_fd(), &bytes, MsgFlags::empty()).map_err(failed("send the batch"))?;
        if sent != bytes.len() {
            return Err(ProxyError::Netlink { action: "send the whole batch", source: Errno::EMSGSIZE });
        }
        let mut refusal: Option<(u32, Errno)> = None;
        self.read_answers(first, owners.len(), |seq, errno| {
            // The first refusal is the cause; later ones usually follow from it.
            if refusal.is_none_or(|(s, _)| seq.wrapping_sub(first) < s.wrapping_sub(first)) {
                refusal = Some((seq, errno));
            }
        })?;
        match refusal {
            None => Ok(()),
            Some((seq, errno)) => {
                let command = &commands[owners[seq.wrapping_sub(first) as usize]];
                Err(ProxyError::Kernel { command: command.to_string(), errno })
            }
        }
    }

    /// Grows the socket's buffers to hold a batch of `len` bytes and `acks` answers.
    fn make_room(&mut self, len: usize, acks: usize) -> Result<(), ProxyError> {
        let sndbuf = (len + 4096).max(MIN_BUF);
        if sndbuf > self.sndbuf {
            // The forcing options pass the system's limits, as root may; else ask within them.
            setsockopt(&self.fd, sockopt::SndBufForce, &sndbuf)
                .or_else(|_| setsockopt(&self.fd, sockopt::SndBuf, &sndbuf))
                .map_err(failed("grow the netlink send buffer"))?;
            self.sndbuf = sndbuf;
        }
        let rcvbuf = (acks * RCVBUF_PER_ACK).max(MIN_BUF);
        if rcvbuf > self.rcvbuf {
            setsockopt(&self.fd, sockopt::RcvBufForce, &rcvbuf)
                .or_else(|_| setsockopt(&self.fd, sockopt::RcvBuf, &rcvbuf))
                .map_err(failed("grow the netlink receive buffer"))?;
            self.rcvbuf = rcvbuf;
        }
        Ok(())
    }

    /// Reads until each of the `count` messages from sequence `first` on is answered; `refused`
    /// hears of every nonzero errno. Answers to other sequence numbers (an earlier batch given
    /// up on) are skipped.
    fn read_answers(&self, first: u32, count: usize, mut refused: impl FnMut(u32, Errno)) -> Result<(), ProxyError> {
        let mut answered = vec![false; count];
        let mut left = count;
        let mut buf = vec![0u8; 256 * 1024];
        while left > 0 {
            let n =
                recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(failed("read the kernel's answers"))?;
            for (seq, errno) in answers(&buf[..n]) {
                // A refused begin message means the kernel skipped the whole batch.
                if let (true, Some(errno)) = (seq == first.wrapping_sub(1), errno) {
                    return Err(ProxyError::Kernel { command: "begin the batch".into(), errno });
                }
                let Some(slot) = answered.get_mut(seq.wrapping_sub(first) as usize) else { continue };
                if !*slot {
                    *slot = true;
                    left -= 1;
                    if let Some(errno) = errno {
                        refused(seq, errno);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The acknowledgements in one datagram: the sequence number each answers, and its errno when
/// the message was refused.
fn answers(mut buf: &[u8]) -> Vec<(u32, Option<Errno>)> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            break;
        }
        let msg_type = u16::from_ne_bytes(buf[4..6].try_into().expect("2 bytes"));
        // nlmsgerr: the error (negative errno), then the header of the message it answers.
        if msg_type == NLMSG_ERROR && len >= NLMSG_HDRLEN + 4 + NLMSG_HDRLEN {
            let error = i32::from_ne_bytes(buf[16..20].try_into().expect("4 bytes"));
            let seq = u32::from_ne_bytes(buf[28..32].try_into().expect("4 bytes"));
            out.push((seq, (error != 0).then(|| Errno::from_raw(-error))));
        }
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(seq: u32, error: i32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&36u32.to_ne_bytes());
        m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&error.to_ne_bytes());
        // The answered message's header: only its sequence number matters here.
        m.extend_from_slice(&[0; 8]);
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        m
    }

    #[test]
    fn acknowledgements_carry_the_sequence_number_and_a_refusal_its_errno() {
        let datagram = [ack(7, 0), ack(8, -libc_enoent())].concat();
        assert_eq!(answers(&datagram), [(7, None), (8, Some(Errno::ENOENT))]);
    }

    fn libc_enoent() -> i32 {
        Errno::ENOENT as i32
    }
}
