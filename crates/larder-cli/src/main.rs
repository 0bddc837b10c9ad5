//! `larder`: back up directory trees into a deduplicating repository.
//!
//! Exit codes: 0 success; 1 failure (nothing was committed, or `check` found damage);
//! 2 usage error; 3 partial success (a snapshot was saved or a restore finished, but
//! some files could not be read or restored). Under `--json`, a failure or usage error
//! prints `{"error": MESSAGE, "exit_code": CODE}` on stdout, the command line's own
//! errors included.

mod commands;
mod duration;
mod host;
mod location;
mod output;
mod password;
mod pattern_args;
mod repo_open;
mod security;
mod size;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use larder_engine::escape_controls;

use crate::commands::{
    backup, bench, cat, check, chunk, cluster, cluster_tls, copy, diff, forget, gc, gen, index,
    init, key, ls, mount, node, repair, restore, snapshots, stats, unlock, Globals,
};
use crate::output::{error_json, Output, SafeLines};
use crate::repo_open::RepoOpener;

#[derive(Parser)]
#[command(name = "larder", version, about = "Fast exact-deduplication backups")]
struct Cli {
    /// Repository: a path, file://PATH, s3://BUCKET/PREFIX or
    /// sftp://[USER@]HOST[:PORT]/PATH [default: $XDG_DATA_HOME/larder/repo, created on
    /// first use]
    #[arg(long, global = true, env = "LARDER_REPO", value_parser = location::parse)]
    repo: Option<location::RepoLocation>,
    /// Print machine-readable JSON on stdout instead of text
    #[arg(long, global = true)]
    json: bool,
    /// Print nothing but errors
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Wait up to DURATION (e.g. 30s, 5m) for a repository lock held by another process
    #[arg(long, global = true, value_name = "DURATION", value_parser = duration::parse)]
    retry_lock: Option<Duration>,
    /// Take no lock, for storage where none can be taken (read-only): only commands
    /// that read accept it, and a writer running meanwhile may make them fail
    #[arg(long, global = true)]
    no_lock: bool,
    /// Attempts per request to a remote repository that fails transiently (dropped
    /// connection, throttling, server error), with growing pauses between them
    #[arg(
        long,
        global = true,
        value_name = "N",
        default_value_t = 8,
        env = "LARDER_RETRIES",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    retries: u32,
    /// Back up, restore and list snapshots through a cluster's nodes instead of a local
    /// repository: node lookup addresses, comma-separated, tried in order (paths are
    /// read and restored on the node's file system; docs/design/cluster.md)
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        value_name = "ADDR,...",
        env = "LARDER_CLUSTER"
    )]
    cluster: Vec<String>,
    #[command(flatten)]
    tls: cluster_tls::TlsArgs,
    #[command(flatten)]
    password: password::PasswordArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a repository
    Init(init::InitArgs),
    /// Back up files and directories into a new snapshot
    Backup(backup::BackupArgs),
    /// Restore a snapshot (an id prefix, or `latest`) into TARGET
    Restore(restore::RestoreArgs),
    /// List the entries of a snapshot, or those at and below PATH
    Ls(ls::LsArgs),
    /// Show what changed between two snapshots: added, removed and modified entries
    Diff(diff::DiffArgs),
    /// Write the content of one file of a snapshot to standard output
    #[command(visible_alias = "dump")]
    Cat(cat::CatArgs),
    /// Mount the snapshots as a read-only file system (FUSE) until SIGINT or SIGTERM:
    /// ids/ID, snapshots/TIME, hosts/HOST/TIME and latest (docs/design/mount.md)
    Mount(mount::MountArgs),
    /// List snapshots
    Snapshots(snapshots::SnapshotsArgs),
    /// Verify the repository; with --read-data, every chunk too
    Check(check::CheckArgs),
    /// Show repository statistics
    Stats(stats::StatsArgs),
    /// Rebuild the index from the containers alone (= `larder index rebuild`)
    RebuildIndex(index::RebuildArgs),
    /// The fingerprint index: rebuild it, or convert it between memory and disk
    #[command(subcommand)]
    Index(index::IndexCommand),
    /// Copy snapshots from another repository (--from-repo) into this one, sending only
    /// the chunks it lacks
    Copy(copy::CopyArgs),
    /// Remove snapshots, named or by a retention policy (their data stays until gc)
    Forget(forget::ForgetArgs),
    /// Delete the data no snapshot uses, repacking containers that are mostly dead
    #[command(visible_alias = "prune")]
    Gc(gc::GcArgs),
    /// Repair damage: salvage intact chunks, remove lost ones from the index (the next
    /// backup stores them again), and write copies of the snapshots that lost data
    /// without it, naming every file left out (docs/design/repair.md)
    Repair(repair::RepairArgs),
    /// An encrypted repository's keys: list, add (also write-only), remove, passwd
    #[command(subcommand)]
    Key(key::KeyCommand),
    /// Remove what killed processes left of the lock: a stale lock note, or stale lock
    /// objects of a remote repository
    Unlock(unlock::UnlockArgs),
    /// Chunk files (no repository): chunk sizes, dedup ratio, chunking speed
    Chunk(chunk::ChunkArgs),
    /// Synthetic backup generations (no repository): stdout, or --out DIR
    Gen(gen::GenArgs),
    /// Run a dedup node of a cluster: it serves its share of the partitioned chunk
    /// index to the other nodes, until SIGINT or SIGTERM (docs/design/cluster.md)
    Node(node::NodeArgs),
    /// Create a cluster, or show its nodes, master, partitions and message rates
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Benchmarks (no repository)
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return command_line_error(e),
    };
    // Log lines may name hostile paths and objects: written through `SafeLines`, and
    // without colours, whose escape sequences it would show.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("LARDER_LOG"))
        .with_ansi(false)
        .with_writer(|| SafeLines(std::io::stderr()))
        .init();
    let out = Output::new(cli.json, cli.quiet);
    match run(cli, &out) {
        Ok(code) => code,
        Err(e) if stdout_closed(&e) => die_of_sigpipe(),
        Err(e) => {
            out.error(&e);
            ExitCode::FAILURE
        }
    }
}

