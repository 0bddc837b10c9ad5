//! The requesting side: [`NodeClient`], one connection to one node, with one `Exchange`
//! stream that carries every lookup and acknowledgement to that node. Calls on one
//! client run concurrently: each takes a request id, parks a oneshot sender in the
//! pending map under it, and sends its message; the stream's reader task hands each
//! response to the sender its id names. When the stream ends or breaks, the reader
//! fails every pending call with `ConnectionLost`, and so does every later call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

use super::proto::{
    self, client_message, node_client, server_message, ClientMessage, ServerMessage,
};
use super::server::{CONNECTION_WINDOW_BYTES, STREAM_WINDOW_BYTES};
use super::transport::Transport;
use super::{
    codec, Answer, GetAnswer, NodeStats, RpcError, MAX_ENTRIES_PER_ACK,
    MAX_FINGERPRINTS_PER_MESSAGE, MAX_MESSAGE_BYTES,
};

/// How long `connect` tries before it fails `Connect` (a host that drops SYNs would
/// otherwise hold it for TCP's two minutes).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 pings while connected: a node that vanishes without closing its socket (a
/// lost host, a partition) fails the calls in flight within about 10 s instead of
/// leaving them waiting on TCP. A lookup waiting on a lock is not affected: the
/// node's HTTP/2 layer answers pings while its handler waits.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Requests queued for the stream's sender before a call waits for room.
const REQUESTS_BUFFERED: usize = 256;

/// This client's counters since it connected: the paper's equation (1) needs messages
/// per node per request (the caller counts requests) and fingerprints per message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub lookup_messages_sent: u64,
    pub lookup_fingerprints_sent: u64,
    pub ack_messages_sent: u64,
    pub ack_entries_sent: u64,
    /// Every response received on the stream (lookup answers, ack answers, failures).
    pub stream_messages_received: u64,
    pub get_messages_sent: u64,
    pub get_fingerprints_sent: u64,
}

impl ClientStats {
    /// Mean fingerprints per lookup message (0 before the first).
    pub fn fingerprints_per_lookup_message(&self) -> f64 {
        if self.lookup_messages_sent == 0 {
            0.0
        } else {
            self.lookup_fingerprints_sent as f64 / self.lookup_messages_sent as f64
        }
    }
}

#[derive(Default)]
struct Counters {
    lookup_messages_sent: AtomicU64,
    lookup_fingerprints_sent: AtomicU64,
    ack_messages_sent: AtomicU64,
    ack_entries_sent: AtomicU64,
    stream_messages_received: AtomicU64,
    get_messages_sent: AtomicU64,
    get_fingerprints_sent: AtomicU64,
}

fn bump(counter: &AtomicU64, by: usize) {
    counter.fetch_add(by as u64, Ordering::Relaxed);
}

/// The calls waiting for their response, by request id. Invariant: once `closed` is
/// set, `waiting` is empty and stays empty, so no call waits on a dead stream.
#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<server_message::Body>>,
    closed: Option<String>,
}

/// Shared by the client and its stream's reader task.
struct Shared {
    addr: String,
    pending: Mutex<Pending>,
    counters: Counters,
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        // A poisoned lock means a panic while holding it; the map itself stays
        // consistent (each operation is one insert or remove).
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lost(&self, reason: &str) -> RpcError {
        RpcError::ConnectionLost {
            addr: self.addr.clone(),
            reason: reason.to_string(),
        }
    }

    /// Marks the stream dead and fails every waiting call (their senders drop).
    fn close(&self, reason: String) {
        let mut pending = self.pending();
        pending.waiting.clear();
        pending.closed.get_or_insert(reason);
    }
}

