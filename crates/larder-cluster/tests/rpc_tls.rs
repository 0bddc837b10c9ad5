//! The nodes' port over mutual TLS (docs/design/cluster.md, "Security"), against an
//! in-test handler that records what reaches it: who may make which call, and that a
//! refused request never reaches the owner's logic.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use larder_cluster::rpc::proto::{node_client, GetRequest};
use larder_cluster::rpc::{
    Answer, GetAnswer, Grants, Job, JobClient, LookupHandler, LookupServer, NodeClient, RpcError,
    Transport,
};
use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use support::certs::Certs;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Answers everything `New`, `Absent` and a job with its grants; counts what it saw.
#[derive(Default)]
struct Recorder {
    calls: AtomicUsize,
    grants: Mutex<Vec<Grants>>,
}

impl LookupHandler for Recorder {
    async fn lookup(&self, _from: u16, fps: Vec<Fingerprint>) -> Result<Vec<Answer>, RpcError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(vec![Answer::New; fps.len()])
    }

    async fn ack(
        &self,
        _from: u16,
        _entries: Vec<(Fingerprint, ChunkLocation)>,
    ) -> Result<(), RpcError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn get(&self, fps: Vec<Fingerprint>) -> Result<Vec<GetAnswer>, RpcError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(vec![GetAnswer::Absent; fps.len()])
    }

    async fn job(&self, _job: Job, grants: Grants) -> Result<String, RpcError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.grants.lock().unwrap().push(grants);
        Ok("{}".into())
    }
}

const FP: Fingerprint = Fingerprint([7; 32]);
const AT: ChunkLocation = ChunkLocation {
    container: 2 << 48,
    offset: 0,
    length: 10,
};

async fn serve(certs: &Certs) -> (LookupServer, Arc<Recorder>, String) {
    let recorder = Arc::new(Recorder::default());
    let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = LookupServer::bind_with(any_port, recorder.clone(), certs.node(1))
        .await
        .unwrap();
    let addr = server.local_addr().to_string();
    (server, recorder, addr)
}

/// A raw `Get` over `transport`'s certificate, below `NodeClient` (which opens the
/// lookup stream first).
async fn raw_get(addr: &str, transport: &Transport) -> Result<(), tonic::Status> {
    let Transport::Tls(files) = transport else {
        panic!("a TLS transport")
    };
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&files.ca))
        .identity(Identity::from_pem(&files.cert, &files.key));
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let get = GetRequest {
        fingerprints: FP.0.to_vec().into(),
    };
    node_client::NodeClient::new(channel)
        .get(get)
        .await
        .map(drop)
}

#[tokio::test]
async fn each_call_answers_only_the_certificates_it_is_for() {
    let certs = Certs::issue(2);
    let (_server, recorder, addr) = serve(&certs).await;
    let calls = || recorder.calls.load(Ordering::SeqCst);

    // A node, as itself: lookups, acknowledgements and gets are served.
    let node2 = NodeClient::connect_with(&addr, 2, &certs.node(2))
        .await
        .unwrap();
    assert_eq!(node2.lookup(&[FP]).await.unwrap(), [Answer::New]);
    node2.ack(&[(FP, AT)]).await.unwrap();
    assert_eq!(node2.get(&[FP]).await.unwrap(), [GetAnswer::Absent]);
    assert_eq!(calls(), 3);

    // Dialled as the owner the map names, the server's certificate must name it.
    NodeClient::connect_to(&addr, Some(1), 2, &certs.node(2))
        .await
        .unwrap();
    let impostor = NodeClient::connect_to(&addr, Some(2), 1, &certs.node(1)).await;
    assert!(impostor.is_err(), "node 1's port passed for node 2's");

    // Node 2's certificate claiming node 1: refused before the handler.
    let forger = NodeClient::connect_with(&addr, 1, &certs.node(2))
        .await
        .unwrap();
    for refused in [
        forger.ack(&[(FP, AT)]).await.unwrap_err(),
        forger.lookup(&[FP]).await.unwrap_err(),
    ] {
        assert!(
            matches!(&refused, RpcError::Refused { message, retryable: false, .. }
                if message.contains("permission denied")),
            "{refused}"
        );
    }
    assert_eq!(calls(), 3, "a forged message reached the owner");

    // A client: no lookup stream, no get; its job gets its grants.
    let client = certs.client();
    let as_node = NodeClient::connect_with(&addr, 1, &client).await;
    assert!(matches!(as_node, Err(RpcError::PermissionDenied(_))));
    let get = raw_get(&addr, &client).await.unwrap_err();
    assert_eq!(get.code(), tonic::Code::PermissionDenied, "{get}");
    raw_get(&addr, &certs.node(2)).await.unwrap();
    assert_eq!(calls(), 4);
    let jobs = JobClient::connect(&addr, &client).await.unwrap();
    jobs.job(&Job::Snapshots).await.unwrap();
    assert_eq!(
        recorder.grants.lock().unwrap().as_slice(),
        [Grants::Paths(vec![std::env::temp_dir()])]
    );
    jobs.node_stats().await.unwrap();

    // A node's certificate runs no job.
    let node_jobs = JobClient::connect(&addr, &certs.node(2)).await.unwrap();
    let refused = node_jobs.job(&Job::Snapshots).await;
    assert!(matches!(refused, Err(RpcError::PermissionDenied(_))));

    // No certificate, or another authority's: not even a connection that answers.
    let stranger = Certs::issue(2);
    for transport in [Transport::Plaintext, stranger.node(2), stranger.client()] {
        let stream = tokio::time::timeout(
            Duration::from_secs(10),
            NodeClient::connect_with(&addr, 2, &transport),
        )
        .await
        .unwrap();
        assert!(stream.is_err());
        if let Ok(client) = JobClient::connect(&addr, &transport).await {
            assert!(client.job(&Job::Snapshots).await.is_err());
            assert!(client.node_stats().await.is_err());
        }
    }
    assert_eq!(calls(), 5, "a stranger reached the handler");
}

#[tokio::test]
async fn plaintext_only_on_loopback() {
    let everywhere = SocketAddr::from(([0, 0, 0, 0], 0));
    let refused = LookupServer::bind(everywhere, Arc::new(Recorder::default())).await;
    assert!(refused.is_err());
    let far = NodeClient::connect("192.0.2.1:7001", 1).await;
    assert!(matches!(far, Err(RpcError::Insecure { .. })));
    let far = JobClient::connect("192.0.2.1:7001", &Transport::Plaintext).await;
    assert!(matches!(far, Err(RpcError::Insecure { .. })));
    // Loopback is served.
    let here = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = LookupServer::bind(here, Arc::new(Recorder::default()))
        .await
        .unwrap();
    let client = NodeClient::connect(&server.local_addr().to_string(), 1)
        .await
        .unwrap();
    client.lookup(&[FP]).await.unwrap();
}
