//! `Etcd`: the cluster's one way to talk to etcd. Every key lives under a cluster
//! prefix; every operation is retried with bounded exponential backoff; and since the
//! `etcd-client` crate keeps sending to a dead member, a retryable failure makes the
//! wrapper probe each configured endpoint (`status()` under a short timeout) and
//! reconnect to the healthy ones only (docs/design/cluster.md, "Coordination (etcd)").

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, DeleteOptions, DeleteResponse, GetOptions, GetResponse,
    LeaseGrantResponse, PutOptions, PutResponse, Txn, TxnResponse, WatchOptions, WatchStream,
};
use tokio::task::JoinSet;

use super::CoordError;

/// How the wrapper times, retries and probes its operations.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Limit on one attempt of one unary operation (not on a campaign, which waits
    /// for leadership, nor on a watch's lifetime).
    pub operation_timeout: Duration,
    /// Limit on one endpoint's health probe (`status()`), and on connecting to it.
    pub health_timeout: Duration,
    /// Attempts per operation, the first included (at least 1).
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubled before each later one.
    pub initial_backoff: Duration,
    /// Upper bound on one backoff.
    pub max_backoff: Duration,
    /// This side's etcd client certificate and the etcd authority (endpoints are then
    /// `https://`); `None`: plaintext, which only loopback endpoints accept.
    pub tls: Option<Arc<crate::tls::TlsFiles>>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            operation_timeout: Duration::from_secs(2),
            health_timeout: Duration::from_millis(500),
            max_attempts: 8,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            tls: None,
        }
    }
}

/// The connected client and the endpoints it was built over.
#[derive(Clone)]
struct Connection {
    client: Client,
    endpoints: Vec<String>,
    /// Bumped by every reconnection, so that tasks failing on the same connection
    /// trigger one health probe, not one each.
    generation: u64,
}

struct Shared {
    all_endpoints: Vec<String>,
    prefix: String,
    options: EtcdOptions,
    connection: Mutex<Connection>,
    /// Held while probing endpoints: one probe at a time.
    probing: tokio::sync::Mutex<()>,
}

/// A cluster's handle on etcd: cheap to clone, shared by every task of a node.
#[derive(Clone)]
pub struct Etcd {
    shared: Arc<Shared>,
}

/// Whether an etcd error may go away on another attempt or another endpoint:
/// transport failures, timeouts, and the statuses etcd returns while a member is down,
/// has no leader or is electing one.
fn is_retryable(error: &etcd_client::Error) -> bool {
    use tonic::Code;
    match error {
        etcd_client::Error::TransportError(_)
        | etcd_client::Error::IoError(_)
        | etcd_client::Error::WatchError(_)
        | etcd_client::Error::LeaseKeepAliveError(_) => true,
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Unknown
                | Code::Aborted
                | Code::Cancelled
                | Code::Internal
        ),
        _ => false,
    }
}

