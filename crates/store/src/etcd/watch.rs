//! Watches on etcd that outlive the member they started on: when a member's stream breaks,
//! the watch is opened again on another member from the revision after the last event it
//! delivered, so no event is lost or repeated. Only compaction of that revision, or no member
//! answering for the failover time, ends the stream with an error.
//!
//! A watch with progress learns the store's revision from progress notifications, each meaning
//! that every event up to it has been sent. On a member whose requested notifications keep that
//! promise (etcd 3.4.31+, 3.5.13+), it asks for one every [`PROGRESS_INTERVAL`]. Older members
//! answer a request at once with their current revision even while the watch is still catching
//! up, so a notification could overtake events and they would be skipped as already seen
//! (etcd issue 15220); there the watch relies on etcd's own periodic notifications, which only
//! a caught-up watch gets (`--experimental-watch-progress-notify-interval`, 10 minutes unless
//! set).

use std::collections::VecDeque;
use std::sync::Arc;

use etcd_client::{Client, WatchOptions, WatchResponse, WatchStream as EtcdStream};

use super::members::{Answer, Bound, Members};
use super::{Keys, MAX_RESPONSE};
use crate::{PROGRESS_INTERVAL, ProgressStream, Result, Revision, StoreError, WatchItem};

/// A watch's key range and the members to open it on.
pub(super) struct Watched {
    pub members: Arc<Members>,
    pub keys: Keys,
    pub start: Vec<u8>,
    pub end: Vec<u8>,
}

/// An open etcd watch stream and the member serving it.
struct Opened {
    stream: EtcdStream,
    member: usize,
    /// Whether progress may be requested from this member (see the module doc).
    requests_progress: bool,
}

/// Whether a member of etcd `version` answers a progress request only once the watch has caught
/// up. The fix of etcd issue 15220 came in 3.4.25 and 3.5.8, and its follow-up (a new watch on
/// an old revision got no answer) in 3.4.31 and 3.5.13: both are required. Unknown versions are
/// not trusted.
fn progress_requests_are_safe(version: &str) -> bool {
    let mut parts =
        version.split('.').map(|p| p.split(|c: char| !c.is_ascii_digit()).next().unwrap_or("").parse::<u64>());
    let (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch))) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m > 5,
        (m, _) => m > 3,
    }
}

/// How opening a watch ended.
pub(super) enum OpenError {
    /// `after` was compacted up to this revision.
    Compacted(Revision),
    Other(StoreError),
}

impl Watched {
    /// Opens the watch of events after `after` on a member that answers, waiting for etcd to
    /// confirm it (a refusal, such as compaction, comes as that first response).
    /// With `progress`, also finds out whether the member may be asked for progress.
    async fn open(&self, after: Revision, progress: bool) -> std::result::Result<(Opened, WatchResponse), OpenError> {
        let (start, end) = (self.start.clone(), self.end.clone());
        let op = move |client: Client| {
            let mut opts = WatchOptions::new().with_range(end.clone()).with_start_revision(after + 1).with_prev_key();
            if progress {
                opts = opts.with_progress_notify();
            }
            let start = start.clone();
            async move {
                let requests_progress = match progress {
                    true => progress_requests_are_safe(client.maintenance_client().status().await?.version()),
                    false => false,
                };
                let mut watch = client.watch_client().max_decoding_message_size(MAX_RESPONSE);
                let mut stream = watch.watch(start, Some(opts)).await?;
                let first = stream
                    .message()
                    .await?
                    .ok_or_else(|| etcd_client::Error::WatchError("etcd closed the watch".into()))?;
                Ok((stream, first, requests_progress))
            }
        };
        match self.members.call(Bound::Point, op).await {
            Ok(Answer { value: (stream, first, requests_progress), member, .. }) => {
                if first.canceled() && first.compact_revision() > 0 {
                    return Err(OpenError::Compacted(first.compact_revision()));
                }
                Ok((Opened { stream, member, requests_progress }, first))
            }
            Err(e) => Err(OpenError::Other(e.plain())),
        }
    }

    /// The stream of events after `after`, on whichever members answer; with progress
    /// reports if `progress`.
    pub(super) async fn stream(
        self,
        after: Revision,
        progress: bool,
    ) -> std::result::Result<ProgressStream, OpenError> {
        let (opened, first) = self.open(after, progress).await?;
        let mut state = ResumingWatch {
            watched: self,
            opened: Some(opened),
            queued: VecDeque::new(),
            last: after,
            progress: progress.then(|| tokio::time::Instant::now() + PROGRESS_INTERVAL),
        };
        state.absorb(first);
        Ok(Box::pin(futures::stream::unfold(state, |mut w| async move { w.next().await.map(|item| (item, w)) })))
    }
}

