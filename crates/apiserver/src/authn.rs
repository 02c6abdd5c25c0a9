//! Bearer-token authentication: the admin token and a Kubernetes token CSV file.
