//! Benchmark reports: one JSON object per run, in the shape `docs/benchmarks.md` describes.
//!
//! Every figure carries its distribution (min/p50/p90/max) and the number of runs, so a reader
//! never has to trust a single sample; every report names its method and the reference it was
//! compared to, measured in the same run.

use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Distribution of one measured figure, in milliseconds unless `unit` says otherwise.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stats {
    /// Unit of every value below (`ms`, `MiB`, ...).
    pub unit: String,
    /// Number of samples.
    pub runs: usize,
    /// Smallest sample.
    pub min: f64,
    /// Median (nearest-rank).
    pub p50: f64,
    /// 90th percentile (nearest-rank).
    pub p90: f64,
    /// Largest sample.
    pub max: f64,
}

impl Stats {
    /// Summarises raw samples given in `unit`; `None` when there are no samples.
    pub fn from_samples(unit: &str, samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let idx = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
            sorted[idx]
        };
        Some(Stats {
            unit: unit.to_string(),
            runs: sorted.len(),
            min: sorted[0],
            p50: rank(0.5),
            p90: rank(0.9),
            max: sorted[sorted.len() - 1],
        })
    }

    /// Summarises durations in milliseconds.
    pub fn from_durations(samples: &[Duration]) -> Option<Stats> {
        let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        Stats::from_samples("ms", &ms)
    }
}

/// One benchmark run: inputs, host facts, figures, and a one-line human summary.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Benchmark name (`fork`, `exec`, `density`, ...).
    pub bench: String,
    /// Backend measured (`microvm`, `gvisor`).
    pub backend: String,
    /// When the clock starts and stops, and what the reference is.
    pub method: String,
    /// Parameters of the run.
    pub inputs: serde_json::Value,
    /// Facts about the host that the figures depend on.
    pub host: serde_json::Value,
    /// Measured figures by name; references carry names starting with `floor` or `ref`.
    pub figures: BTreeMap<String, Stats>,
    /// Derived ratios (figure / reference), by name.
    pub ratios: BTreeMap<String, f64>,
    /// One line for humans.
    pub summary: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<f64> = (1..=10).map(f64::from).collect();
        let s = Stats::from_samples("ms", &samples).unwrap();
        assert_eq!((s.min, s.p50, s.p90, s.max, s.runs), (1.0, 5.0, 9.0, 10.0, 10));
    }

    #[test]
    fn empty_samples_give_no_stats() {
        assert!(Stats::from_samples("ms", &[]).is_none());
    }
}
