//! Reading the hosts' `/metrics` (Prometheus text). A scenario that adds
//! up what its hosts report fails when one cannot be read: leaving a host
//! out would under-report.

use std::net::SocketAddr;

/// The `/metrics` text of the host whose API listens on `api`.
///
/// # Errors
/// When the host does not answer, answers another status than 200, or its
/// body cannot be read: the message names the address.
pub async fn metrics(api: SocketAddr) -> Result<String, String> {
    let url = format!("http://{api}/metrics");
    let failed = |why: String| format!("failed to read the metrics of the host at {api} ({url}): {why}");
    let response = reqwest::get(&url).await.map_err(|error| failed(error.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        return Err(failed(format!("it answered {status}")));
    }
    response.text().await.map_err(|error| failed(error.to_string()))
}

/// The samples of the metric family `family` in `text`: each line's name
/// with its labels (`name{…}`, `name_bucket{…}`, `name_sum`…) and value.
///
/// # Errors
/// A sample of the family whose value is not a number, naming the line.
pub fn samples<'a>(text: &'a str, family: &str) -> Result<Vec<(&'a str, f64)>, String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(family) else { continue };
        if !(rest.starts_with([' ', '{']) || rest.starts_with('_')) {
            continue;
        }
        let sample = line.rsplit_once(' ').and_then(|(name, value)| Some((name, value.parse::<f64>().ok()?)));
        found.push(sample.ok_or_else(|| format!("{family}: a sample that is not `NAME VALUE`: {line:?}"))?);
    }
    Ok(found)
}

/// The sum of every sample of `family` on every host in `apis`.
///
/// # Errors
/// When a host's metrics cannot be read or hold a malformed sample.
pub async fn total(apis: &[SocketAddr], family: &str) -> Result<f64, String> {
    let mut total = 0.0;
    for api in apis {
        let text = metrics(*api).await?;
        total += samples(&text, family)?.iter().map(|(_, value)| value).sum::<f64>();
    }
    Ok(total)
}

/// A histogram of every host, added up: bucket bounds (s) with their
/// cumulative counts, the sum (s) and the count.
#[derive(Default)]
pub struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    /// Samples recorded.
    pub count: f64,
}

impl Histogram {
    /// What was recorded after `before` was read.
    pub fn minus(&self, before: &Histogram) -> Histogram {
        let buckets = self
            .buckets
            .iter()
            .map(|(le, n)| (*le, n - before.buckets.iter().find(|(b, _)| b == le).map_or(0.0, |(_, m)| *m)))
            .collect();
        Histogram { buckets, sum: self.sum - before.sum, count: self.count - before.count }
    }

    /// The mean, in ms.
    pub fn mean_ms(&self) -> f64 {
        if self.count > 0.0 { self.sum / self.count * 1000.0 } else { 0.0 }
    }

    /// The upper bound of the bucket holding quantile `q`, in ms.
    pub fn quantile_le_ms(&self, q: f64) -> Option<f64> {
        let target = self.count * q;
        let mut buckets = self.buckets.clone();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        buckets.into_iter().find(|(_, n)| *n >= target).map(|(le, _)| le * 1000.0)
    }

    /// [`Self::quantile_le_ms`] as a field's value (`-` for none).
    pub fn quantile_field(&self, q: f64) -> String {
        self.quantile_le_ms(q).map_or("-".to_owned(), |ms| format!("{ms}"))
    }
}

/// The histogram `family` of the hosts at `apis`, added up.
///
/// # Errors
/// When a host's metrics cannot be read or hold a malformed sample.
pub async fn histogram(apis: &[SocketAddr], family: &str) -> Result<Histogram, String> {
    let mut total = Histogram::default();
    for api in apis {
        let text = metrics(*api).await?;
        for (name, value) in samples(&text, family)? {
            if name.starts_with(&format!("{family}_sum")) {
                total.sum += value;
            } else if name.starts_with(&format!("{family}_count")) {
                total.count += value;
            } else if let Some(le) = name.split("le=\"").nth(1).and_then(|rest| rest.split('"').next()) {
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::INFINITY) };
                match total.buckets.iter_mut().find(|(b, _)| *b == le) {
                    Some((_, n)) => *n += value,
                    None => total.buckets.push((le, value)),
                }
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_host_that_does_not_answer_or_serves_no_metrics_fails_the_total() {
        let serving = pulse_testkit::HttpServer::start();
        serving.set(
            "/metrics",
            b"# TYPE pulse_moved_jobs_total counter\npulse_moved_jobs_total{pool=\"p\"} 3\n",
        );
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let no_metrics = pulse_testkit::HttpServer::start();
        assert_eq!(total(&[serving.address(), serving.address()], "pulse_moved_jobs_total").await, Ok(6.0));
        let error = total(&[serving.address(), dead], "pulse_moved_jobs_total").await.unwrap_err();
        assert!(error.contains(&dead.to_string()) && error.contains("failed to read the metrics"), "{error}");
        let error = total(&[no_metrics.address()], "pulse_moved_jobs_total").await.unwrap_err();
        assert!(error.contains(&no_metrics.address().to_string()) && error.contains("404"), "{error}");
    }

    #[test]
    fn samples_of_a_family_are_read_and_a_malformed_one_is_refused() {
        let text = "# HELP x\npulse_x_total{a=\"1\"} 2\npulse_x_total 3.5\npulse_x_totally 9\n\
                    pulse_h_bucket{le=\"0.1\"} 4\npulse_h_sum 0.25\npulse_h_count 4\n";
        let values = |family| samples(text, family).unwrap().into_iter().map(|(_, v)| v).collect::<Vec<_>>();
        assert_eq!(values("pulse_x_total"), [2.0, 3.5]);
        assert_eq!(values("pulse_h"), [4.0, 0.25, 4.0]);
        let error = samples("pulse_x_total{a=\"1\"} many\n", "pulse_x_total").unwrap_err();
        assert!(error.contains("many"), "{error}");
    }
}