struct ResumingWatch {
    watched: Watched,
    /// `None` once the stream has ended for good.
    opened: Option<Opened>,
    queued: VecDeque<Result<WatchItem>>,
    /// The revision of the last event or progress queued: a resumed watch starts after it.
    last: Revision,
    /// For a watch with progress: when to ask for the next progress notification.
    progress: Option<tokio::time::Instant>,
}

/// What one response from etcd means for the watch.
enum Absorbed {
    Events,
    /// The member stopped this watch (it lost its leader, or is shutting down).
    Canceled(String),
}

impl ResumingWatch {
    /// Queues the events, or the end, that one etcd watch response carries.
    fn absorb(&mut self, resp: WatchResponse) -> Absorbed {
        if resp.canceled() {
            if resp.compact_revision() > 0 {
                self.end_with(StoreError::Compacted { requested: self.last, compacted: resp.compact_revision() });
                return Absorbed::Events;
            }
            return Absorbed::Canceled(format!("etcd canceled the watch: {}", resp.cancel_reason()));
        }
        // A progress notification: no events, not the answer to the watch's creation.
        if resp.events().is_empty() && !resp.created() {
            let revision = resp.header().map_or(0, |h| h.revision());
            if self.progress.is_some() && revision > self.last {
                self.last = revision;
                self.queued.push_back(Ok(WatchItem::Progress(revision)));
            }
            return Absorbed::Events;
        }
        for ev in resp.events() {
            let ev = self.watched.keys.event(ev);
            match &ev {
                // A resumed watch never repeats what was delivered.
                Ok(ev) if ev.revision <= self.last => continue,
                Ok(ev) => self.last = ev.revision,
                Err(_) => {}
            }
            self.queued.push_back(ev.map(WatchItem::Event));
        }
        Absorbed::Events
    }

    fn end_with(&mut self, err: StoreError) {
        self.queued.push_back(Err(err));
    }

    /// Opens the watch again after the last event, on another member if need be.
    async fn resume(&mut self, why: String) {
        if let Some(old) = self.opened.take() {
            self.watched.members.failed(old.member, &why);
        }
        match self.watched.open(self.last, self.progress.is_some()).await {
            Ok((opened, first)) => {
                tracing::debug!(after = self.last, "etcd watch resumed");
                self.opened = Some(opened);
                if let Absorbed::Canceled(why) = self.absorb(first) {
                    self.opened = None;
                    self.end_with(StoreError::Unavailable(why.into()));
                }
            }
            Err(OpenError::Compacted(compacted)) => {
                self.end_with(StoreError::Compacted { requested: self.last, compacted });
            }
            Err(OpenError::Other(e)) => self.end_with(e),
        }
    }

    async fn next(&mut self) -> Option<Result<WatchItem>> {
        loop {
            if let Some(item) = self.queued.pop_front() {
                if item.is_err() {
                    self.opened = None;
                    self.queued.clear();
                }
                return Some(item);
            }
            let opened = self.opened.as_mut()?;
            let message = match self.progress.filter(|_| opened.requests_progress) {
                Some(due) => tokio::select! {
                    message = opened.stream.message() => message,
                    () = tokio::time::sleep_until(due) => {
                        self.progress = Some(tokio::time::Instant::now() + PROGRESS_INTERVAL);
                        // A refused request shows as a broken stream on the next read.
                        let _ = opened.stream.request_progress().await;
                        continue;
                    }
                },
                None => opened.stream.message().await,
            };
            let why = match message {
                Ok(Some(resp)) => match self.absorb(resp) {
                    Absorbed::Events => continue,
                    Absorbed::Canceled(why) => why,
                },
                Ok(None) => "etcd closed the watch stream".to_owned(),
                Err(e) => format!("etcd watch stream broke: {e}"),
            };
            self.resume(why).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::progress_requests_are_safe;

    #[test]
    fn progress_is_requested_only_from_etcd_releases_that_answer_after_the_events() {
        for safe in ["3.4.31", "3.4.37", "3.5.13", "3.5.21", "3.6.0", "3.6.5-rc.0", "4.0.0"] {
            assert!(progress_requests_are_safe(safe), "{safe}");
        }
        for unsafe_ in ["3.4.23", "3.4.30", "3.5.8", "3.5.12", "3.3.27", "", "3.5", "dev"] {
            assert!(!progress_requests_are_safe(unsafe_), "{unsafe_}");
        }
    }
}
