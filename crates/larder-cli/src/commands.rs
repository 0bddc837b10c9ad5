//! One module per subcommand, each with its arguments (a clap `Args` struct), its
//! `run`, and the typed result it hands to [`Output`](crate::output::Output) to print.
//! A new flag of a command is a change to that command's module alone. Beside them:
//! `device` (the `--device` option of `backup` and `chunk`) and `remote` (`backup`,
//! `restore` and `snapshots` through a cluster).

pub mod backup;
pub mod bench;
pub mod cat;
pub mod check;
pub mod chunk;
pub mod cluster;
pub mod cluster_tls;
pub mod copy;
pub mod device;
pub mod diff;
pub mod forget;
pub mod gc;
pub mod gen;
pub mod index;
pub mod init;
pub mod key;
pub mod ls;
pub mod mount;
pub mod node;
pub mod remote;
pub mod repair;
pub mod restore;
pub mod snapshots;
pub mod stats;
pub mod unlock;

use std::process::ExitCode;

use crate::repo_open::RepoOpener;

/// What the global options give a command, besides its output.
pub struct Globals {
    /// `--repo` and `--retry-lock`.
    pub repo: RepoOpener,
    /// `--cluster`: node lookup addresses to go through instead of a local repository;
    /// empty for the local one.
    pub cluster: Vec<String>,
    /// `--tls DIR` or `--insecure-plaintext`: how a cluster is reached.
    pub tls: cluster_tls::TlsArgs,
}

/// Exit code 0, or 3 for a partial success: a snapshot was saved or a restore
/// finished, but some files could not be read or restored.
pub fn exit_code(partial: bool) -> ExitCode {
    if partial {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}