/// What clap found wrong with the command line, or the help or version it was asked
/// for (stdout, exit code 0). An error is a usage error (exit code 2): clap's message
/// on stderr, and under `--json` one JSON object on stdout too.
fn command_line_error(e: clap::Error) -> ExitCode {
    if !e.use_stderr() {
        // Help and version: clap prints them on stdout and exits 0.
        e.exit();
    }
    let rendered = shown_error(e).render().to_string();
    if json_requested(std::env::args_os().skip(1)) {
        // The message is the first paragraph (a list of missing arguments included).
        let first = rendered.split("\n\n").next().unwrap_or_default();
        let first = first.strip_prefix("error: ").unwrap_or(first);
        let message: Vec<&str> = first.lines().map(str::trim).collect();
        println!("{}", error_json(&message.join(" "), 2));
    }
    for line in rendered.trim_end().lines() {
        eprintln!("{}", escape_controls(line.as_bytes()));
    }
    ExitCode::from(2)
}

/// `e` as clap renders it for the command line with every argument escaped
/// (`escape_controls`), so that an argument it echoes back can neither forge a line
/// nor send escapes; `e` itself where that line fails otherwise (an argument that was
/// wrong only for its raw bytes), then written line by line, escaped.
fn shown_error(e: clap::Error) -> clap::Error {
    let escaped = std::env::args_os().map(|a| escape_controls(a.as_encoded_bytes()));
    match Cli::try_parse_from(escaped) {
        Err(same) if same.kind() == e.kind() => same,
        _ => e,
    }
}

/// Whether `--json` is among larder's own arguments (before a `--`), for a command
/// line clap refused before it could say.
fn json_requested(args: impl Iterator<Item = OsString>) -> bool {
    args.take_while(|a| a != "--").any(|a| a == "--json")
}

