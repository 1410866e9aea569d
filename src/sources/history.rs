//! nightshift's own history read back from the platform's Prometheus: range queries over the
//! series nightshift exports, for the parts that rebuild their memory after a restart (the
//! researchers' view, the scaler's daily forecasts).
//!
//! Every answer is checked: an answer that is not a matrix, or a value that is not a finite,
//! non-negative number at a finite time, is an error naming the query, never a silently
//! shortened history. Callers bound the time ([`HistoryError::Timeout`] is theirs to return).

use std::{collections::BTreeMap, time::Duration};

use prometheus_http_query::{Client, response::Data};

use super::prometheus::{Auth, Server, build_client};

/// One series of a range answer: its labels and (Unix second, value) pairs.
pub type Series = (BTreeMap<String, String>, Vec<(i64, f64)>);

/// Why a history could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("cannot query Prometheus at {address}: {detail}")]
    Client { address: String, detail: String },
    #[error("Prometheus at {address} did not answer within {after:?}")]
    Timeout { address: String, after: Duration },
    #[error("Prometheus at {address} failed the query {query:?}: {source}")]
    Query {
        address: String,
        query: String,
        #[source]
        source: prometheus_http_query::Error,
    },
    #[error("Prometheus at {address} answered the range query {query:?} with no matrix")]
    NotMatrix { address: String, query: String },
    #[error(
        "Prometheus at {address} answered an unusable value for {query:?} at {at}: {value} \
         (GPU counts, demand and replicas are finite and not negative)"
    )]
    Unusable {
        address: String,
        query: String,
        at: f64,
        value: f64,
    },
}

/// Range queries to one Prometheus (no credentials: nightshift's own series live in the
/// platform's Prometheus, whose address only the platform configures).
pub struct HistoryReader {
    client: Client,
    address: String,
}

impl HistoryReader {
    /// A reader of the Prometheus at `address`, each request bounded by `timeout`.
    pub fn new(address: &str, timeout: Duration) -> Result<HistoryReader, HistoryError> {
        let server = Server {
            address: address.to_string(),
            auth: Auth::None,
            headers: Vec::new(),
            ca_cert: None,
            unsafe_ssl: false,
            timeout,
        };
        let client = build_client(&server).map_err(|e| HistoryError::Client {
            address: address.to_string(),
            detail: e.to_string(),
        })?;
        Ok(HistoryReader {
            client,
            address: address.to_string(),
        })
    }

    /// The Prometheus this reader queries.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// A range query from `start` to `end` (Unix seconds) every `step` seconds: every series
    /// with its checked values.
    pub async fn range(
        &self,
        query: &str,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<Vec<Series>, HistoryError> {
        let answer = self
            .client
            .query_range(query, start, end, step as f64)
            .get()
            .await
            .map_err(|source| HistoryError::Query {
                address: self.address.clone(),
                query: query.to_string(),
                source,
            })?;
        let Data::Matrix(matrix) = answer.into_inner().0 else {
            return Err(HistoryError::NotMatrix {
                address: self.address.clone(),
                query: query.to_string(),
            });
        };
        let mut out = Vec::with_capacity(matrix.len());
        for series in matrix {
            let (labels, samples) = series.into_inner();
            let mut values = Vec::with_capacity(samples.len());
            for s in samples {
                let (at, value) = (s.timestamp(), s.value());
                if !(value.is_finite() && value >= 0.0 && at.is_finite()) {
                    return Err(HistoryError::Unusable {
                        address: self.address.clone(),
                        query: query.to_string(),
                        at,
                        value,
                    });
                }
                values.push((at.round() as i64, value));
            }
            out.push((labels.into_iter().collect(), values));
        }
        Ok(out)
    }
}
