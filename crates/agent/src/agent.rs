//! `berth agent`'s main loop: configuration, runtime status polling, the Node, pods and the kubelet API.
