//! The workload: planning each generation of each client as extents (the Markov
//! chain, pool picks, edits, ground truth), and rendering a plan into bytes.

use std::io::Write;
use std::sync::Arc;

use serde::Serialize;

use crate::error::GenError;
use crate::extent::{Extent, Layout, Source};
use crate::model::{Fitted, Model, PoolPick, State, BLOCK};
use crate::rng::{derive_seed, Xoshiro256};

/// Seed labels: each purpose draws from its own streams (`derive_seed`).
const LABEL_CLIENT: u64 = 1;
const LABEL_UNIQUE: u64 = 2;
const LABEL_POOL: u64 = 3;

/// Bytes handed to the sink at a time.
const WRITE_BUFFER: usize = 1 << 20;

/// What to generate.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    pub seed: u64,
    /// Bytes of each generation of each client.
    pub generation_size: u64,
    pub generations: u32,
    pub clients: u32,
    pub model: Model,
}

/// One sampled run: its state, the length drawn (bytes, continuous) and that length
/// rounded up to whole blocks. The run written may be shorter: the last run of a
/// generation ends at the generation's size, and a BR run at the end of the previous
/// generation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Run {
    pub state: State,
    pub sampled: f64,
    pub rounded: u64,
}

/// Ground truth of one generation of one client. Every byte is either new (never
/// written before by this workload) or a copy of bytes written earlier (in this or an
/// earlier generation, by any client): `bytes == new_bytes + duplicate bytes`.
/// A duplicate byte is one of: a pool block's byte written before (R runs always
/// write a block from its start, so what was written of it is a prefix), a BR copy.
/// New bytes are U runs, insertions, and pool bytes written for the first time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Truth {
    pub generation: u32,
    pub client: u32,
    pub bytes: u64,
    pub new_bytes: u64,
    /// Bytes of U runs.
    pub unique_bytes: u64,
    /// Bytes of R runs (pool blocks).
    pub pool_bytes: u64,
    /// Bytes of BR runs (copied from the previous generation).
    pub copied_bytes: u64,
    /// Bytes inserted by edits (new).
    pub inserted_bytes: u64,
    /// Bytes of the previous generation skipped by deletions.
    pub deleted_bytes: u64,
    pub insertions: u64,
    pub deletions: u64,
}

impl Truth {
    pub fn duplicate_bytes(&self) -> u64 {
        self.bytes - self.new_bytes
    }
}

/// A planned generation: its truth, its runs, and the extents that `Workload::write`
/// renders.
#[derive(Clone, Debug)]
pub struct Generation {
    pub truth: Truth,
    pub runs: Vec<Run>,
    layout: Arc<Layout>,
}

impl Generation {
    /// The extents, in order; their lengths sum to the generation's size.
    pub fn extents(&self) -> &[Extent] {
        self.layout.extents()
    }
}

struct Client {
    rng: Xoshiro256,
    previous: Option<Arc<Layout>>,
}

/// Generations are planned in order: generation 1 of every client, then generation 2
/// of every client, and so on, so that the ground truth of pool blocks (shared by all
/// clients) is counted in the order the generations are written.
pub struct Workload {
    config: Config,
    fitted: Fitted,
    pool: Vec<u8>,
    /// How many bytes of each pool block have been written before (a prefix).
    pool_seen: Vec<u16>,
    clients: Vec<Client>,
    /// The next unused unique block id, shared by all clients.
    next_unique: u64,
    /// The next generation to plan (1-based) and client.
    next: (u32, u32),
}

