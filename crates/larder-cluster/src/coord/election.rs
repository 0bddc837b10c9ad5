//! Master election through etcd's election API under `<prefix>election`: each
//! candidate's key is `<prefix>election/<lease in hex>`, attached to its member lease,
//! and the master is the candidate whose key has the lowest create revision. A dead
//! master's lease expires, its key goes with it, and the next candidate is elected.

use std::time::Duration;

use etcd_client::{GetOptions, LeaderKey, ResignOptions, SortOrder, SortTarget};
use tokio::sync::watch;

use super::{CoordError, Etcd};

/// The election of one cluster.
#[derive(Clone)]
pub struct Election {
    etcd: Etcd,
    /// `<prefix>election`: the election's name, its candidates' keys under `name/`.
    name: String,
}

/// Proof of having been elected: the master's key and its create revision, which
/// the partition map's writes are guarded by (see `PartitionMapStore::assign`).
#[derive(Debug, Clone)]
pub struct Leadership {
    key: LeaderKey,
    value: String,
}

impl Leadership {
    /// The master's election key (absolute).
    pub fn key(&self) -> &[u8] {
        self.key.key()
    }

    /// The election key's create revision: it exists with this revision exactly as
    /// long as this leadership holds.
    pub fn revision(&self) -> i64 {
        self.key.rev()
    }

    /// The lease the election key is attached to.
    pub fn lease(&self) -> i64 {
        self.key.lease()
    }

    /// The value the master campaigned with (its node id, by convention).
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl Election {
    pub fn new(etcd: &Etcd) -> Self {
        Self {
            etcd: etcd.clone(),
            name: etcd.key("election"),
        }
    }

    /// Campaigns with `value` under `lease` (the member lease) and returns once
    /// elected; waits as long as another candidate leads. Safe to retry: a second
    /// campaign with the same lease reuses the candidate's key.
    pub async fn campaign(&self, lease: i64, value: &str) -> Result<Leadership, CoordError> {
        let name = self.name.clone();
        let mut response = self
            .etcd
            .retry("campaign", None, |mut c| {
                let name = name.clone();
                let value = value.to_string();
                async move { c.campaign(name, value, lease).await }
            })
            .await?;
        let key = response
            .take_leader()
            .ok_or_else(|| CoordError::Malformed {
                key: self.name.clone(),
                detail: "campaign answered without a leader key".into(),
            })?;
        Ok(Leadership {
            key,
            value: value.to_string(),
        })
    }

    /// The current master's value, if any candidate exists.
    pub async fn leader(&self) -> Result<Option<String>, CoordError> {
        let candidates = format!("{}/", self.name);
        let response = self
            .etcd
            .retry(
                "leader",
                Some(self.etcd.options().operation_timeout),
                |mut c| {
                    let candidates = candidates.clone();
                    let options = GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1);
                    async move { c.get(candidates, Some(options)).await }
                },
            )
            .await?;
        Ok(response
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    /// Follows the master: the receiver holds the latest master's value seen (`None`
    /// until one is). Reconnects after stream errors; ends when every receiver is
    /// dropped. Opening the stream has no attempt timeout: etcd answers it only once
    /// there is a leader; a dead connection is found by the HTTP/2 keepalive.
    pub fn observe(&self) -> watch::Receiver<Option<String>> {
        let (sender, receiver) = watch::channel(None);
        let etcd = self.etcd.clone();
        let name = self.name.clone();
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = sender.closed() => return,
                    stream = etcd.retry("observe", None, |mut c| {
                        let name = name.clone();
                        async move { c.observe(name).await }
                    }) => stream,
                };
                if let Ok(mut stream) = stream {
                    loop {
                        let message = tokio::select! {
                            _ = sender.closed() => return,
                            message = stream.message() => message,
                        };
                        let Ok(Some(response)) = message else { break };
                        if let Some(kv) = response.kv() {
                            let value = String::from_utf8_lossy(kv.value()).into_owned();
                            sender.send_replace(Some(value));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        receiver
    }

    /// Gives up leadership: deletes the master's key, so the next candidate is
    /// elected at once.
    pub async fn resign(&self, leadership: Leadership) -> Result<(), CoordError> {
        let key = leadership.key;
        self.etcd
            .retry(
                "resign",
                Some(self.etcd.options().operation_timeout),
                |mut c| {
                    let options = ResignOptions::new().with_leader(key.clone());
                    async move { c.resign(Some(options)).await.map(|_| ()) }
                },
            )
            .await
    }
}
