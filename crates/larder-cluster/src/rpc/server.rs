//! The serving side: [`NodeService`] implements the generated `Node` service over a
//! [`LookupHandler`]; [`LookupServer`] runs it on a TCP listener and shuts it down.
//!
//! On an `Exchange` stream every request runs as its own task, so a lookup that waits
//! on a lock never holds up later requests on the same stream; each response is sent
//! when its task completes, carrying its request's id.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use super::proto::{self, client_message, server_message, ClientMessage, ServerMessage};
use super::transport::{check_from, Peer, Transport};
use super::{
    codec, node_id, LookupHandler, RpcError, MAX_FINGERPRINTS_PER_MESSAGE, MAX_MESSAGE_BYTES,
};

/// HTTP/2 flow-control windows of both sides: large enough that several batches of
/// thousands of fingerprints are in flight without waiting for window updates.
pub(crate) const STREAM_WINDOW_BYTES: u32 = 8 << 20;
pub(crate) const CONNECTION_WINDOW_BYTES: u32 = 32 << 20;

/// Responses buffered per stream before a slow reader holds up the request tasks.
const RESPONSES_BUFFERED: usize = 256;

/// How long `LookupServer::shutdown` waits for connections to close before it drops
/// them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A serving node's counters since it started (also the `Stats` call's answer). Rates
/// are the caller's: two snapshots and the time between them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    pub streams_opened: u64,
    pub lookup_messages_in: u64,
    pub lookup_fingerprints_in: u64,
    pub ack_messages_in: u64,
    pub ack_entries_in: u64,
    /// Every response sent on a stream: lookup answers, ack answers, failures.
    pub stream_messages_out: u64,
    pub get_messages_in: u64,
    pub get_fingerprints_in: u64,
    /// Requests answered with an error (malformed, invalid node, handler failure).
    pub failed_requests: u64,
}

#[derive(Default)]
struct Counters {
    streams_opened: AtomicU64,
    lookup_messages_in: AtomicU64,
    lookup_fingerprints_in: AtomicU64,
    ack_messages_in: AtomicU64,
    ack_entries_in: AtomicU64,
    stream_messages_out: AtomicU64,
    get_messages_in: AtomicU64,
    get_fingerprints_in: AtomicU64,
    failed_requests: AtomicU64,
}

fn bump(counter: &AtomicU64, by: usize) {
    counter.fetch_add(by as u64, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self) -> NodeStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NodeStats {
            streams_opened: get(&self.streams_opened),
            lookup_messages_in: get(&self.lookup_messages_in),
            lookup_fingerprints_in: get(&self.lookup_fingerprints_in),
            ack_messages_in: get(&self.ack_messages_in),
            ack_entries_in: get(&self.ack_entries_in),
            stream_messages_out: get(&self.stream_messages_out),
            get_messages_in: get(&self.get_messages_in),
            get_fingerprints_in: get(&self.get_fingerprints_in),
            failed_requests: get(&self.failed_requests),
        }
    }
}

impl From<NodeStats> for proto::StatsResponse {
    fn from(s: NodeStats) -> Self {
        proto::StatsResponse {
            streams_opened: s.streams_opened,
            lookup_messages_in: s.lookup_messages_in,
            lookup_fingerprints_in: s.lookup_fingerprints_in,
            ack_messages_in: s.ack_messages_in,
            ack_entries_in: s.ack_entries_in,
            stream_messages_out: s.stream_messages_out,
            get_messages_in: s.get_messages_in,
            get_fingerprints_in: s.get_fingerprints_in,
            failed_requests: s.failed_requests,
        }
    }
}

impl From<proto::StatsResponse> for NodeStats {
    fn from(s: proto::StatsResponse) -> Self {
        NodeStats {
            streams_opened: s.streams_opened,
            lookup_messages_in: s.lookup_messages_in,
            lookup_fingerprints_in: s.lookup_fingerprints_in,
            ack_messages_in: s.ack_messages_in,
            ack_entries_in: s.ack_entries_in,
            stream_messages_out: s.stream_messages_out,
            get_messages_in: s.get_messages_in,
            get_fingerprints_in: s.get_fingerprints_in,
            failed_requests: s.failed_requests,
        }
    }
}

