//! Latency histograms and the figures (one row of the report) they turn into.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Client `c`'s part of `total` operations split over `clients`, so that the parts add up.
pub fn share(total: usize, clients: usize, c: usize) -> usize {
    total / clients + usize::from(c < total % clients)
}

/// Latencies in microseconds, from 1 µs to an hour with 3 significant digits.
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Self(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"))
    }
}

impl Latencies {
    pub fn record(&mut self, d: Duration) {
        // Sub-microsecond samples count as 1 µs, the histogram's floor.
        self.0.saturating_record((d.as_micros() as u64).max(1));
    }

    pub fn add(&mut self, other: &Latencies) {
        self.0.add(&other.0).expect("histograms with the same bounds");
    }

    pub fn len(&self) -> u64 {
        self.0.len()
    }

    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.0.value_at_quantile(q) as f64 / 1000.0)
    }

    pub fn max_ms(&self) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.0.max() as f64 / 1000.0)
    }
}

/// One measured quantity: latency percentiles, a rate, or both.
#[derive(Clone, Debug)]
pub struct Figure {
    pub backend: String,
    pub metric: String,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub ops_per_sec: Option<f64>,
    pub samples: u64,
}

impl Figure {
    /// Percentiles of `lat`; a rate too when `elapsed` (the wall time of all samples) is given.
    pub fn new(backend: &str, metric: &str, lat: &Latencies, elapsed: Option<Duration>) -> Self {
        Self {
            backend: backend.to_owned(),
            metric: metric.to_owned(),
            p50_ms: lat.quantile_ms(0.50),
            p99_ms: lat.quantile_ms(0.99),
            ops_per_sec: elapsed.map(|e| lat.len() as f64 / e.as_secs_f64()),
            samples: lat.len(),
        }
    }
}
