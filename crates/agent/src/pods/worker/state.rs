//! The worker's states and what each holds: the selection back-off while resolving, the
//! runtime and sandbox of a running pod, what a finished or terminating pod holds on the node.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;

use super::Next;
use crate::endpoint::Endpoint;
use crate::pods::volumes::Prepared;
use crate::runtimes::SelectError;

/// Where the pod is in its life on this node, with what it holds there.
#[derive(Debug)]
pub enum State {
    Resolve(Selecting),
    NoRuntime(SelectError, Selecting),
    Running(Running),
    Finished(Finished),
    /// Torn down from what the pod held, or (`None`) from what the runtime manager knows.
    Terminating(Option<OnNode>),
    Done,
}

/// How selecting an endpoint for the handler went so far.
#[derive(Clone, Debug)]
pub struct Selecting {
    /// The RuntimeHandlerNotFound message last reported, so that it is reported once.
    pub(super) reported: Option<String>,
    pub(super) retry: Duration,
}

impl Default for Selecting {
    fn default() -> Self {
        Selecting { reported: None, retry: Duration::from_secs(1) }
    }
}

/// The endpoint a pod runs on, resolved once, with the pod's handler on it.
#[derive(Clone, Debug)]
pub struct PodRuntime {
    pub(super) endpoint: Arc<Endpoint>,
    pub(super) handler: String,
    /// The runtime's name as the status shows it.
    pub(super) runtime_name: String,
}

/// A sandbox of the pod, as last seen.
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub(super) id: String,
    pub(super) config: cri::PodSandboxConfig,
    pub(super) ips: Vec<String>,
    pub(super) ready: bool,
}

/// What a pod holds on a runtime.
#[derive(Clone, Debug)]
pub struct OnNode {
    pub(super) runtime: PodRuntime,
    pub(super) sandbox: Option<Sandbox>,
}

/// What a running pod's worker knows of its sandbox.
#[derive(Clone, Debug)]
pub(super) enum PodSandbox {
    /// Every runtime's pods were listed and none was this pod's, and no sandbox was asked for
    /// since: listing the pod's sandboxes and containers would find nothing (a pod new here).
    NothingOnNode,
    /// None held: not looked for yet, or not re-created (`restartPolicy: Never`).
    None,
    /// Found or created by the step before: the next need not ask about it.
    JustSeen(Sandbox),
    /// Held; asked about before each use.
    Held(Sandbox),
}

impl PodSandbox {
    pub(super) fn held(&self) -> Option<&Sandbox> {
        match self {
            PodSandbox::JustSeen(s) | PodSandbox::Held(s) => Some(s),
            PodSandbox::NothingOnNode | PodSandbox::None => None,
        }
    }
}

/// A pod whose containers run, or are to.
#[derive(Debug)]
pub struct Running {
    pub(super) runtime: PodRuntime,
    pub(super) sandbox: PodSandbox,
    /// A container could not be created because the sandbox is going away.
    pub(super) sandbox_going: bool,
    /// Images of the containers the pod starts first, looked up while its sandbox was created:
    /// image → its ID, `None` when not present. For the starts of the same step only.
    pub(super) images_looked_up: HashMap<String, Option<String>>,
    /// The volumes set up, and when.
    pub(super) volumes: Option<(HashMap<String, Prepared>, tokio::time::Instant)>,
}

impl Running {
    pub(super) fn new(runtime: PodRuntime, nothing_on_node: bool) -> Running {
        Running {
            runtime,
            sandbox: if nothing_on_node { PodSandbox::NothingOnNode } else { PodSandbox::None },
            sandbox_going: false,
            images_looked_up: HashMap::new(),
            volumes: None,
        }
    }

    pub(super) fn on_node(&self) -> OnNode {
        OnNode { runtime: self.runtime.clone(), sandbox: self.sandbox.held().cloned() }
    }
}

/// A pod whose phase is Succeeded or Failed.
#[derive(Debug)]
pub enum Finished {
    /// Its containers and sandbox are to be stopped.
    Stopping(OnNode),
    /// Stopped (or never on this node); its containers stay, for their logs, until it is deleted.
    Stopped(Option<OnNode>),
}

impl State {
    /// The state's name, for logs (its data is too large to show on each step).
    pub(super) fn name(&self) -> &'static str {
        match self {
            State::Resolve(_) => "Resolve",
            State::NoRuntime(..) => "NoRuntime",
            State::Running(_) => "Running",
            State::Finished(Finished::Stopping(_)) => "Finished (stopping)",
            State::Finished(Finished::Stopped(_)) => "Finished",
            State::Terminating(_) => "Terminating",
            State::Done => "Done",
        }
    }

    /// What the pod holds on a runtime, for the states that know.
    pub(super) fn on_node(&self) -> Option<OnNode> {
        match self {
            State::Running(r) => Some(r.on_node()),
            State::Finished(Finished::Stopping(n)) => Some(n.clone()),
            State::Finished(Finished::Stopped(n)) | State::Terminating(n) => n.clone(),
            State::Resolve(_) | State::NoRuntime(..) | State::Done => None,
        }
    }
}

/// What the pod status shows of where the pod runs.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Shown<'a> {
    pub(super) runtime: Option<&'a PodRuntime>,
    pub(super) sandbox: Option<&'a Sandbox>,
    /// No runtime serves the pod's handler.
    pub(super) blocked: Option<&'a SelectError>,
}

impl<'a> Shown<'a> {
    pub(super) fn on(runtime: &'a PodRuntime, sandbox: Option<&'a Sandbox>) -> Shown<'a> {
        Shown { runtime: Some(runtime), sandbox, blocked: None }
    }

    pub(super) fn on_node(node: Option<&'a OnNode>) -> Shown<'a> {
        node.map_or_else(Shown::default, |n| Shown::on(&n.runtime, n.sandbox.as_ref()))
    }
}

/// A step's outcome: when to step again, and the state to go to when it changes.
pub(super) struct Stepped {
    pub(super) next: Next,
    pub(super) to: Option<State>,
}

impl Stepped {
    pub(super) fn stay(next: Next) -> Stepped {
        Stepped { next, to: None }
    }

    pub(super) fn to(state: State, next: Next) -> Stepped {
        Stepped { next, to: Some(state) }
    }
}
