//! Raw etcd puts through `etcd-client`: the ceiling the API is compared with.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::stats::Latencies;

/// `total` puts of `value_bytes`-byte values on distinct keys, spread over `clients` concurrent
/// tasks sharing one gRPC channel, as an apiserver's etcd client does. With several `endpoints`
/// (the members of one cluster) that channel is etcd-client's balanced one over all of them.
/// Returns the per-put latencies and the wall time of the whole burst.
pub async fn puts<S: AsRef<str>>(
    endpoints: &[S],
    clients: usize,
    total: usize,
    value_bytes: usize,
) -> anyhow::Result<(Latencies, Duration)> {
    let client = etcd_client::Client::connect(endpoints, None).await?;
    let value: Arc<Vec<u8>> = Arc::new(vec![b'x'; value_bytes]);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut kv = client.kv_client();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Latencies::default();
            for i in 0..crate::stats::share(total, clients, c) {
                let key = format!("/bench-raw/{clients}/{c}/{i}");
                let t0 = Instant::now();
                kv.put(key, value.as_slice(), None).await?;
                lat.record(t0.elapsed());
            }
            anyhow::Ok(lat)
        }));
    }
    let mut all = Latencies::default();
    for t in tasks {
        all.add(&t.await??);
    }
    Ok((all, start.elapsed()))
}
