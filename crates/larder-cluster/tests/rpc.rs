//! The lookup protocol over real loopback TCP (docs/design/cluster.md, "Lookups"),
//! against an in-test handler: a `Mutex<HashMap>` model of lock on new, simple enough
//! to be obviously right. Every wait is bounded, so a hang fails the test.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use larder_cluster::rpc::proto::{self, client_message, node_client, server_message};
use larder_cluster::rpc::{
    Answer, GetAnswer, LookupHandler, LookupServer, NodeClient, RpcError,
    MAX_FINGERPRINTS_PER_MESSAGE,
};
use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use tokio::sync::{watch, Barrier};

/// Fingerprints whose first byte is this answer `Moved`: the model's "partition owned
/// elsewhere".
const MOVED_BYTE: u8 = 0xff;
/// A lookup of a fingerprint whose first byte is this panics in the handler.
const PANIC_BYTE: u8 = 0xfe;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Entry {
    Stored(ChunkLocation),
    /// Answered `New` to this node; waiting for its Ack.
    Locked(u16),
}

/// Lock on new: a lookup waits while any of its fingerprints is locked, then answers
/// all of them at once (stored: Known; absent: lock for the requester, New).
struct Model {
    entries: Mutex<HashMap<Fingerprint, Entry>>,
    /// Bumped on every Ack; waiters re-check after it changes.
    version: watch::Sender<u64>,
    /// If set, every lookup first waits here: proves that many run at once.
    gate: Option<Barrier>,
}

impl Model {
    fn new(stored: &[(Fingerprint, ChunkLocation)]) -> Self {
        let entries = stored
            .iter()
            .map(|&(fp, loc)| (fp, Entry::Stored(loc)))
            .collect();
        Model {
            entries: Mutex::new(entries),
            version: watch::channel(0).0,
            gate: None,
        }
    }
}

fn moved(fp: &Fingerprint) -> bool {
    fp.0[0] == MOVED_BYTE
}

impl LookupHandler for Model {
    async fn lookup(&self, from: u16, fps: Vec<Fingerprint>) -> Result<Vec<Answer>, RpcError> {
        if let Some(gate) = &self.gate {
            gate.wait().await;
        }
        assert!(fps.iter().all(|f| f.0[0] != PANIC_BYTE), "the test's panic");
        loop {
            // Subscribed before the check, so an Ack after it is never missed.
            let mut changed = self.version.subscribe();
            {
                let mut entries = self.entries.lock().unwrap();
                let locked = fps
                    .iter()
                    .any(|fp| matches!(entries.get(fp), Some(Entry::Locked(_))));
                if !locked {
                    let answers = fps
                        .iter()
                        .map(|fp| {
                            if moved(fp) {
                                return Answer::Moved;
                            }
                            match entries.get(fp) {
                                Some(Entry::Stored(loc)) => Answer::Known(*loc),
                                _ => {
                                    entries.insert(*fp, Entry::Locked(from));
                                    Answer::New
                                }
                            }
                        })
                        .collect();
                    return Ok(answers);
                }
            }
            changed.changed().await.unwrap();
        }
    }

    async fn ack(
        &self,
        from: u16,
        acked: Vec<(Fingerprint, ChunkLocation)>,
    ) -> Result<(), RpcError> {
        {
            let mut entries = self.entries.lock().unwrap();
            for (fp, loc) in acked {
                if entries.get(&fp) != Some(&Entry::Locked(from)) {
                    return Err(RpcError::Handler {
                        message: format!("{fp:?} is not locked for node {from}"),
                        retryable: false,
                    });
                }
                entries.insert(fp, Entry::Stored(loc));
            }
        }
        self.version.send_modify(|v| *v += 1);
        Ok(())
    }

    async fn get(&self, fps: Vec<Fingerprint>) -> Result<Vec<GetAnswer>, RpcError> {
        let entries = self.entries.lock().unwrap();
        Ok(fps
            .iter()
            .map(|fp| match entries.get(fp) {
                _ if moved(fp) => GetAnswer::Moved,
                Some(Entry::Stored(loc)) => GetAnswer::Known(*loc),
                _ => GetAnswer::Absent,
            })
            .collect())
    }
}

/// A distinct fingerprint per `i`, never starting with `MOVED_BYTE` or `PANIC_BYTE`.
fn fp(i: u64) -> Fingerprint {
    let mut b = [0u8; 32];
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x1234_5678;
    for chunk in b.chunks_mut(8) {
        x ^= x >> 31;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    b[0] %= 0xf0;
    b[1..9].copy_from_slice(&i.to_le_bytes());
    Fingerprint(b)
}

fn moved_fp(i: u64) -> Fingerprint {
    let mut f = fp(i);
    f.0[0] = MOVED_BYTE;
    f
}

fn loc(i: u64) -> ChunkLocation {
    ChunkLocation {
        container: (7u64 << 48) | i,
        offset: (i * 4096) as u32,
        length: 1000 + i as u32,
    }
}

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within 20 s"))
}