/// The `Node` gRPC service over a handler. Cloning shares the handler, the counters
/// and the shutdown signal. Under TLS every call is checked against the peer's
/// certificate: `Exchange` and `Get` are for nodes (and each message's `from_node`
/// must be the certificate's node), `Job` for clients, `Stats` for either.
pub struct NodeService<H> {
    handler: Arc<H>,
    transport: Transport,
    counters: Arc<Counters>,
    /// Turns true once: every open stream then ends with `Unavailable`.
    shutdown: watch::Receiver<bool>,
}

impl<H> Clone for NodeService<H> {
    fn clone(&self) -> Self {
        NodeService {
            handler: self.handler.clone(),
            transport: self.transport.clone(),
            counters: self.counters.clone(),
            shutdown: self.shutdown.clone(),
        }
    }
}

impl<H: LookupHandler> NodeService<H> {
    /// The service on a port served with `transport`, and the sender that shuts its
    /// streams down (send `true`).
    pub fn new(handler: Arc<H>, transport: Transport) -> (Self, watch::Sender<bool>) {
        let (tx, rx) = watch::channel(false);
        let service = NodeService {
            handler,
            transport,
            counters: Arc::default(),
            shutdown: rx,
        };
        (service, tx)
    }

    pub fn stats(&self) -> NodeStats {
        self.counters.snapshot()
    }

