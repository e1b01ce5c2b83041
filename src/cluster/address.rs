//! Which cluster a session uses: a Ballista scheduler's address (`df://HOST:PORT`) and how long
//! one job may take; and whether it can be reached, checked before any debit.

use std::fmt;

use datafusion::common::{Result, plan_err};

/// Where a session's partial aggregation runs: a Ballista scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// `http://HOST:PORT`, as Ballista's client connects.
    pub(super) scheduler_url: String,
    /// What the user gave (`df://HOST:PORT[?job_timeout=SECS]`).
    display: String,
    /// How long a job may take on the cluster, submission to last partial state.
    pub(super) job_timeout: std::time::Duration,
}

/// Default of `job_timeout`: an hour.
const DEFAULT_JOB_TIMEOUT_SECS: u64 = 3600;

impl Cluster {
    /// Parses `df://HOST:PORT` (the form Ballista's clients use), optionally followed by
    /// `?job_timeout=SECS`: a job that has not finished after SECS seconds (default 3600) fails
    /// the query. Ballista waits for executors to come back when all are lost; the timeout is
    /// what ends such a query.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let form = || format!("a cluster is given as df://HOST:PORT[?job_timeout=SECS], got '{url}'");
        let rest = url.strip_prefix("df://").ok_or_else(form)?;
        let (address, params) = match rest.split_once('?') {
            Some((a, p)) => (a, Some(p)),
            None => (rest, None),
        };
        let (host, port) = address.rsplit_once(':').ok_or_else(form)?;
        if host.is_empty() || port.parse::<u16>().is_err() || address.contains('/') {
            return Err(form());
        }
        let mut job_timeout = DEFAULT_JOB_TIMEOUT_SECS;
        for param in params.into_iter().flat_map(|p| p.split('&')) {
            match param.split_once('=') {
                Some(("job_timeout", v)) => {
                    job_timeout = v.parse::<u64>().ok().filter(|&s| s >= 1).ok_or_else(|| {
                        format!("job_timeout is a whole number of seconds, at least 1, got '{v}' in '{url}'")
                    })?
                }
                _ => return Err(format!("unknown cluster parameter '{param}' in '{url}' (known: job_timeout)")),
            }
        }
        Ok(Self {
            scheduler_url: format!("http://{host}:{port}"),
            display: url.to_string(),
            job_timeout: std::time::Duration::from_secs(job_timeout),
        })
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

impl Cluster {
    /// Whether the scheduler accepts connections (within 5 s). Checked while planning, before
    /// the gate debits anything: an analyst whose cluster is down is told so for free. (A
    /// cluster lost after the debit fails the query with the withheld error, and the budget
    /// stays spent: the executors may have read private rows by then.)
    pub async fn check_reachable(&self) -> Result<()> {
        let addr = self.scheduler_url.trim_start_matches("http://").to_string();
        let connect = tokio::net::TcpStream::connect(addr);
        match tokio::time::timeout(std::time::Duration::from_secs(5), connect).await {
            Ok(Ok(_)) => Ok(()),
            _ => plan_err!(
                "the cluster {} is unreachable (its scheduler does not accept connections); nothing was charged",
                self.display
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_are_df_host_port() {
        let c = Cluster::parse("df://127.0.0.1:50050").unwrap();
        assert_eq!(c.scheduler_url, "http://127.0.0.1:50050");
        assert_eq!(c.to_string(), "df://127.0.0.1:50050");
        assert_eq!(c.job_timeout.as_secs(), 3600);
        let c = Cluster::parse("df://h:1?job_timeout=15").unwrap();
        assert_eq!((c.scheduler_url.as_str(), c.job_timeout.as_secs()), ("http://h:1", 15));
        for bad in [
            "127.0.0.1:50050",
            "df://host",
            "df://:1",
            "df://h:port",
            "df://h:1/x",
            "http://h:1",
            "df://h:1?job_timeout=0",
            "df://h:1?job_timeout=1.5",
            "df://h:1?timeout=3",
        ] {
            assert!(Cluster::parse(bad).is_err(), "{bad}");
        }
    }
}
