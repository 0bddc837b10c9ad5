//! `backup`, `restore` and `snapshots` through a cluster's node (`--cluster`): the
//! first node that answers runs the job on its own file system and returns its summary
//! as JSON, which is printed as the node gave it.

use std::io::{self, Write};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use larder_cluster::rpc::{Job, JobClient};
use larder_engine::Warning;
use serde::Serialize;
use serde_json::Value;

use super::cluster::runtime;
use super::cluster_tls::TlsArgs;
use super::exit_code;
use crate::output::{shown, Output, Render};

/// Runs `job` on the first of `nodes` that answers, reached as `tls` says; its JSON
/// summary.
fn job(nodes: &[String], tls: &TlsArgs, job: Job) -> Result<Value> {
    let transport = tls.transport()?;
    runtime()?.block_on(async {
        let mut last = None;
        for addr in nodes {
            let client = match JobClient::connect(addr, &transport).await {
                Ok(client) => client,
                Err(e) => {
                    last = Some(anyhow::Error::new(e));
                    continue;
                }
            };
            let json = client
                .job(&job)
                .await
                .with_context(|| format!("node {addr}"))?;
            return serde_json::from_str(&json).context("the node's summary");
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no cluster node given")))
    })
}

/// `larder backup --cluster`: the node backs `paths` of its file system up. Exit code
/// 3 when the node reports warnings.
pub fn backup(
    nodes: &[String],
    tls: &TlsArgs,
    paths: &[PathBuf],
    out: &Output,
) -> Result<ExitCode> {
    let paths = paths
        .iter()
        .map(|p| {
            std::path::absolute(p)
                .map(|p| p.display().to_string())
                .with_context(|| format!("{}", p.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let summary = job(nodes, tls, Job::Backup { paths })?;
    let partial = summary["warnings"]
        .as_array()
        .is_some_and(|w| !w.is_empty());
    out.print(&RemoteBackup(summary))?;
    Ok(exit_code(partial))
}

/// `larder restore --cluster`: the node restores any node's snapshot into `target`
/// on its file system. Each path it could not restore is named on stderr, as a local
/// restore names it, and makes the exit code 3.
pub fn restore(
    nodes: &[String],
    tls: &TlsArgs,
    snapshot: &str,
    target: &Path,
    out: &Output,
) -> Result<ExitCode> {
    let target = std::path::absolute(target)?.display().to_string();
    let summary = job(
        nodes,
        tls,
        Job::Restore {
            snapshot: snapshot.to_string(),
            target,
        },
    )?;
    let warnings = node_warnings(&summary);
    for w in &warnings {
        out.path_warning(w);
    }
    out.print(&RemoteRestore(summary))?;
    Ok(exit_code(warnings.iter().any(|w| w.is_error)))
}

/// The warnings of a node's summary (`warnings`, as [`Warning`] serializes them: the
/// path as a string, with `path_hex` beside it where it is not UTF-8). An entry the
/// node garbled still counts, as an error on a path named "?".
fn node_warnings(summary: &Value) -> Vec<Warning> {
    let path = |w: &Value| -> PathBuf {
        let hex = w["path_hex"].as_str().and_then(from_hex);
        match (hex, w["path"].as_str()) {
            (Some(bytes), _) => PathBuf::from(std::ffi::OsString::from_vec(bytes)),
            (None, Some(text)) => PathBuf::from(text),
            (None, None) => PathBuf::from("?"),
        }
    };
    summary["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| Warning {
            path: path(w),
            message: w["message"].as_str().unwrap_or("?").to_string(),
            is_error: w["is_error"].as_bool().unwrap_or(true),
        })
        .collect()
}

/// Bytes from lowercase or uppercase hex digits, two per byte.
fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `larder snapshots --cluster`: every node's snapshots.
pub fn snapshots(nodes: &[String], tls: &TlsArgs, out: &Output) -> Result<ExitCode> {
    let snapshots = job(nodes, tls, Job::Snapshots)?;
    out.print(&RemoteSnapshots { snapshots })?;
    Ok(ExitCode::SUCCESS)
}

/// A node's backup summary.
#[derive(Serialize)]
#[serde(transparent)]
struct RemoteBackup(Value);

impl Render for RemoteBackup {
    fn notes(&self) -> Vec<String> {
        let s = &self.0;
        vec![format!(
            "snapshot {} saved: {} files, {} chunks ({} new), {} bytes new",
            s["snapshot_id"].as_str().unwrap_or("?"),
            s["files"],
            s["chunks"],
            s["chunks_new"],
            s["bytes_new"],
        )]
    }
}

/// A node's restore summary.
#[derive(Serialize)]
#[serde(transparent)]
struct RemoteRestore(Value);

impl Render for RemoteRestore {
    fn notes(&self) -> Vec<String> {
        let s = &self.0;
        vec![format!(
            "restored snapshot {}: {} files, {} bytes",
            s["snapshot_id"].as_str().unwrap_or("?"),
            s["files"],
            s["bytes"],
        )]
    }
}

/// Every node's snapshots; JSON: `{"snapshots": [...]}`, the array as the node gave
/// it, as `snapshots` gives one object.
#[derive(Serialize)]
struct RemoteSnapshots {
    snapshots: Value,
}

impl Render for RemoteSnapshots {
    /// What the command exists to show: `--quiet` leaves it, as it always has.
    const QUIET_SILENCES_TEXT: bool = false;

    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        // Every field comes from a node's storage: escaped, as any name.
        let field = |s: &Value, key: &str| shown(s[key].as_str().unwrap_or("?"));
        for s in self.snapshots.as_array().into_iter().flatten() {
            let paths: Vec<String> = s["paths"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(shown)
                .collect();
            writeln!(
                w,
                "{}  {}  {}  {}",
                field(s, "id").get(..16).unwrap_or("?"),
                field(s, "time"),
                field(s, "hostname"),
                paths.join(" ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use serde_json::json;

    use super::*;

    /// A node's warnings come back as the engine wrote them: a name that is not UTF-8
    /// from its `path_hex`, and an entry the node garbled as an error.
    #[test]
    fn a_nodes_warnings_come_back_whole() {
        let summary = json!({"warnings": [
            {"path": "/t/a\u{fffd}", "path_hex": "2f742f61ff", "message": "lost", "is_error": true},
            {"path": "/t/sock", "message": "skipped", "is_error": false},
            {"message": 7},
        ]});
        let warnings = node_warnings(&summary);
        assert_eq!(warnings.len(), 3);
        assert_eq!(warnings[0].path.as_os_str().as_bytes(), b"/t/a\xff");
        assert!(warnings[0].is_error && !warnings[1].is_error && warnings[2].is_error);
        assert_eq!(warnings[2].path, PathBuf::from("?"));
        assert!(node_warnings(&json!({})).is_empty());
        assert_eq!(from_hex("2f"), Some(vec![0x2f]));
        assert_eq!(from_hex("2"), None);
        assert_eq!(from_hex("zz"), None);
    }
}