impl Etcd {
    /// Connects to the healthy ones among `endpoints` (`http://host:port`), with every
    /// key under `prefix` (a `/` is appended when missing). Fails with
    /// `CoordError::Unavailable` when no endpoint answers.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        options: EtcdOptions,
    ) -> Result<Self, CoordError> {
        if endpoints.is_empty() {
            return Err(CoordError::Config("no etcd endpoints given".into()));
        }
        if options.tls.is_none() {
            if let Some(endpoint) = endpoints.iter().find(|e| !endpoint_is_loopback(e)) {
                return Err(CoordError::Config(format!(
                    "etcd at {endpoint} without TLS: plaintext is only for loopback endpoints; \
                     give the etcd certificates (--tls DIR)"
                )));
            }
        }
        let mut prefix = prefix.to_string();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let healthy = probe(endpoints, &options).await;
        if healthy.is_empty() {
            return Err(CoordError::Unavailable {
                operation: "connect".into(),
                endpoints: endpoints.to_vec(),
                last_error: "no endpoint answered a status request".into(),
            });
        }
        let client =
            client_over(&healthy, &options)
                .await
                .map_err(|e| CoordError::Unavailable {
                    operation: "connect".into(),
                    endpoints: endpoints.to_vec(),
                    last_error: e.to_string(),
                })?;
        Ok(Self {
            shared: Arc::new(Shared {
                all_endpoints: endpoints.to_vec(),
                prefix,
                options,
                connection: Mutex::new(Connection {
                    client,
                    endpoints: healthy,
                    generation: 0,
                }),
                probing: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The cluster prefix, ending in `/`.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// `prefix + relative`: the absolute key.
    pub fn key(&self, relative: &str) -> String {
        format!("{}{}", self.shared.prefix, relative)
    }

    /// Every configured endpoint.
    pub fn endpoints(&self) -> &[String] {
        &self.shared.all_endpoints
    }

    /// The endpoints the client currently sends to (those healthy at the last probe).
    pub fn connected_endpoints(&self) -> Vec<String> {
        self.connection().endpoints
    }

    pub fn options(&self) -> &EtcdOptions {
        &self.shared.options
    }

    fn connection(&self) -> Connection {
        match self.shared.connection.lock() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Probes every configured endpoint and reconnects to the healthy ones, unless
    /// another task already reconnected since `seen_generation`. When none is healthy
    /// the connection is left as it was (the next attempt fails and backs off).
    async fn refresh(&self, seen_generation: u64) {
        let _probing = self.shared.probing.lock().await;
        if self.connection().generation != seen_generation {
            return;
        }
        let healthy = probe(&self.shared.all_endpoints, &self.shared.options).await;
        if healthy.is_empty() {
            tracing::warn!(endpoints = ?self.shared.all_endpoints, "no etcd endpoint is healthy");
            return;
        }
        match client_over(&healthy, &self.shared.options).await {
            Ok(client) => {
                tracing::info!(endpoints = ?healthy, "etcd: reconnected to the healthy endpoints");
                let mut connection = match self.shared.connection.lock() {
                    Ok(c) => c,
                    Err(poisoned) => poisoned.into_inner(),
                };
                connection.client = client;
                connection.endpoints = healthy;
                connection.generation += 1;
            }
            Err(error) => tracing::warn!(%error, "etcd: reconnecting failed"),
        }
    }

    /// Runs `attempt` until it succeeds, fails permanently, or `max_attempts` are
    /// spent; each attempt under `timeout` when one is given. A retryable failure
    /// triggers an endpoint probe and a backoff before the next attempt.
    pub async fn retry<T, F, Fut>(
        &self,
        operation: &str,
        timeout: Option<Duration>,
        mut attempt: F,
    ) -> Result<T, CoordError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let options = &self.shared.options;
        let mut backoff = options.initial_backoff;
        let mut last_error = String::new();
        for attempt_number in 0..options.max_attempts.max(1) {
            if attempt_number > 0 {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(options.max_backoff);
            }
            let connection = self.connection();
            let result = match timeout {
                Some(limit) => {
                    match tokio::time::timeout(limit, attempt(connection.client)).await {
                        Ok(result) => result,
                        Err(_) => {
                            last_error = format!("timed out after {limit:?}");
                            tracing::debug!(operation, attempt_number, "etcd attempt timed out");
                            self.refresh(connection.generation).await;
                            continue;
                        }
                    }
                }
                None => attempt(connection.client).await,
            };
            match result {
                Ok(value) => return Ok(value),
                Err(error) if is_retryable(&error) => {
                    tracing::debug!(operation, attempt_number, %error, "etcd attempt failed");
                    last_error = error.to_string();
                    self.refresh(connection.generation).await;
                }
                Err(error) => {
                    return Err(CoordError::Etcd {
                        operation: operation.to_string(),
                        endpoints: connection.endpoints,
                        source: error,
                    })
                }
            }
        }
        Err(CoordError::Unavailable {
            operation: operation.to_string(),
            endpoints: self.shared.all_endpoints.clone(),
            last_error,
        })
    }

    fn unary_timeout(&self) -> Option<Duration> {
        Some(self.shared.options.operation_timeout)
    }

    /// The value of `prefix + key`, if present.
    pub async fn get(&self, key: &str) -> Result<GetResponse, CoordError> {
        let key = self.key(key);
        self.retry("get", self.unary_timeout(), |mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })
        .await
    }

    /// Every key under `prefix + key_prefix`.
    pub async fn get_prefix(&self, key_prefix: &str) -> Result<GetResponse, CoordError> {
        let key = self.key(key_prefix);
        self.retry("get_prefix", self.unary_timeout(), |mut c| {
            let key = key.clone();
            async move { c.get(key, Some(GetOptions::new().with_prefix())).await }
        })
        .await
    }

    /// Puts `value` at `prefix + key`, attached to `lease` when given.
    pub async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<i64>,
    ) -> Result<PutResponse, CoordError> {
        let key = self.key(key);
        self.retry("put", self.unary_timeout(), |mut c| {
            let (key, value) = (key.clone(), value.clone());
            let options = lease.map(|id| PutOptions::new().with_lease(id));
            async move { c.put(key, value, options).await }
        })
        .await
    }

    /// Deletes `prefix + key`.
    pub async fn delete(&self, key: &str) -> Result<DeleteResponse, CoordError> {
        let key = self.key(key);
        self.retry("delete", self.unary_timeout(), |mut c| {
            let key = key.clone();
            async move { c.delete(key, None::<DeleteOptions>).await }
        })
        .await
    }

    /// Runs a transaction built by `build` (with absolute keys: use [`Etcd::key`]).
    /// `build` is called once per attempt. A transaction whose attempt timed out may
    /// have been applied; callers keep their transactions safe to repeat.
    pub async fn txn(&self, build: impl Fn() -> Txn) -> Result<TxnResponse, CoordError> {
        self.retry("txn", self.unary_timeout(), |mut c| {
            let txn = build();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Grants a lease of `ttl` seconds.
    pub async fn lease_grant(&self, ttl: i64) -> Result<LeaseGrantResponse, CoordError> {
        self.retry("lease_grant", self.unary_timeout(), |mut c| async move {
            c.lease_grant(ttl, None).await
        })
        .await
    }

    /// Revokes `lease`: every key attached to it is deleted at once.
    pub async fn lease_revoke(&self, lease: i64) -> Result<(), CoordError> {
        self.retry("lease_revoke", self.unary_timeout(), |mut c| async move {
            c.lease_revoke(lease).await.map(|_| ())
        })
        .await
    }

    /// One keepalive round trip for `lease`, each attempt limited to
    /// `attempt_timeout` (shorter than the operation timeout: a keepalive must get
    /// past a frozen endpoint well within the lease's TTL). Returns the lease's
    /// remaining TTL in seconds, 0 when etcd no longer knows the lease.
    pub async fn lease_keep_alive_once(
        &self,
        lease: i64,
        attempt_timeout: Duration,
    ) -> Result<i64, CoordError> {
        self.retry(
            "lease_keep_alive",
            Some(attempt_timeout),
            |mut c| async move {
                let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                match stream.message().await? {
                    Some(response) => Ok(response.ttl()),
                    None => Err(etcd_client::Error::LeaseKeepAliveError(
                        "keepalive stream closed without an answer".into(),
                    )),
                }
            },
        )
        .await
    }

    /// Opens a watch on `prefix + key` (a prefix watch when `options` says so). Only
    /// opening is retried: a stream that fails later is the caller's to reopen.
    pub async fn watch(&self, key: &str, options: WatchOptions) -> Result<WatchStream, CoordError> {
        let key = self.key(key);
        self.retry("watch", self.unary_timeout(), |mut c| {
            let (key, options) = (key.clone(), options.clone());
            async move { c.watch(key, Some(options)).await }
        })
        .await
    }
}

/// Connect options shared by probes and the main client: HTTP/2 keepalive so that a
/// stream to a member that vanished without closing its sockets fails, and
/// `require_leader` so that a member cut off from quorum refuses at once.
pub(super) fn connect_options(options: &EtcdOptions) -> ConnectOptions {
    let connect = ConnectOptions::new()
        .with_connect_timeout(options.health_timeout)
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    match &options.tls {
        None => connect,
        Some(files) => connect.with_tls(
            etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(&files.ca))
                .identity(etcd_client::Identity::from_pem(&files.cert, &files.key)),
        ),
    }
}

/// Whether an endpoint (`scheme://host:port` or `host:port`) is on loopback.
fn endpoint_is_loopback(endpoint: &str) -> bool {
    let host = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    crate::rpc::transport::is_loopback(host.trim_end_matches('/'))
}

async fn client_over(
    endpoints: &[String],
    options: &EtcdOptions,
) -> Result<Client, etcd_client::Error> {
    Client::connect(endpoints, Some(connect_options(options))).await
}

/// The endpoints that answer `status()` within the health timeout and know a raft
/// leader, in configuration order.
async fn probe(endpoints: &[String], options: &EtcdOptions) -> Vec<String> {
    let mut probes = JoinSet::new();
    for (index, endpoint) in endpoints.iter().enumerate() {
        let endpoint = endpoint.clone();
        let options = options.clone();
        probes.spawn(async move {
            let answer = tokio::time::timeout(options.health_timeout, async {
                let mut client = client_over(std::slice::from_ref(&endpoint), &options).await?;
                client.status().await
            })
            .await;
            let healthy = matches!(answer, Ok(Ok(ref status)) if status.leader() != 0);
            (index, healthy)
        });
    }
    let mut healthy = vec![false; endpoints.len()];
    while let Some(result) = probes.join_next().await {
        if let Ok((index, true)) = result {
            healthy[index] = true;
        }
    }
    endpoints
        .iter()
        .zip(healthy)
        .filter(|(_, ok)| *ok)
        .map(|(endpoint, _)| endpoint.clone())
        .collect()
}
