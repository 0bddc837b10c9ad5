//! The paper's message model (its section IV, equation (1)): the expected number of
//! messages a write request received by node `i` causes, in three phases: lookup
//! messages from `i` (phase 1), their responses (phase 2), and address notifications
//! (acknowledgements) for new chunks (phase 3). Pure arithmetic, no I/O.
//!
//! Each of the request's `c` chunks lands on a node uniformly at random (its
//! fingerprint's partition, partitions spread evenly), independently of the others.
//! Node `i` sends node `j` a phase-1 message iff at least one chunk maps to `j`, so
//!
//! ```text
//! P[i ->1 j] = P[i ->2 j] = 1 - (1 - 1/n)^c
//! P[i ->3 j] = 1 - (1 - 1/n)^(p_n c)      (the paper: |C_n| = p_n c new chunks)
//!            = 1 - (1 - p_n/n)^c          (exact when each chunk is new with p_n)
//! m = sum over targets j of (P[i ->1 j] + P[i ->2 j] + P[i ->3 j])
//! ```
//!
//! The targets are the `n - 1` other nodes in larder (a node answers its own
//! partitions in process, without a message: [`Targets::Others`]); the paper's sum
//! read literally runs over all `n` nodes ([`Targets::All`]). With `Others`, one node
//! sends nothing and a request of ever more chunks tends to `3 (n - 1)` messages; a
//! cluster far larger than `c` tends to `2c + p_n c` (every chunk its own owner).

/// Which nodes a request's messages go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Targets {
    /// The other `n - 1` nodes: the receiving node answers its own partitions in
    /// process (larder).
    Others,
    /// All `n` nodes, the receiving one included (the paper's sum read literally).
    All,
}

/// How the probability of a phase-3 message is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewChunks {
    /// The paper's: the `p_n c` new chunks (a real number) as the exponent.
    Paper,
    /// Each chunk new with probability `p_n`, independently: `1 - (1 - p_n/n)^c`.
    Bernoulli,
}

/// A write request, as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// Cluster size `n` (at least 1).
    pub nodes: u32,
    /// Expected chunks per request `c` (request size over average chunk size).
    pub chunks: f64,
    /// Probability `p_n` that a chunk is new, in `[0, 1]`.
    pub p_new: f64,
}

/// Expected messages per request, per phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Messages {
    pub lookups: f64,
    pub responses: f64,
    pub acks: f64,
}

impl Messages {
    pub fn total(&self) -> f64 {
        self.lookups + self.responses + self.acks
    }
}

impl Request {
    /// A request of `request_bytes` in chunks of `chunk_bytes` on average.
    pub fn from_sizes(nodes: u32, request_bytes: u64, chunk_bytes: u64, p_new: f64) -> Self {
        Self {
            nodes,
            chunks: request_bytes as f64 / chunk_bytes as f64,
            p_new,
        }
    }

    /// Probability that none of `k` chunks maps to a given node.
    fn misses(&self, k: f64) -> f64 {
        (1.0 - 1.0 / f64::from(self.nodes)).powf(k)
    }

    /// `P[i ->1 j]` (and `P[i ->2 j]`): at least one chunk maps to node `j`.
    pub fn p_lookup(&self) -> f64 {
        1.0 - self.misses(self.chunks)
    }

    /// `P[i ->3 j]`: at least one new chunk maps to node `j`.
    pub fn p_ack(&self, new: NewChunks) -> f64 {
        match new {
            NewChunks::Paper => 1.0 - self.misses(self.p_new * self.chunks),
            NewChunks::Bernoulli => {
                1.0 - (1.0 - self.p_new / f64::from(self.nodes)).powf(self.chunks)
            }
        }
    }

