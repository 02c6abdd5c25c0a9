//! The kubelet HTTPS API: container logs, exec, attach, port-forward, health, metrics and pods.