    /// The tonic service, with the protocol's message-size limits, to add to a router.
    pub fn into_grpc(self) -> proto::node_server::NodeServer<Self> {
        proto::node_server::NodeServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

/// Resolves once `shutdown` turns true or its sender is gone.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // An error means the sender was dropped: the server is gone, so stop as well.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

fn failed(request_id: u64, err: &RpcError) -> server_message::Body {
    server_message::Body::Failed(proto::RequestFailed {
        request_id,
        retryable: err.is_retryable(),
        message: err.to_string(),
    })
}

/// The fingerprints of field `what`, if well formed and few enough for one message.
fn checked_fingerprints(
    what: &'static str,
    bytes: &[u8],
) -> Result<Vec<larder_hash::Fingerprint>, RpcError> {
    let fps = codec::unpack_fingerprints(what, bytes)?;
    if fps.len() > MAX_FINGERPRINTS_PER_MESSAGE {
        return Err(RpcError::TooLarge {
            count: fps.len(),
            max: MAX_FINGERPRINTS_PER_MESSAGE,
        });
    }
    Ok(fps)
}

impl<H: LookupHandler> NodeService<H> {
    /// Serves one lookup message: its answers, or why it failed.
    async fn lookup(&self, req: proto::LookupRequest, peer: Option<u16>) -> server_message::Body {
        bump(&self.counters.lookup_messages_in, 1);
        let result = async {
            let from = node_id(req.from_node)?;
            check_from(peer, from)?;
            let fps = checked_fingerprints("lookup fingerprints", &req.fingerprints)?;
            bump(&self.counters.lookup_fingerprints_in, fps.len());
            let asked = fps.len();
            let answers = self.handler.lookup(from, fps).await?;
            if answers.len() != asked {
                return Err(RpcError::Handler {
                    message: format!("answered {} of {asked} fingerprints", answers.len()),
                    retryable: false,
                });
            }
            Ok(codec::pack_answers(&answers))
        }
        .await;
        match result {
            Ok((kinds, locations)) => server_message::Body::Lookup(proto::LookupResponse {
                request_id: req.request_id,
                kinds,
                locations,
            }),
            Err(err) => {
                bump(&self.counters.failed_requests, 1);
                failed(req.request_id, &err)
            }
        }
    }

    /// Serves one acknowledgement message.
    async fn ack(&self, ack: proto::Ack, peer: Option<u16>) -> server_message::Body {
        bump(&self.counters.ack_messages_in, 1);
        let result = async {
            let from = node_id(ack.from_node)?;
            check_from(peer, from)?;
            let entries = codec::unpack_entries(&ack.entries)?;
            bump(&self.counters.ack_entries_in, entries.len());
            self.handler.ack(from, entries).await
        }
        .await;
        match result {
            Ok(()) => server_message::Body::Ack(proto::AckResponse {
                request_id: ack.request_id,
            }),
            Err(err) => {
                bump(&self.counters.failed_requests, 1);
                failed(ack.request_id, &err)
            }
        }
    }

    async fn serve_request(
        self,
        body: client_message::Body,
        tx: mpsc::Sender<Result<ServerMessage, Status>>,
        peer: Option<u16>,
    ) {
        let reply = match body {
            client_message::Body::Lookup(req) => self.lookup(req, peer).await,
            client_message::Body::Ack(ack) => self.ack(ack, peer).await,
        };
        bump(&self.counters.stream_messages_out, 1);
        // A send fails only when the stream is gone: the requester retries elsewhere.
        let _ = tx.send(Ok(ServerMessage { body: Some(reply) })).await;
    }

    /// Reads one stream's requests until it ends, each served by its own task, then
    /// waits for those tasks; ends the stream with `Unavailable` on shutdown. A task
    /// whose handler panicked is answered `RequestFailed`, so no requester waits on it.
    /// `peer` is the node the stream's certificate names (`None` on a plaintext port).
    async fn serve_stream(
        self,
        mut inbound: Streaming<ClientMessage>,
        tx: mpsc::Sender<Result<ServerMessage, Status>>,
        peer: Option<u16>,
    ) {
        let mut shutdown = self.shutdown.clone();
        let mut tasks = JoinSet::new();
        // The request id each running task answers.
        let mut request_ids: HashMap<tokio::task::Id, u64> = HashMap::new();
        let mut reading = true;
        loop {
            tokio::select! {
                msg = inbound.message(), if reading => match msg {
                    Ok(Some(ClientMessage { body: Some(body) })) => {
                        let request_id = match &body {
                            client_message::Body::Lookup(r) => r.request_id,
                            client_message::Body::Ack(r) => r.request_id,
                        };
                        let task = tasks.spawn(self.clone().serve_request(body, tx.clone(), peer));
                        request_ids.insert(task.id(), request_id);
                    }
                    Ok(Some(ClientMessage { body: None })) => {
                        bump(&self.counters.failed_requests, 1);
                        tracing::warn!("lookup stream: a message without a body; ignored");
                    }
                    // The requester closed its side or went away: answer what is in
                    // flight (sends to a vanished requester fail, harmlessly).
                    Ok(None) => reading = false,
                    Err(status) => {
                        tracing::debug!(%status, "lookup stream: inbound ended with an error");
                        reading = false;
                    }
                },
                Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => match done {
                    Ok((id, ())) => {
                        request_ids.remove(&id);
                    }
                    Err(err) => {
                        let request_id = request_ids.remove(&err.id()).unwrap_or_default();
                        tracing::error!(%err, request_id, "lookup handler panicked");
                        bump(&self.counters.failed_requests, 1);
                        bump(&self.counters.stream_messages_out, 1);
                        let body = failed(request_id, &RpcError::Handler {
                            message: format!("the handler panicked: {err}"),
                            retryable: false,
                        });
                        let _ = tx.send(Ok(ServerMessage { body: Some(body) })).await;
                    }
                },
                () = stopped(&mut shutdown) => {
                    tasks.shutdown().await;
                    let _ = tx.send(Err(Status::unavailable("node is shutting down"))).await;
                    return;
                }
            }
            if !reading && tasks.is_empty() {
                return;
            }
        }
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl<H: LookupHandler> proto::node_server::Node for NodeService<H> {
    type ExchangeStream = ResponseStream;

    async fn exchange(
        &self,
        request: Request<Streaming<ClientMessage>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        let peer = Peer::of(&self.transport, &request)?.require_node("Exchange")?;
        bump(&self.counters.streams_opened, 1);
        let (tx, rx) = mpsc::channel(RESPONSES_BUFFERED);
        tokio::spawn(self.clone().serve_stream(request.into_inner(), tx, peer));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get(
        &self,
        request: Request<proto::GetRequest>,
    ) -> Result<Response<proto::GetResponse>, Status> {
        Peer::of(&self.transport, &request)?.require_node("Get")?;
        bump(&self.counters.get_messages_in, 1);
        let fps = checked_fingerprints("get fingerprints", &request.into_inner().fingerprints)
            .map_err(|err| {
                bump(&self.counters.failed_requests, 1);
                Status::invalid_argument(err.to_string())
            })?;
        bump(&self.counters.get_fingerprints_in, fps.len());
        let asked = fps.len();
        let answers = self.handler.get(fps).await.map_err(|err| {
            bump(&self.counters.failed_requests, 1);
            if err.is_retryable() {
                Status::unavailable(err.to_string())
            } else {
                Status::internal(err.to_string())
            }
        })?;
        if answers.len() != asked {
            bump(&self.counters.failed_requests, 1);
            return Err(Status::internal(format!(
                "lookup handler answered {} of {asked} fingerprints",
                answers.len()
            )));
        }
        let (kinds, locations) = codec::pack_get_answers(&answers);
        Ok(Response::new(proto::GetResponse { kinds, locations }))
    }

    async fn stats(
        &self,
        request: Request<proto::StatsRequest>,
    ) -> Result<Response<proto::StatsResponse>, Status> {
        Peer::of(&self.transport, &request)?;
        Ok(Response::new(self.counters.snapshot().into()))
    }

    async fn job(
        &self,
        request: Request<proto::JobRequest>,
    ) -> Result<Response<proto::JobResponse>, Status> {
        let grants = Peer::of(&self.transport, &request)?.require_client()?;
        let request = request.into_inner();
        let job = super::Job::decode(&request.kind, request.args)
            .ok_or_else(|| Status::invalid_argument(format!("unknown job {:?}", request.kind)))?;
        let json = self
            .handler
            .job(job, grants)
            .await
            .map_err(|err| match err {
                RpcError::PermissionDenied(message) => Status::permission_denied(message),
                err => Status::failed_precondition(err.to_string()),
            })?;
        Ok(Response::new(proto::JobResponse { json }))
    }
}

/// A running lookup server: the `Node` service on one TCP listener.
pub struct LookupServer {
    local_addr: SocketAddr,
    counters: Arc<Counters>,
    stop_streams: watch::Sender<bool>,
    stop_accepting: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl LookupServer {
    /// Binds `addr` (port 0 picks a free port) and serves `handler` there in
    /// plaintext: refused unless `addr` is loopback.
    pub async fn bind<H: LookupHandler>(
        addr: SocketAddr,
        handler: Arc<H>,
    ) -> std::io::Result<Self> {
        Self::bind_with(addr, handler, Transport::Plaintext).await
    }

    /// Binds `addr` and serves `handler` there over `transport`; plaintext is refused
    /// unless `addr` is loopback.
    pub async fn bind_with<H: LookupHandler>(
        addr: SocketAddr,
        handler: Arc<H>,
        transport: Transport,
    ) -> std::io::Result<Self> {
        transport
            .check_addr(&addr.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = transport.server_tls() {
            builder = builder.tls_config(tls).map_err(std::io::Error::other)?;
        }
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let (service, stop_streams) = NodeService::new(handler, transport);
        let counters = service.counters.clone();
        let (stop_accepting, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let router = builder
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .add_service(service.into_grpc());
        let task = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        }));
        Ok(LookupServer {
            local_addr,
            counters,
            stop_streams,
            stop_accepting: Some(stop_accepting),
            task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn stats(&self) -> NodeStats {
        self.counters.snapshot()
    }

    /// Stops accepting, ends every open stream with `Unavailable` (its requests in
    /// flight are dropped, so their requesters get an error), and waits up to 5 s for
    /// the connections to close before dropping them.
    pub async fn shutdown(mut self) {
        let _ = self.stop_streams.send(true);
        if let Some(stop) = self.stop_accepting.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut self.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => tracing::warn!(%err, "lookup server ended with an error"),
            Ok(Err(err)) => tracing::warn!(%err, "lookup server task failed"),
            Err(_) => {
                tracing::warn!(
                    "lookup server connections still open after the grace period; dropped"
                );
                self.task.abort();
            }
        }
    }
}

impl Drop for LookupServer {
    /// A server dropped without `shutdown` stops at once: its task is aborted.
    fn drop(&mut self) {
        let _ = self.stop_streams.send(true);
        self.task.abort();
    }
}