    /// Equation (1), per phase.
    pub fn expected(&self, targets: Targets, new: NewChunks) -> Messages {
        let n = f64::from(self.nodes);
        let to = match targets {
            Targets::Others => n - 1.0,
            Targets::All => n,
        };
        Messages {
            lookups: to * self.p_lookup(),
            responses: to * self.p_lookup(),
            acks: to * self.p_ack(new),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    const BOTH: [NewChunks; 2] = [NewChunks::Paper, NewChunks::Bernoulli];

    #[test]
    fn one_node_sends_nothing_to_others_and_at_most_three_to_itself() {
        let r = Request::from_sizes(1, 256 << 10, 8 << 10, 0.02);
        for new in BOTH {
            assert!(close(r.expected(Targets::Others, new).total(), 0.0));
            // All chunks map to the one node: one lookup and one response.
            let all = r.expected(Targets::All, new);
            assert!(close(all.lookups, 1.0) && close(all.responses, 1.0));
        }
        // An ack iff a chunk is new: always in the paper's form (0^0.64 = 0), with
        // probability 1 - 0.98^32 when each chunk is new with 2%.
        assert!(close(r.expected(Targets::All, NewChunks::Paper).acks, 1.0));
        let b = r.expected(Targets::All, NewChunks::Bernoulli).acks;
        assert!(close(b, 1.0 - 0.98f64.powi(32)), "{b}");
    }

    #[test]
    fn two_nodes_256k_requests_of_8k_chunks_by_hand() {
        // c = 32, p_n c = 0.64; P1 = 1 - 2^-32, P3 (paper) = 1 - 2^-0.64 = 0.358...,
        // P3 (Bernoulli) = 1 - 0.99^32 = 0.2750...
        let r = Request::from_sizes(2, 256 << 10, 8 << 10, 0.02);
        assert!(close(r.chunks, 32.0));
        let m = r.expected(Targets::Others, NewChunks::Paper);
        assert!(close(m.lookups, 1.0 - 0.5f64.powi(32)));
        assert!(close(m.acks, 1.0 - 0.5f64.powf(0.64)));
        assert!((m.acks - 0.358_29).abs() < 1e-5, "{m:?}");
        assert!((m.total() - 2.358_29).abs() < 1e-5, "{m:?}");
        let b = r.expected(Targets::Others, NewChunks::Bernoulli);
        assert!((b.acks - 0.275_02).abs() < 1e-5, "{b:?}");
        // Counting the receiving node too doubles every term with two nodes.
        let all = r.expected(Targets::All, NewChunks::Paper);
        assert!(close(all.total(), 2.0 * m.total()));
    }

    #[test]
    fn four_nodes_by_hand() {
        // n = 4, c = 16 (256 KB / 16 KB): P1 = 1 - 0.75^16 = 0.98998...
        let r = Request::from_sizes(4, 256 << 10, 16 << 10, 0.02);
        let m = r.expected(Targets::Others, NewChunks::Bernoulli);
        let p1 = 1.0 - 0.75f64.powi(16);
        assert!((p1 - 0.989_977).abs() < 1e-6);
        assert!(close(m.lookups, 3.0 * p1) && close(m.responses, 3.0 * p1));
        assert!(close(m.acks, 3.0 * (1.0 - 0.995f64.powi(16))));
    }

    #[test]
    fn many_chunks_tend_to_three_messages_per_other_node() {
        for n in 2..=8 {
            let r = Request {
                nodes: n,
                chunks: 1e6,
                p_new: 0.02,
            };
            for new in BOTH {
                let m = r.expected(Targets::Others, new).total();
                assert!((m - 3.0 * f64::from(n - 1)).abs() < 1e-6, "n {n}: {m}");
            }
        }
    }

    #[test]
    fn a_cluster_much_larger_than_a_request_sends_a_message_per_chunk() {
        let r = Request {
            nodes: 1 << 30,
            chunks: 32.0,
            p_new: 0.02,
        };
        let m = r.expected(Targets::Others, NewChunks::Bernoulli);
        assert!((m.lookups - 32.0).abs() < 1e-3, "{m:?}");
        assert!((m.acks - 0.64).abs() < 1e-3, "{m:?}");
    }

    #[test]
    fn no_new_chunks_no_acks_and_messages_grow_with_the_cluster() {
        let mut last = 0.0;
        for n in 1..=16 {
            let r = Request::from_sizes(n, 256 << 10, 4 << 10, 0.0);
            let m = r.expected(Targets::Others, NewChunks::Paper);
            assert!(close(m.acks, 0.0));
            assert!(m.total() >= last, "n {n}");
            last = m.total();
        }
    }
}