/// The unary client of the node at `addr` (node `node`, when known), connected over
/// `transport`.
async fn unary(
    addr: &str,
    node: Option<u16>,
    transport: &Transport,
) -> Result<node_client::NodeClient<Channel>, RpcError> {
    let channel = transport
        .endpoint(addr, node)?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(|source| RpcError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    Ok(node_client::NodeClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// A client's connection to a node for jobs and counters only (no lookup stream,
/// which a node's port keeps for nodes).
pub struct JobClient {
    addr: String,
    unary: node_client::NodeClient<Channel>,
}

impl JobClient {
    /// Connects to the node at `addr` over `transport`.
    pub async fn connect(addr: &str, transport: &Transport) -> Result<Self, RpcError> {
        Ok(JobClient {
            addr: addr.to_string(),
            unary: unary(addr, None, transport).await?,
        })
    }

    /// Has the node run `job` and returns its JSON summary; waits as long as the job
    /// runs (a backup of many gigabytes takes minutes).
    pub async fn job(&self, job: &super::Job) -> Result<String, RpcError> {
        let (kind, args) = job.encode();
        let resp = self
            .unary
            .clone()
            .job(proto::JobRequest { kind, args })
            .await
            .map_err(|status| unary_failed(&self.addr, status))?;
        Ok(resp.into_inner().json)
    }

    /// The node's counters.
    pub async fn node_stats(&self) -> Result<NodeStats, RpcError> {
        let resp = self
            .unary
            .clone()
            .stats(proto::StatsRequest {})
            .await
            .map_err(|status| unary_failed(&self.addr, status))?;
        Ok(resp.into_inner().into())
    }
}

/// A unary call's failure: permission denied, or the status as it came.
fn unary_failed(addr: &str, status: tonic::Status) -> RpcError {
    match status.code() {
        tonic::Code::PermissionDenied => RpcError::PermissionDenied(status.message().into()),
        _ => RpcError::Status {
            addr: addr.to_string(),
            status: Box::new(status),
        },
    }
}

/// A connection to one node's lookup service.
pub struct NodeClient {
    shared: Arc<Shared>,
    from_node: u16,
    next_id: AtomicU64,
    outbound: mpsc::Sender<ClientMessage>,
    unary: node_client::NodeClient<Channel>,
    reader: JoinHandle<()>,
}

impl NodeClient {
    /// Connects to the node at `addr` (`host:port`) in plaintext (loopback only) and
    /// opens the lookup stream; the node answers requests as coming from node
    /// `from_node`.
    pub async fn connect(addr: &str, from_node: u16) -> Result<Self, RpcError> {
        Self::connect_with(addr, from_node, &Transport::Plaintext).await
    }

    /// Connects to the node at `addr` over `transport` and opens the lookup stream;
    /// under TLS the node takes requests only from node `from_node`'s certificate.
    pub async fn connect_with(
        addr: &str,
        from_node: u16,
        transport: &Transport,
    ) -> Result<Self, RpcError> {
        Self::connect_to(addr, None, from_node, transport).await
    }

    /// As `connect_with`, and under TLS the server's certificate must name node
    /// `node` (`None`: it must be for `addr`).
    pub async fn connect_to(
        addr: &str,
        node: Option<u16>,
        from_node: u16,
        transport: &Transport,
    ) -> Result<Self, RpcError> {
        super::node_id(u32::from(from_node))?;
        let mut grpc = unary(addr, node, transport).await?;
        let (outbound, rx) = mpsc::channel(REQUESTS_BUFFERED);
        let shared = Arc::new(Shared {
            addr: addr.to_string(),
            pending: Mutex::default(),
            counters: Counters::default(),
        });
        let inbound = grpc
            .exchange(ReceiverStream::new(rx))
            .await
            .map_err(|status| match status.code() {
                tonic::Code::PermissionDenied => {
                    RpcError::PermissionDenied(status.message().into())
                }
                _ => shared.lost(&format!("opening the lookup stream: {status}")),
            })?
            .into_inner();
        let reader = tokio::spawn(read_responses(shared.clone(), inbound));
        Ok(NodeClient {
            shared,
            from_node,
            next_id: AtomicU64::new(1),
            outbound,
            unary: grpc,
            reader,
        })
    }

    /// The node's address, as given to `connect`.
    pub fn addr(&self) -> &str {
        &self.shared.addr
    }

    /// Whether the lookup stream has ended: every call now fails with
    /// `ConnectionLost`, and the caller connects a new client (a client never
    /// reconnects by itself, so that a retry goes through the partition map).
    pub fn is_closed(&self) -> bool {
        self.shared.pending().closed.is_some()
    }

    /// One lookup message with all of `fps`; their answers, in order. Waits while the
    /// owner holds a fingerprint locked for another requester.
    pub async fn lookup(&self, fps: &[Fingerprint]) -> Result<Vec<Answer>, RpcError> {
        if fps.len() > MAX_FINGERPRINTS_PER_MESSAGE {
            return Err(RpcError::TooLarge {
                count: fps.len(),
                max: MAX_FINGERPRINTS_PER_MESSAGE,
            });
        }
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let message = client_message::Body::Lookup(proto::LookupRequest {
            request_id,
            from_node: u32::from(self.from_node),
            fingerprints: codec::pack_fingerprints(fps),
        });
        let counters = &self.shared.counters;
        match self
            .call(request_id, message, || {
                bump(&counters.lookup_messages_sent, 1);
                bump(&counters.lookup_fingerprints_sent, fps.len());
            })
            .await?
        {
            server_message::Body::Lookup(resp) => {
                codec::unpack_answers(fps.len(), &resp.kinds, &resp.locations)
            }
            other => Err(self.refused_or_mismatch(other, "lookup")),
        }
    }

    /// One acknowledgement message: `entries` (fingerprints answered `New` to this
    /// node, with where it stored them) are durable at the owner when this returns.
    pub async fn ack(&self, entries: &[(Fingerprint, ChunkLocation)]) -> Result<(), RpcError> {
        if entries.len() > MAX_ENTRIES_PER_ACK {
            return Err(RpcError::TooLarge {
                count: entries.len(),
                max: MAX_ENTRIES_PER_ACK,
            });
        }
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let message = client_message::Body::Ack(proto::Ack {
            request_id,
            from_node: u32::from(self.from_node),
            entries: codec::pack_entries(entries),
        });
        let counters = &self.shared.counters;
        match self
            .call(request_id, message, || {
                bump(&counters.ack_messages_sent, 1);
                bump(&counters.ack_entries_sent, entries.len());
            })
            .await?
        {
            server_message::Body::Ack(_) => Ok(()),
            other => Err(self.refused_or_mismatch(other, "ack")),
        }
    }

    /// Locations of `fps` for restore (unary, no locking), in order.
    pub async fn get(&self, fps: &[Fingerprint]) -> Result<Vec<GetAnswer>, RpcError> {
        if fps.len() > MAX_FINGERPRINTS_PER_MESSAGE {
            return Err(RpcError::TooLarge {
                count: fps.len(),
                max: MAX_FINGERPRINTS_PER_MESSAGE,
            });
        }
        bump(&self.shared.counters.get_messages_sent, 1);
        bump(&self.shared.counters.get_fingerprints_sent, fps.len());
        let resp = self
            .unary
            .clone()
            .get(proto::GetRequest {
                fingerprints: codec::pack_fingerprints(fps),
            })
            .await
            .map_err(|status| self.status(status))?
            .into_inner();
        codec::unpack_get_answers(fps.len(), &resp.kinds, &resp.locations)
    }

    /// The node's counters.
    pub async fn node_stats(&self) -> Result<NodeStats, RpcError> {
        let resp = self
            .unary
            .clone()
            .stats(proto::StatsRequest {})
            .await
            .map_err(|status| self.status(status))?;
        Ok(resp.into_inner().into())
    }

    /// This client's own counters.
    pub fn stats(&self) -> ClientStats {
        let c = &self.shared.counters;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ClientStats {
            lookup_messages_sent: get(&c.lookup_messages_sent),
            lookup_fingerprints_sent: get(&c.lookup_fingerprints_sent),
            ack_messages_sent: get(&c.ack_messages_sent),
            ack_entries_sent: get(&c.ack_entries_sent),
            stream_messages_received: get(&c.stream_messages_received),
            get_messages_sent: get(&c.get_messages_sent),
            get_fingerprints_sent: get(&c.get_fingerprints_sent),
        }
    }

    /// Sends `body` on the stream under `request_id` and waits for its response;
    /// `count` runs once the message is queued for sending.
    async fn call(
        &self,
        request_id: u64,
        body: client_message::Body,
        count: impl FnOnce(),
    ) -> Result<server_message::Body, RpcError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.shared.pending();
            if let Some(reason) = &pending.closed {
                return Err(self.shared.lost(reason));
            }
            pending.waiting.insert(request_id, tx);
        }
        // If this call is dropped from here on, its entry stays until its response
        // comes (then the send to the dropped receiver fails) or the stream closes.
        if self
            .outbound
            .send(ClientMessage { body: Some(body) })
            .await
            .is_err()
        {
            self.shared.pending().waiting.remove(&request_id);
            return Err(self.shared.lost("the lookup stream's sender stopped"));
        }
        count();
        rx.await.map_err(|_| {
            let reason = self.shared.pending().closed.clone();
            self.shared
                .lost(reason.as_deref().unwrap_or("the lookup stream ended"))
        })
    }

    fn refused_or_mismatch(&self, body: server_message::Body, asked: &str) -> RpcError {
        match body {
            server_message::Body::Failed(f) => RpcError::Refused {
                addr: self.shared.addr.clone(),
                message: f.message,
                retryable: f.retryable,
            },
            server_message::Body::Lookup(_) | server_message::Body::Ack(_) => RpcError::Malformed {
                what: "stream response",
                reason: format!("the node answered a {asked} with another kind of response"),
            },
        }
    }

    fn status(&self, status: tonic::Status) -> RpcError {
        if status.code() == tonic::Code::Unavailable {
            return self.shared.lost(&status.to_string());
        }
        unary_failed(&self.shared.addr, status)
    }
}

impl Drop for NodeClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The stream's reader: hands each response to its waiting call; on the stream's end
/// fails every call still waiting.
async fn read_responses(shared: Arc<Shared>, mut inbound: Streaming<ServerMessage>) {
    let reason = loop {
        match inbound.message().await {
            Ok(Some(ServerMessage { body: Some(body) })) => {
                bump(&shared.counters.stream_messages_received, 1);
                let id = match &body {
                    server_message::Body::Lookup(r) => r.request_id,
                    server_message::Body::Ack(r) => r.request_id,
                    server_message::Body::Failed(r) => r.request_id,
                };
                let waiter = shared.pending().waiting.remove(&id);
                match waiter {
                    // A failed send means the call was dropped; nothing waits.
                    Some(tx) => {
                        let _ = tx.send(body);
                    }
                    None => {
                        tracing::warn!(id, addr = %shared.addr, "response to no pending request; ignored")
                    }
                }
            }
            Ok(Some(ServerMessage { body: None })) => {
                tracing::warn!(addr = %shared.addr, "a response without a body; ignored");
            }
            Ok(None) => break "the node ended the lookup stream".to_string(),
            Err(status) => break format!("{status}"),
        }
    };
    tracing::debug!(addr = %shared.addr, %reason, "lookup stream closed");
    shared.close(reason);
}
