//! Counters and histograms in the Prometheus text format, kept in memory (they restart with the
//! service, as Prometheus expects of counters).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the request-duration histogram, seconds.
const BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

/// The service's metrics.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    durations: Mutex<BTreeMap<String, Histogram>>,
    ttl: Mutex<BTreeMap<&'static str, u64>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Escapes a label value as the text format requires.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    /// Counts one answered request.
    pub fn request(&self, method: &str, route: &str, status: u16, took: Duration) {
        *lock(&self.requests).entry((method.to_string(), route.to_string(), status)).or_default() += 1;
        let mut d = lock(&self.durations);
        let h = d.entry(route.to_string()).or_default();
        let secs = took.as_secs_f64();
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                h.counts[i] += 1;
            }
        }
        h.sum += secs;
        h.count += 1;
    }

    /// Counts one TTL action (`kill`, `pause`, `failed`).
    pub fn ttl(&self, action: &'static str) {
        *lock(&self.ttl).entry(action).or_default() += 1;
    }

    /// Renders everything, with the sandbox gauges given by state.
    pub fn render(&self, sandboxes: &BTreeMap<&'static str, usize>, max_sandboxes: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP branchbox_http_requests_total HTTP requests answered.");
        let _ = writeln!(out, "# TYPE branchbox_http_requests_total counter");
        for ((m, r, s), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "branchbox_http_requests_total{{method=\"{}\",route=\"{}\",status=\"{s}\"}} {n}",
                esc(m),
                esc(r)
            );
        }
        let _ = writeln!(out, "# HELP branchbox_http_request_duration_seconds Time to the response head.");
        let _ = writeln!(out, "# TYPE branchbox_http_request_duration_seconds histogram");
        for (r, h) in lock(&self.durations).iter() {
            let r = esc(r);
            for (i, le) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "branchbox_http_request_duration_seconds_bucket{{route=\"{r}\",le=\"{le}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                out,
                "branchbox_http_request_duration_seconds_bucket{{route=\"{r}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(out, "branchbox_http_request_duration_seconds_sum{{route=\"{r}\"}} {}", h.sum);
            let _ =
                writeln!(out, "branchbox_http_request_duration_seconds_count{{route=\"{r}\"}} {}", h.count);
        }
        let _ = writeln!(out, "# HELP branchbox_sandboxes Sandboxes by state.");
        let _ = writeln!(out, "# TYPE branchbox_sandboxes gauge");
        for (state, n) in sandboxes {
            let _ = writeln!(out, "branchbox_sandboxes{{state=\"{state}\"}} {n}");
        }
        let _ = writeln!(out, "# HELP branchbox_sandboxes_max Most sandboxes at once.");
        let _ = writeln!(out, "# TYPE branchbox_sandboxes_max gauge");
        let _ = writeln!(out, "branchbox_sandboxes_max {max_sandboxes}");
        let _ = writeln!(out, "# HELP branchbox_ttl_actions_total Sandboxes acted on at timeout.");
        let _ = writeln!(out, "# TYPE branchbox_ttl_actions_total counter");
        for (a, n) in lock(&self.ttl).iter() {
            let _ = writeln!(out, "branchbox_ttl_actions_total{{action=\"{a}\"}} {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_counters_add_up() {
        let m = Metrics::default();
        m.request("GET", "/healthz", 200, Duration::from_millis(3));
        m.request("GET", "/healthz", 200, Duration::from_millis(200));
        let text = m.render(&BTreeMap::from([("running", 2)]), 8);
        assert!(text
            .contains("branchbox_http_requests_total{method=\"GET\",route=\"/healthz\",status=\"200\"} 2"));
        assert!(text.contains("_bucket{route=\"/healthz\",le=\"0.005\"} 1"));
        assert!(text.contains("_bucket{route=\"/healthz\",le=\"0.25\"} 2"));
        assert!(text.contains("_bucket{route=\"/healthz\",le=\"+Inf\"} 2"));
        assert!(text.contains("branchbox_sandboxes{state=\"running\"} 2"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
