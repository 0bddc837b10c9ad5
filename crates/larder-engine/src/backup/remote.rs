//! A chunk index shared with other repositories (a cluster's partition owners), as
//! the backup asks it: lookups sent now whose answers come later, so that stage 3 keeps
//! several in flight ([`super::remote_stage`]).

use crossbeam_channel::{bounded, Receiver, Sender};
use larder_hash::Fingerprint;
use larder_index::ChunkLocation;

use crate::error::{EngineError, Result};

/// A remote index's answers to one lookup: for each fingerprint, in order, where it
/// is stored, or `None` if nowhere.
pub type RemoteAnswers = Result<Vec<Option<ChunkLocation>>>;

/// A chunk index shared with other repositories: a cluster's partition owners.
pub trait RemoteIndex: Send + Sync {
    /// Sends the lookup of `fps`; its answers come through the returned
    /// [`RemoteLookup`]. A `None` is a promise to store the chunk and
    /// [`RemoteIndex::acknowledge`] it: other askers wait for that (the cluster's lock
    /// on new). A backup keeps several lookups in flight, and never has a fingerprint
    /// in two of them at once: a copy would wait on the lock its first took.
    fn lookup(&self, fps: Vec<Fingerprint>) -> RemoteLookup;

    /// Where this repository stored chunks `lookup` answered `None` for, once they are
    /// durable (committed).
    fn acknowledge(&self, entries: &[(Fingerprint, ChunkLocation)]) -> Result<()>;
}

/// A lookup sent to a remote index, whose answers come later.
pub struct RemoteLookup(Receiver<RemoteAnswers>);

/// Where a remote index sends the answers of one lookup.
pub struct RemoteReply(Sender<RemoteAnswers>);

impl RemoteLookup {
    /// A lookup not answered yet, and where its answers go.
    pub fn channel() -> (RemoteReply, RemoteLookup) {
        let (tx, rx) = bounded(1);
        (RemoteReply(tx), RemoteLookup(rx))
    }

    /// A lookup answered already (an index that answers at once).
    pub fn answered(answers: RemoteAnswers) -> Self {
        let (reply, lookup) = Self::channel();
        reply.send(answers);
        lookup
    }

    /// Waits for the answers. A reply dropped unsent (its sender failed or shut down)
    /// is an error.
    pub fn wait(self) -> RemoteAnswers {
        self.0.recv().unwrap_or_else(|_| Err(dropped()))
    }

    /// The channel the answers come on, for a caller that waits on other things too.
    pub(super) fn receiver(&self) -> &Receiver<RemoteAnswers> {
        &self.0
    }
}

impl RemoteReply {
    pub fn send(self, answers: RemoteAnswers) {
        // The asker may have gone (a failed backup): nothing to do then.
        let _ = self.0.send(answers);
    }
}

/// The error of a lookup whose reply was dropped unsent.
pub(super) fn dropped() -> EngineError {
    EngineError::Remote {
        message: "the remote index dropped a lookup unanswered".into(),
        retryable: true,
    }
}