/// True if `fut` has not finished after 300 ms (it is waiting).
async fn still_waiting<T>(handle: &tokio::task::JoinHandle<T>) -> bool {
    tokio::time::sleep(Duration::from_millis(300)).await;
    !handle.is_finished()
}

async fn serve(model: Model) -> (LookupServer, String) {
    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = LookupServer::bind(any_port, Arc::new(model)).await.unwrap();
    let addr = server.local_addr().to_string();
    (server, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_answers_every_fingerprint_in_order_and_exactly() {
    let stored: Vec<_> = (0..300).map(|i| (fp(i), loc(i))).collect();
    let (server, addr) = serve(Model::new(&stored)).await;
    let client = NodeClient::connect(&addr, 3).await.unwrap();

    // A mix in a scrambled order: stored (Known), absent (New), moved, and an empty
    // batch; the oracle is the model's rule applied to each fingerprint alone.
    let mut asked = Vec::new();
    let mut expected = Vec::new();
    for i in 0..600u64 {
        let j = (i * 337) % 600;
        if j % 7 == 0 {
            asked.push(moved_fp(j));
            expected.push(Answer::Moved);
        } else if j < 300 {
            asked.push(fp(j));
            expected.push(Answer::Known(loc(j)));
        } else {
            asked.push(fp(j));
            expected.push(Answer::New);
        }
    }
    assert_eq!(
        within("lookup", client.lookup(&asked)).await.unwrap(),
        expected
    );
    assert_eq!(
        within("empty lookup", client.lookup(&[])).await.unwrap(),
        vec![]
    );

    // Acknowledge the new ones at new locations: a second lookup knows them all.
    let acked: Vec<_> = asked
        .iter()
        .zip(&expected)
        .filter(|(_, a)| **a == Answer::New)
        .map(|(f, _)| (*f, loc(u64::from(f.0[1]) + 10_000)))
        .collect();
    within("ack", client.ack(&acked)).await.unwrap();
    let again = within("lookup again", client.lookup(&asked)).await.unwrap();
    let by_fp: HashMap<_, _> = acked.iter().copied().collect();
    for ((f, before), after) in asked.iter().zip(&expected).zip(&again) {
        match before {
            Answer::New => assert_eq!(*after, Answer::Known(by_fp[f])),
            other => assert_eq!(after, other),
        }
    }

    // Get: no locking; Known, Absent, Moved in order.
    let gets = [fp(5), fp(100_000), moved_fp(1), acked[0].0];
    assert_eq!(
        within("get", client.get(&gets)).await.unwrap(),
        vec![
            GetAnswer::Known(loc(5)),
            GetAnswer::Absent,
            GetAnswer::Moved,
            GetAnswer::Known(acked[0].1)
        ]
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_batches_are_in_flight_at_once_on_one_stream() {
    const BATCHES: u64 = 32;
    const PER_BATCH: u64 = 100;
    let stored: Vec<_> = (0..BATCHES * PER_BATCH).map(|i| (fp(i), loc(i))).collect();
    let mut model = Model::new(&stored);
    // No lookup passes the gate until all 32 are at the server together.
    model.gate = Some(Barrier::new(BATCHES as usize));
    let (server, addr) = serve(model).await;
    let client = Arc::new(NodeClient::connect(&addr, 1).await.unwrap());

    let calls: Vec<_> = (0..BATCHES)
        .map(|b| {
            let client = client.clone();
            tokio::spawn(async move {
                let fps: Vec<_> = (b * PER_BATCH..(b + 1) * PER_BATCH).map(fp).collect();
                (b, client.lookup(&fps).await)
            })
        })
        .collect();
    for call in calls {
        let (b, answers) = within("batch", call).await.unwrap();
        let expected: Vec<_> = (b * PER_BATCH..(b + 1) * PER_BATCH)
            .map(|i| Answer::Known(loc(i)))
            .collect();
        assert_eq!(answers.unwrap(), expected, "batch {b}");
    }

    let mine = client.stats();
    assert_eq!(mine.lookup_messages_sent, BATCHES);
    assert_eq!(mine.lookup_fingerprints_sent, BATCHES * PER_BATCH);
    assert_eq!(mine.stream_messages_received, BATCHES);
    assert_eq!(mine.fingerprints_per_lookup_message(), PER_BATCH as f64);
    let node = within("stats", client.node_stats()).await.unwrap();
    assert_eq!(node.streams_opened, 1, "one stream carries every batch");
    assert_eq!(node.lookup_messages_in, BATCHES);
    assert_eq!(node.lookup_fingerprints_in, BATCHES * PER_BATCH);
    assert_eq!(node.stream_messages_out, BATCHES);
    assert_eq!(node.failed_requests, 0);
    assert_eq!(server.stats(), node);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_waiting_on_a_lock_does_not_block_a_later_batch() {
    let (server, addr) = serve(Model::new(&[(fp(2), loc(2))])).await;
    let writer = NodeClient::connect(&addr, 1).await.unwrap();
    let other = Arc::new(NodeClient::connect(&addr, 2).await.unwrap());

    assert_eq!(writer.lookup(&[fp(1)]).await.unwrap(), vec![Answer::New]);
    let waiting = tokio::spawn({
        let other = other.clone();
        async move { other.lookup(&[fp(1)]).await }
    });
    assert!(still_waiting(&waiting).await, "fp(1) is locked for node 1");
    // The same stream answers an unrelated batch while the first one waits.
    assert_eq!(
        within("unrelated batch", other.lookup(&[fp(2), fp(3)]))
            .await
            .unwrap(),
        vec![Answer::Known(loc(2)), Answer::New]
    );
    assert!(!waiting.is_finished());
    writer.ack(&[(fp(1), loc(1))]).await.unwrap();
    within("waiter", waiting).await.unwrap().unwrap();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_releases_every_waiter_with_known() {
    let (server, addr) = serve(Model::new(&[])).await;
    let writer = NodeClient::connect(&addr, 1).await.unwrap();
    assert_eq!(writer.lookup(&[fp(9)]).await.unwrap(), vec![Answer::New]);

    let mut waiters = Vec::new();
    for node in 2..6u16 {
        let client = NodeClient::connect(&addr, node).await.unwrap();
        waiters.push(tokio::spawn(async move { client.lookup(&[fp(9)]).await }));
    }
    for w in &waiters {
        assert!(still_waiting(w).await, "fp(9) is locked for node 1");
    }
    // A get does not lock or wait: not stored yet.
    assert_eq!(writer.get(&[fp(9)]).await.unwrap(), vec![GetAnswer::Absent]);

    writer.ack(&[(fp(9), loc(9))]).await.unwrap();
    for w in waiters {
        let answers = within("waiter", w).await.unwrap().unwrap();
        assert_eq!(answers, vec![Answer::Known(loc(9))]);
    }
    assert_eq!(
        writer.get(&[fp(9)]).await.unwrap(),
        vec![GetAnswer::Known(loc(9))]
    );
    server.shutdown().await;
}

async fn next_body(inbound: &mut tonic::Streaming<proto::ServerMessage>) -> server_message::Body {
    within("response", inbound.message())
        .await
        .unwrap()
        .unwrap()
        .body
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_a_clear_error_and_the_stream_goes_on() {
    let (server, addr) = serve(Model::new(&[(fp(1), loc(1))])).await;
    let mut raw = node_client::NodeClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut inbound = raw
        .exchange(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let lookup = |request_id, from_node, fingerprints: Vec<u8>| proto::ClientMessage {
        body: Some(client_message::Body::Lookup(proto::LookupRequest {
            request_id,
            from_node,
            fingerprints: fingerprints.into(),
        })),
    };

    tx.send(lookup(1, 5, vec![0; 33])).await.unwrap();
    match next_body(&mut inbound).await {
        server_message::Body::Failed(f) => {
            assert_eq!(f.request_id, 1);
            assert!(!f.retryable);
            assert!(
                f.message.contains("33 bytes is not a multiple of 32"),
                "{}",
                f.message
            );
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    tx.send(lookup(2, 0, fp(1).0.to_vec())).await.unwrap();
    match next_body(&mut inbound).await {
        server_message::Body::Failed(f) => {
            assert_eq!(f.request_id, 2);
            assert!(f.message.contains("invalid node id 0"), "{}", f.message);
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    tx.send(proto::ClientMessage {
        body: Some(client_message::Body::Ack(proto::Ack {
            request_id: 3,
            from_node: 5,
            entries: vec![0; 47].into(),
        })),
    })
    .await
    .unwrap();
    match next_body(&mut inbound).await {
        server_message::Body::Failed(f) => {
            assert_eq!(f.request_id, 3);
            assert!(
                f.message.contains("47 bytes is not a multiple of 48"),
                "{}",
                f.message
            );
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    // The same stream still serves a well-formed lookup.
    tx.send(lookup(4, 5, fp(1).0.to_vec())).await.unwrap();
    match next_body(&mut inbound).await {
        server_message::Body::Lookup(r) => {
            assert_eq!(r.request_id, 4);
            assert_eq!(&r.kinds[..], &[0]);
            assert_eq!(r.locations.len(), 16);
        }
        other => panic!("expected answers, got {other:?}"),
    }

    // A malformed get is InvalidArgument, and the client's error says why.
    let status = raw
        .get(proto::GetRequest {
            fingerprints: vec![0; 31].into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status
        .message()
        .contains("31 bytes is not a multiple of 32"));

    // An Ack the handler rejects is refused, not retryable, and the stream goes on.
    let client = NodeClient::connect(&addr, 5).await.unwrap();
    let err = client.ack(&[(fp(77), loc(77))]).await.unwrap_err();
    assert!(
        matches!(
            err,
            RpcError::Refused {
                retryable: false,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("is not locked for node 5"),
        "{err}"
    );
    assert_eq!(
        client.lookup(&[fp(1)]).await.unwrap(),
        vec![Answer::Known(loc(1))]
    );

    // A handler that panics answers its request with a failure; the stream goes on.
    let mut boom = fp(1);
    boom.0[0] = PANIC_BYTE;
    let err = within("panicking lookup", client.lookup(&[boom]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("the handler panicked"), "{err}");
    assert_eq!(
        client.lookup(&[fp(1)]).await.unwrap(),
        vec![Answer::Known(loc(1))]
    );

    // Too many fingerprints for one message: refused before sending.
    let too_many = vec![fp(1); MAX_FINGERPRINTS_PER_MESSAGE + 1];
    let err = client.lookup(&too_many).await.unwrap_err();
    assert!(matches!(err, RpcError::TooLarge { .. }), "{err}");
    assert!(!err.is_retryable());
    assert!(!client.is_closed());
    assert_eq!(server.stats().failed_requests, 6);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_shutdown_fails_calls_in_flight_with_a_retryable_error() {
    let (server, addr) = serve(Model::new(&[])).await;
    let writer = NodeClient::connect(&addr, 1).await.unwrap();
    let other = Arc::new(NodeClient::connect(&addr, 2).await.unwrap());
    assert_eq!(writer.lookup(&[fp(1)]).await.unwrap(), vec![Answer::New]);
    let waiting = tokio::spawn({
        let other = other.clone();
        async move { other.lookup(&[fp(1)]).await }
    });
    assert!(still_waiting(&waiting).await);

    assert!(!other.is_closed());
    within("shutdown", server.shutdown()).await;
    let err = within("waiter", waiting).await.unwrap().unwrap_err();
    assert!(other.is_closed());
    assert!(matches!(err, RpcError::ConnectionLost { .. }), "{err}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains("shutting down"), "{err}");
    // Every later call on the dead stream fails at once, too.
    let err = within("later", other.lookup(&[fp(2)])).await.unwrap_err();
    assert!(matches!(err, RpcError::ConnectionLost { .. }), "{err}");
    assert!(
        NodeClient::connect(&addr, 3).await.is_err(),
        "nothing listens any more"
    );
}

#[test]
fn a_node_that_dies_fails_calls_in_flight() {
    // The server runs on its own runtime in its own thread; dropping that runtime
    // closes its sockets at once, as a killed process would.
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (kill_tx, kill_rx) = std::sync::mpsc::channel::<()>();
    let node = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (server, addr) = rt.block_on(serve(Model::new(&[])));
        addr_tx.send(addr).unwrap();
        kill_rx.recv().unwrap();
        // The runtime first, so that the server's own orderly shutdown never runs.
        drop(rt);
        drop(server);
    });
    let addr = addr_rx.recv().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let writer = NodeClient::connect(&addr, 1).await.unwrap();
        let other = Arc::new(NodeClient::connect(&addr, 2).await.unwrap());
        assert_eq!(writer.lookup(&[fp(1)]).await.unwrap(), vec![Answer::New]);
        let waiting = tokio::spawn({
            let other = other.clone();
            async move { other.lookup(&[fp(1)]).await }
        });
        assert!(still_waiting(&waiting).await);
        kill_tx.send(()).unwrap();
        let err = within("waiter", waiting).await.unwrap().unwrap_err();
        assert!(matches!(err, RpcError::ConnectionLost { .. }), "{err}");
        assert!(err.is_retryable());
        let err = within("writer", writer.ack(&[(fp(1), loc(1))]))
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err}");
    });
    node.join().unwrap();
}
