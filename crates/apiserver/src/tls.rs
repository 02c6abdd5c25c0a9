//! The CA, serving certificate and admin kubeconfig the server keeps in its data dir.