/// Whether `e` is a write to standard output that found it closed (`larder snapshots
/// | head`): a broken pipe that no repository error carries. SIGPIPE stays ignored, as
/// Rust sets it, so that a remote repository's connection (a socket, ssh's pipes) that
/// breaks is an error to retry, never a signal that kills larder mid-backup.
fn stdout_closed(e: &anyhow::Error) -> bool {
    let broken_pipe = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    });
    broken_pipe && !e.chain().any(|c| c.is::<larder_store::StoreError>())
}

/// Ends larder as a Unix tool whose reader went away ends: quietly, by SIGPIPE. Safe
/// in a backup too: nothing is committed out of order (docs/design/format.md).
fn die_of_sigpipe() -> ExitCode {
    // SAFETY: SIG_DFL is a valid disposition for SIGPIPE; raising it then ends the
    // process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    ExitCode::from(141)
}

fn run(cli: Cli, out: &Output) -> Result<ExitCode> {
    let g = Globals {
        repo: RepoOpener::new(
            cli.repo,
            cli.retry_lock.unwrap_or_default(),
            cli.retries,
            cli.no_lock,
            cli.password,
        ),
        cluster: cli.cluster,
        tls: cli.tls,
    };
    if let (false, Some(name)) = (g.cluster.is_empty(), repository_only(&cli.command)) {
        return Ok(out.usage(&format!(
            "`larder {name}` works on a repository, not through a cluster: --cluster (or \
             LARDER_CLUSTER) does not apply to it; unset it to use the repository --repo names"
        )));
    }
    match cli.command {
        Command::Init(args) => init::run(args, &g, out),
        Command::Backup(args) => backup::run(args, &g, out),
        Command::Restore(args) => restore::run(args, &g, out),
        Command::Ls(args) => ls::run(args, &g, out),
        Command::Diff(args) => diff::run(args, &g, out),
        Command::Cat(args) => cat::run(args, &g, out),
        Command::Mount(args) => mount::run(args, &g, out),
        Command::Snapshots(args) => snapshots::run(args, &g, out),
        Command::Check(args) => check::run(args, &g, out),
        Command::Stats(args) => stats::run(args, &g, out),
        Command::RebuildIndex(args) => index::rebuild(args, &g, out),
        Command::Index(command) => index::run(command, &g, out),
        Command::Copy(args) => copy::run(args, &g, out),
        Command::Forget(args) => forget::run(args, &g, out),
        Command::Gc(args) => gc::run(args, &g, out),
        Command::Repair(args) => repair::run(args, &g, out),
        Command::Key(command) => key::run(command, &g, out),
        Command::Unlock(args) => unlock::run(args, &g, out),
        Command::Chunk(args) => chunk::run(args, out),
        Command::Gen(args) => gen::run(args, out),
        Command::Node(args) => node::run(args, &g.repo.password, &g.tls, out),
        Command::Cluster(command) => cluster::run(command, &g.repo.password, &g.tls, out),
        Command::Bench(args) => bench::run(args, out),
    }
}

/// The name of `command` where it works on a repository and has no cluster form (only
/// backup, restore and snapshots go through a cluster; mount says so itself), so that
/// `--cluster` is refused there rather than ignored: ignored, `larder --cluster NODE
/// forget` would act on the local default repository.
fn repository_only(command: &Command) -> Option<&'static str> {
    Some(match command {
        Command::Init(_) => "init",
        Command::Ls(_) => "ls",
        Command::Diff(_) => "diff",
        Command::Cat(_) => "cat",
        Command::Check(_) => "check",
        Command::Stats(_) => "stats",
        Command::RebuildIndex(_) | Command::Index(_) => "index",
        Command::Copy(_) => "copy",
        Command::Forget(_) => "forget",
        Command::Gc(_) => "gc",
        Command::Repair(_) => "repair",
        Command::Key(_) => "key",
        Command::Unlock(_) => "unlock",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_requested_only_before_a_double_dash() {
        let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(json_requested(args(&["--json", "frobnicate"]).into_iter()));
        assert!(json_requested(args(&["restore", "--json"]).into_iter()));
        assert!(!json_requested(args(&["ls", "--", "--json"]).into_iter()));
        assert!(!json_requested(args(&["--jsonx"]).into_iter()));
    }
}