impl Workload {
    pub fn new(config: Config) -> Result<Self, GenError> {
        if config.generations == 0 || config.clients == 0 {
            return Err(GenError::Config(
                "need at least one generation and one client".into(),
            ));
        }
        if config.generation_size == 0 {
            return Err(GenError::Config("the generation size must not be 0".into()));
        }
        let fitted = Fitted::new(config.model.clone())?;
        let blocks = config.model.pool_blocks as usize;
        let mut pool = vec![0u8; blocks * BLOCK as usize];
        for (i, block) in pool.chunks_exact_mut(BLOCK as usize).enumerate() {
            Xoshiro256::new(derive_seed(config.seed, LABEL_POOL, i as u64)).fill(block);
        }
        let clients = (0..config.clients)
            .map(|c| Client {
                rng: Xoshiro256::new(derive_seed(config.seed, LABEL_CLIENT, u64::from(c))),
                previous: None,
            })
            .collect();
        Ok(Workload {
            pool_seen: vec![0; blocks],
            fitted,
            pool,
            clients,
            next_unique: 0,
            next: (1, 0),
            config,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn fitted(&self) -> &Fitted {
        &self.fitted
    }

    /// Plans the next generation, or `None` after the last one.
    pub fn next_generation(&mut self) -> Option<Generation> {
        let (generation, client) = self.next;
        if generation > self.config.generations {
            return None;
        }
        self.next = if client + 1 < self.config.clients {
            (generation, client + 1)
        } else {
            (generation + 1, 0)
        };
        let c = &mut self.clients[client as usize];
        let mut planner = Planner {
            fitted: &self.fitted,
            rng: &mut c.rng,
            pool_seen: &mut self.pool_seen,
            next_unique: &mut self.next_unique,
            size: self.config.generation_size,
            layout: Layout::default(),
            runs: Vec::new(),
            truth: Truth {
                generation,
                client,
                ..Truth::default()
            },
        };
        match &c.previous {
            None => planner.first(),
            Some(previous) => planner.later(previous),
        }
        let Planner {
            layout,
            runs,
            truth,
            ..
        } = planner;
        let layout = Arc::new(layout);
        c.previous = Some(layout.clone());
        Some(Generation {
            truth,
            runs,
            layout,
        })
    }

    /// Writes the bytes of `generation` to `sink`, in large writes.
    pub fn write<W: Write>(&self, generation: &Generation, sink: &mut W) -> Result<(), GenError> {
        let b = BLOCK as usize;
        let mut buf = vec![0u8; WRITE_BUFFER];
        let mut scratch = [0u8; BLOCK as usize];
        let mut fill = 0;
        let pool_blocks = u64::from(self.config.model.pool_blocks);
        for e in generation.extents() {
            let mut block = e.first;
            let mut offset = e.offset as usize;
            let mut left = e.len;
            while left > 0 {
                let take = (b - offset).min(left as usize);
                if fill + b > buf.len() {
                    sink.write_all(&buf[..fill])?;
                    fill = 0;
                }
                let dst = &mut buf[fill..fill + take];
                match e.source {
                    Source::Unique => {
                        let mut rng =
                            Xoshiro256::new(derive_seed(self.config.seed, LABEL_UNIQUE, block));
                        if take == b {
                            rng.fill(dst);
                        } else {
                            rng.fill(&mut scratch[..offset + take]);
                            dst.copy_from_slice(&scratch[offset..offset + take]);
                        }
                    }
                    Source::Pool => {
                        let at = (block % pool_blocks) as usize * b + offset;
                        dst.copy_from_slice(&self.pool[at..at + take]);
                    }
                }
                fill += take;
                left -= take as u64;
                block += 1;
                offset = 0;
            }
        }
        sink.write_all(&buf[..fill])?;
        Ok(())
    }
}

/// Plans one generation of one client.
struct Planner<'a> {
    fitted: &'a Fitted,
    rng: &'a mut Xoshiro256,
    pool_seen: &'a mut [u16],
    next_unique: &'a mut u64,
    size: u64,
    layout: Layout,
    runs: Vec<Run>,
    truth: Truth,
}

impl Planner<'_> {
    fn remaining(&self) -> u64 {
        self.size - self.layout.len()
    }

    /// Draws a run of `state`, records it, and returns its length rounded up to whole
    /// blocks (at least one).
    fn draw(&mut self, state: State) -> u64 {
        let sampled = self.fitted.distribution(state).sample(self.rng);
        let rounded = (sampled / BLOCK as f64).ceil().max(1.0) as u64 * BLOCK;
        self.runs.push(Run {
            state,
            sampled,
            rounded,
        });
        rounded
    }

    /// Generation 1: U and R runs alternate, starting with U.
    fn first(&mut self) {
        let mut state = State::U;
        while self.remaining() > 0 {
            let len = self.draw(state).min(self.remaining());
            self.emit(state, len);
            state = if state == State::U {
                State::R
            } else {
                State::U
            };
        }
        self.truth.bytes = self.layout.len();
    }

    /// Later generations: the Markov chain over U, R and BR, starting in BR. Every run
    /// advances the position in the previous generation by the bytes it writes
    /// ("the same position"), except that insertions do not advance it and deletions
    /// advance it without writing.
    fn later(&mut self, previous: &Layout) {
        let mut state = State::BR;
        let mut prev_pos = 0u64;
        while self.remaining() > 0 {
            let len = self.draw(state).min(self.remaining());
            match state {
                State::U | State::R => {
                    self.emit(state, len);
                    prev_pos += len;
                }
                State::BR => prev_pos = self.copy(previous, prev_pos, len),
            }
            state = self.next_state(state);
        }
        self.truth.bytes = self.layout.len();
    }

    fn next_state(&mut self, from: State) -> State {
        let t = &self.fitted.model.transitions;
        let u = self.rng.next_f64();
        let mut acc = 0.0;
        for to in State::ALL {
            acc += t.p(from, to);
            if u < acc {
                return to;
            }
        }
        // Rounding left u >= the row's sum (1 up to an ulp): the row's last state.
        State::ALL
            .into_iter()
            .rev()
            .find(|&to| t.p(from, to) > 0.0)
            .unwrap_or(State::U)
    }

    /// A U or R run of `len` bytes.
    fn emit(&mut self, state: State, len: u64) {
        match state {
            State::U => {
                self.unique(len);
                self.truth.unique_bytes += len;
            }
            State::R => self.pool_run(len),
            State::BR => unreachable!("BR runs are copies"),
        }
    }

    fn unique(&mut self, len: u64) {
        self.layout.push(Extent {
            source: Source::Unique,
            first: *self.next_unique,
            offset: 0,
            len,
        });
        *self.next_unique += len.div_ceil(BLOCK);
        self.truth.new_bytes += len;
    }

    /// An exponentially distributed pool index (drawn again when past the pool).
    fn pick(&mut self) -> u64 {
        let blocks = self.pool_seen.len() as f64;
        loop {
            let x = self.rng.next_exp(self.fitted.model.pool_pick_mean);
            if x < blocks {
                return x as u64;
            }
        }
    }

    fn pool_run(&mut self, len: u64) {
        let blocks = self.pool_seen.len() as u64;
        let run_start = match self.fitted.model.pool_pick {
            PoolPick::Run => Some(self.pick()),
            PoolPick::Block => None,
        };
        let mut done = 0;
        let mut k = 0;
        while done < len {
            let bytes = BLOCK.min(len - done);
            let index = match run_start {
                Some(s) => (s + k) % blocks,
                None => self.pick(),
            };
            if run_start.is_none() || k == 0 {
                self.layout.push(Extent {
                    source: Source::Pool,
                    first: index,
                    offset: 0,
                    len: if run_start.is_some() { len } else { bytes },
                });
            }
            // Invariant: bytes <= BLOCK = 4096, so the prefix length fits a u16.
            let seen = &mut self.pool_seen[index as usize];
            let bytes16 = bytes as u16;
            self.truth.new_bytes += u64::from(bytes16.saturating_sub(*seen));
            *seen = (*seen).max(bytes16);
            done += bytes;
            k += 1;
        }
        self.truth.pool_bytes += len;
    }

    /// A BR run: copies `len` bytes of `previous` from `prev_pos` (fewer where the
    /// previous generation ends), with edits at exponential gaps. Returns the new
    /// position in the previous generation.
    fn copy(&mut self, previous: &Layout, mut prev_pos: u64, len: u64) -> u64 {
        let edits = self.fitted.model.edits;
        let mut left = len;
        while left > 0 && self.remaining() > 0 {
            let available = previous.len().saturating_sub(prev_pos);
            if available == 0 {
                break;
            }
            let gap = edits.map_or(u64::MAX, |e| {
                (self.rng.next_exp(e.mean_gap as f64) as u64).max(1)
            });
            let piece = left.min(gap).min(available).min(self.remaining());
            previous.copy_range(prev_pos, piece, &mut self.layout);
            self.truth.copied_bytes += piece;
            prev_pos += piece;
            left -= piece;
            if let (Some(e), true) = (edits, piece == gap && left > 0) {
                let n = self.rng.range_inclusive(1, u64::from(e.max_len));
                if self.rng.next_u64() & 1 == 0 {
                    let n = n.min(self.remaining());
                    if n > 0 {
                        self.unique(n);
                        self.truth.inserted_bytes += n;
                        self.truth.insertions += 1;
                    }
                } else {
                    prev_pos += n;
                    self.truth.deleted_bytes += n;
                    self.truth.deletions += 1;
                }
            }
        }
        prev_pos
    }
}
