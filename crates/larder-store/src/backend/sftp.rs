//! A repository in a directory of an SSH server, over SFTP (docs/design/sftp.md): the
//! local layout (`config`, `containers/<id>.ctr`, ...) below the URL's path, reached
//! through the system's `ssh` (so the user's ssh configuration applies) and the
//! `openssh-sftp-client` crate speaking SFTP v3 over its pipes.
//!
//! Invariants:
//! - a file is visible under its name complete or not at all: every write goes to
//!   `tmp/<random>.tmp`, is fsynced (where the server has `fsync@openssh.com`), and
//!   is then renamed (`posix-rename@openssh.com`, which replaces) or hard-linked
//!   (`hardlink@openssh.com`, which fails if the name exists: create-only) into place;
//! - one connection (one `ssh` process) at a time; a call that finds it dead fails
//!   transiently and drops it, and the next call connects anew.
//!
//! [`Backend`] is synchronous, so the backend owns a small tokio runtime, as
//! [`super::ObjectBackend`] does: each call is spawned there and waited for with
//! `futures::executor::block_on` (which, unlike `Runtime::block_on`, works inside
//! another runtime's tasks). Calls from several threads share the connection, each
//! with its own requests in flight.

mod ssh;

use std::future::Future;
use std::io;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use openssh_sftp_client::error::SftpErrorKind;
use openssh_sftp_client::file::File;
use openssh_sftp_client::metadata::Permissions;
use openssh_sftp_client::{Error as SftpError, Sftp, SftpOptions};
use tokio::io::AsyncSeek;
use tokio::process::Child;
use tokio::runtime::Runtime;

use super::{Backend, FileKind, FileVersion};
use crate::error::{Result, StoreError};
use ssh::StderrTail;
pub use ssh::{parse_sftp_url, SftpUrl, SshCommand};

/// Bytes per read or write request: OpenSSH's largest (its `limits@openssh.com`
/// answer, 256 KiB less 1 KiB of headers); the crate splits a request that a server
/// with smaller limits would refuse.
const PIECE: usize = 255 * 1024;
/// Requests of one file in flight at once: enough to fill a connection whose round
/// trip is a few milliseconds, at 4 MB of buffers per file.
const PIECES_IN_FLIGHT: usize = 16;
/// Threads of the backend's runtime: the work is I/O and the SFTP client's framing.
const RUNTIME_THREADS: usize = 2;
/// How long a failed connection attempt waits for ssh to exit and say why.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Files below a directory of an SFTP server.
pub struct SftpBackend {
    /// The live connection, if any; `None` after one was found dead.
    connection: Mutex<Option<Arc<Connection>>>,
    url: SftpUrl,
    command: SshCommand,
    /// The URL, for messages.
    location: String,
    runtime: OwnRuntime,
}

impl std::fmt::Debug for SftpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftpBackend")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// The backend's runtime, dropped without waiting for its tasks (see ObjectBackend's).
struct OwnRuntime(Option<Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// One SFTP session and the process carrying it (killed when dropped).
struct Connection {
    sftp: Sftp,
    ssh: Mutex<Child>,
    stderr: StderrTail,
}

/// A failed request, before it is given the file's name.
#[derive(Debug)]
struct CallError {
    kind: io::ErrorKind,
    message: String,
    /// The connection is gone (not the server refusing one request).
    lost: bool,
}

impl CallError {
    fn new(kind: io::ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            lost: false,
        }
    }
}

/// A server's answer keeps its meaning (no such file, permission denied, ...); every
/// other error of the client means that the session broke: transient.
impl From<SftpError> for CallError {
    fn from(e: SftpError) -> Self {
        let kind = match &e {
            SftpError::SftpError(code, _) => match code {
                SftpErrorKind::NoSuchFile => io::ErrorKind::NotFound,
                SftpErrorKind::PermDenied => io::ErrorKind::PermissionDenied,
                SftpErrorKind::OpUnsupported => io::ErrorKind::Unsupported,
                _ => io::ErrorKind::Other,
            },
            SftpError::UnsupportedExtension(_) => io::ErrorKind::Unsupported,
            _ => {
                return Self {
                    kind: io::ErrorKind::ConnectionReset,
                    message: format!("the SFTP session broke: {}", crate::error::error_chain(&e)),
                    lost: true,
                }
            }
        };
        let message = match &e {
            SftpError::SftpError(_, message) => message.get().0.to_string(),
            other => other.to_string(),
        };
        Self::new(kind, message)
    }
}

type CallResult<T> = std::result::Result<T, CallError>;

fn is_kind<T>(outcome: &CallResult<T>, kind: io::ErrorKind) -> bool {
    matches!(outcome, Err(e) if e.kind == kind)
}

impl SftpBackend {
    /// The repository at `url` (`sftp://[USER@]HOST[:PORT]/PATH`), reached by the ssh
    /// command of [`SshCommand::from_env`].
    pub fn from_url(url: &str) -> Result<Self> {
        Self::connect(url, SshCommand::from_env())
    }

    /// The repository at `url`, reached by `command`. Connects at once, so that a host
    /// that cannot be reached or refuses the login fails here, with ssh's words.
    pub fn connect(url: &str, command: SshCommand) -> Result<Self> {
        let parsed = parse_sftp_url(url)?;
        let location = url.trim_end_matches('/').to_string();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("larder-sftp")
            .enable_all()
            .build()
            .map_err(|e| StoreError::io(&location, e))?;
        let backend = Self {
            connection: Mutex::new(None),
            url: parsed,
            command,
            location,
            runtime: OwnRuntime(Some(runtime)),
        };
        backend.connection()?;
        Ok(backend)
    }

    /// How errors name `relative`: the URL and the path below it.
    fn describe(&self, relative: &str) -> PathBuf {
        match relative {
            "" => PathBuf::from(&self.location),
            _ => PathBuf::from(format!("{}/{relative}", self.location)),
        }
    }

    /// `relative`'s path on the server.
    fn remote(&self, relative: &str) -> PathBuf {
        match relative {
            "" => PathBuf::from(&self.url.path),
            _ => PathBuf::from(format!(
                "{}/{relative}",
                self.url.path.trim_end_matches('/')
            )),
        }
    }

    /// Runs `future` on the backend's runtime and waits for it on this thread.
    fn block<T: Send + 'static>(
        &self,
        future: impl Future<Output = CallResult<T>> + Send + 'static,
    ) -> CallResult<T> {
        let runtime = self.runtime.0.as_ref().expect("taken only by drop");
        match futures::executor::block_on(runtime.spawn(future)) {
            Ok(outcome) => outcome,
            Err(join) => Err(CallError::new(
                io::ErrorKind::Other,
                format!("SFTP request failed: {join}"),
            )),
        }
    }

    /// The live connection, made if there is none.
    fn connection(&self) -> Result<Arc<Connection>> {
        let mut slot = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(connection) = &*slot {
            return Ok(connection.clone());
        }
        let (url, command) = (self.url.clone(), self.command.clone());
        let connection = self
            .block(async move { Connection::open(&url, &command).await })
            .map_err(|e| {
                StoreError::io(
                    &self.location,
                    io::Error::new(e.kind, format!("connecting over ssh: {}", e.message)),
                )
            })?;
        let connection = Arc::new(connection);
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// Runs `call` on the connection; an error names `relative`, and one that lost the
    /// connection drops it (with what ssh said about it) so that the next call
    /// reconnects.
    fn call<T, F>(&self, relative: &str, call: impl FnOnce(Arc<Connection>) -> F) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = CallResult<T>> + Send + 'static,
    {
        let connection = self.connection()?;
        let outcome = self.block(call(connection.clone()));
        outcome.map_err(|mut e| {
            if e.lost {
                self.forget(&connection);
                let said = connection.exit_report();
                e.message = format!("{}; {said}", e.message);
            }
            StoreError::io(self.describe(relative), io::Error::new(e.kind, e.message))
        })
    }

    /// Drops `connection` if it is still the live one.
    fn forget(&self, connection: &Arc<Connection>) {
        let mut slot = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
            *slot = None;
        }
    }

    /// Writes `data` to a new file in `tmp/` (fsynced) and hands its path to `place`,
    /// which moves it to `relative` (and removes it if it is left); the temporary
    /// file is removed if anything fails.
    fn write_via_tmp<T, P>(&self, relative: &str, data: &[u8], place: P) -> Result<T>
    where
        T: Send + 'static,
        P: Fn(Arc<Connection>, PathBuf, PathBuf) -> PlaceFuture<T> + Send + Sync + 'static,
    {
        let tmp_relative = format!("tmp/{}.tmp", larder_crypto::random_id_hex(16));
        let (tmp, dest) = (self.remote(&tmp_relative), self.remote(relative));
        let data = Bytes::copy_from_slice(data);
        self.call(relative, move |c| async move {
            let uploaded = with_dirs(&c, &tmp, || upload(&c, &tmp, &data)).await;
            let placed = match uploaded {
                Ok(()) => {
                    with_dirs(&c, &dest, || place(c.clone(), tmp.clone(), dest.clone())).await
                }
                Err(e) => Err(e),
            };
            if matches!(&placed, Err(e) if !e.lost) {
                let _ = c.sftp.fs().remove_file(&tmp).await;
            }
            placed
        })
    }
}

type PlaceFuture<T> = Pin<Box<dyn Future<Output = CallResult<T>> + Send>>;

fn is_not_found(e: &SftpError) -> bool {
    matches!(e, SftpError::SftpError(SftpErrorKind::NoSuchFile, _))
}

/// `op`, made again after creating `path`'s parent directories (as `mkdir -p`) if it
/// fails for want of them: a kind's directory is made on its first file, and the
/// repository's own directory on its first write.
async fn with_dirs<T, F: Future<Output = CallResult<T>>>(
    c: &Connection,
    path: &Path,
    mut op: impl FnMut() -> F,
) -> CallResult<T> {
    let first = op().await;
    if !is_kind(&first, io::ErrorKind::NotFound) {
        return first;
    }
    let Some(dir) = path.parent() else {
        return first;
    };
    let mut fs = c.sftp.fs();
    let mut made = PathBuf::new();
    for part in dir.components() {
        made.push(part);
        if matches!(part, Component::Normal(_)) {
            // An existing directory fails with a generic failure: its existence is
            // what the retried `op` needs, and that tells. A new one is private
            // (`DIR_MODE` in the mkdir request's attributes; the server's umask may
            // take bits away, never add them).
            let _ = fs
                .dir_builder()
                .permissions(Permissions::from(super::DIR_MODE as u16))
                .create(&made)
                .await;
        }
    }
    op().await
}

/// Fails unless the mode of the file at `path` gives its group and others nothing
/// (asked by path: the crate refuses `fstat` on a handle opened only for writing).
async fn require_private(c: &Connection, path: &Path) -> CallResult<()> {
    let meta = c.sftp.fs().metadata(path).await?;
    let mode = meta.permissions().map(|p| p.as_raw().bits());
    match mode {
        Some(mode) if mode & 0o077 == 0 => Ok(()),
        _ => Err(CallError::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the server refuses to set the mode of a new file (fsetstat) and made it \
                 {}: others could read it; give the account a umask such as 077 \
                 (`sftp-server -u 077`)",
                mode.map_or("of unknown mode".into(), |m| format!("{m:o}"))
            ),
        )),
    }
}

/// Writes `data` into a new file at `path` (fails if it exists), `PIECES_IN_FLIGHT`
/// requests at a time, and fsyncs it where the server can. The pieces go out as
/// `Bytes` (`write_all_zero_copy`): the crate's copying `write_all` frames the data
/// through its serializer, and uploads ran at 10 MB/s against 46 to 61 MB/s so in the
/// test build (tests/sftp.rs, `threads_write_and_read_at_once`, over loopback).
///
/// The file is private (`FILE_MODE`) before it holds a byte: openssh-sftp-client 0.15
/// sends an open request with empty attributes, so the server first creates it with
/// its own default mode, and larder sets the mode on the open handle (fsetstat) at
/// once. Between the two the file is empty, in `tmp/` of a repository whose
/// directories larder made private.
async fn upload(c: &Connection, path: &Path, data: &Bytes) -> CallResult<()> {
    let mut file = c
        .sftp
        .options()
        .write(true)
        .create_new(true)
        .open(path)
        .await?;
    let private = file
        .set_permissions(Permissions::from(super::FILE_MODE as u16))
        .await;
    match private {
        // A server that lets no one change a mode (the account that refuses
        // overwrites, docs/design/sftp.md) made it private by its umask, or refuses.
        Err(SftpError::SftpError(SftpErrorKind::PermDenied, _)) => require_private(c, path).await?,
        set => set?,
    }
    futures::stream::iter((0..data.len()).step_by(PIECE))
        .map(|start| {
            let mut file = file.clone();
            let mut piece = [data.slice(start..(start + PIECE).min(data.len()))];
            async move {
                seek(&mut file, start as u64)?;
                file.write_all_zero_copy(&mut piece)
                    .await
                    .map_err(CallError::from)
            }
        })
        .buffer_unordered(PIECES_IN_FLIGHT)
        .try_collect::<()>()
        .await?;
    let mut file = file;
    if c.sftp.support_fsync() {
        file.sync_all().await?;
    }
    file.close().await?;
    Ok(())
}

fn seek(file: &mut File, offset: u64) -> CallResult<()> {
    Pin::new(file)
        .start_seek(io::SeekFrom::Start(offset))
        .map_err(|e| CallError::new(e.kind(), e.to_string()))
}

/// The bytes of `range` of `file`, in `PIECE`-sized requests in flight together; an
/// error if the file ends first.
async fn read_range(file: File, range: Range<u64>) -> CallResult<Vec<u8>> {
    let pieces: Vec<Range<u64>> = (range.start..range.end)
        .step_by(PIECE)
        .map(|start| start..(start + PIECE as u64).min(range.end))
        .collect();
    let got: Vec<Vec<u8>> = futures::stream::iter(pieces)
        .map(|piece| read_piece(file.clone(), piece))
        .buffered(PIECES_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(got.concat())
}

async fn read_piece(mut file: File, range: Range<u64>) -> CallResult<Vec<u8>> {
    let len = (range.end - range.start) as usize;
    let mut out = Vec::with_capacity(len);
    seek(&mut file, range.start)?;
    while out.len() < len {
        let want = (len - out.len()) as u32;
        match file.read(want, Default::default()).await? {
            Some(bytes) => out.extend_from_slice(&bytes),
            None => {
                return Err(CallError::new(
                    io::ErrorKind::InvalidData,
                    format!("range {range:?} ends past the file's end"),
                ))
            }
        }
    }
    Ok(out)
}

impl Connection {
    /// Starts ssh and the SFTP session over it; a failure says what ssh said.
    async fn open(url: &SftpUrl, command: &SshCommand) -> CallResult<Self> {
        // Not NotFound (a missing ssh is no missing file): permanent.
        let mut child = command.spawn(url).map_err(|e| {
            let program = &command.argv(url)[0];
            CallError::new(io::ErrorKind::Other, format!("starting {program:?}: {e}"))
        })?;
        let stderr = StderrTail::start(child.stderr.take());
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(CallError::new(io::ErrorKind::Other, "ssh has no pipes"));
        };
        match Sftp::new(stdin, stdout, SftpOptions::new()).await {
            Ok(sftp) => Ok(Self {
                sftp,
                ssh: Mutex::new(child),
                stderr,
            }),
            Err(e) => Err(Self::failed_start(&mut child, &stderr, &e).await),
        }
    }

    /// Why the session did not start: the other end answered but not in SFTP (a
    /// shell start-up file that prints, a command that is no SFTP server), or ssh
    /// exited (with what it said). The first is permanent.
    async fn failed_start(child: &mut Child, stderr: &StderrTail, e: &SftpError) -> CallError {
        if matches!(
            e,
            SftpError::SftpServerHelloMsgTooLong { .. }
                | SftpError::UnsupportedSftpProtocol { .. }
                | SftpError::FormatError(_)
                | SftpError::InvalidResponse(_)
        ) {
            let message = format!("the server does not speak SFTP ({e})");
            return CallError::new(io::ErrorKind::Other, message);
        }
        let status = tokio::time::timeout(EXIT_WAIT, child.wait()).await;
        let status = status.ok().and_then(Result::ok);
        let said = stderr.text_at_close(EXIT_WAIT).await;
        let mut message = ssh::describe_exit(status, &said);
        if said.is_empty() {
            message = format!("{message} ({e})");
        }
        CallError::new(ssh::failure_kind(&said), message)
    }

    /// What is known of ssh's end: its exit status, if it has exited, and its last
    /// words.
    fn exit_report(&self) -> String {
        let status = {
            let mut child = self.ssh.lock().unwrap_or_else(|e| e.into_inner());
            child.try_wait().ok().flatten()
        };
        ssh::describe_exit(status, &self.stderr.text())
    }
}

impl Backend for SftpBackend {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        let path = self.remote(&kind.relative_path(name));
        self.call(&kind.relative_path(name), move |c| async move {
            let mut file = c.sftp.open(&path).await?;
            let len = file.metadata().await?.len().unwrap_or(0);
            let data = read_range(file.clone(), 0..len).await?;
            file.close().await?;
            Ok(data)
        })
    }

    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        let path = self.remote(&kind.relative_path(name));
        let ranges = ranges.to_vec();
        self.call(&kind.relative_path(name), move |c| async move {
            let file = c.sftp.open(&path).await?;
            let got: Vec<Vec<u8>> = futures::stream::iter(ranges)
                .map(|range| read_range(file.clone(), range))
                .buffered(PIECES_IN_FLIGHT)
                .try_collect()
                .await?;
            file.close().await?;
            Ok(got)
        })
    }

    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        let path = self.remote(&kind.relative_path(name));
        self.call(&kind.relative_path(name), move |c| async move {
            let meta = c.sftp.fs().metadata(&path).await?;
            Ok(meta.len().unwrap_or(0))
        })
    }

    /// Renamed into place with `posix-rename@openssh.com`, which replaces a file of
    /// that name atomically. A server without it has only SFTP's own rename, which
    /// refuses to replace: the old file is removed first there, so a reader may find
    /// neither for a moment.
    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        self.write_via_tmp(&kind.relative_path(name), data, |c, tmp, dest| {
            Box::pin(async move {
                let mut fs = c.sftp.fs();
                let renamed = fs.rename(&tmp, &dest).await.map_err(CallError::from);
                if renamed.is_err()
                    && !c.sftp.support_posix_rename()
                    && !is_kind(&renamed, io::ErrorKind::NotFound)
                {
                    fs.remove_file(&dest).await?;
                    return Ok(fs.rename(&tmp, &dest).await?);
                }
                renamed
            })
        })
    }

    /// Hard-linked into place with `hardlink@openssh.com`, which fails if the name
    /// exists: of two writers, one wins. A server without the extension cannot create
    /// files exclusively and atomically: an error. Where the server refuses to remove
    /// the temporary name afterwards (an append-only account, `-P remove`), it stays:
    /// a second name of the same file, which costs no space (docs/design/sftp.md).
    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        self.write_via_tmp(&kind.relative_path(name), data, |c, tmp, dest| {
            Box::pin(async move {
                let mut fs = c.sftp.fs();
                let linked = match fs.hard_link(&tmp, &dest).await {
                    Ok(()) => true,
                    Err(e) if is_not_found(&e) || !matches!(e, SftpError::SftpError(..)) => {
                        return Err(e.into())
                    }
                    // An existing name fails as a generic failure: whether the name
                    // exists now tells.
                    Err(e) => match fs.metadata(&dest).await {
                        Ok(_) => false,
                        Err(_) => return Err(e.into()),
                    },
                };
                match fs.remove_file(&tmp).await {
                    Err(SftpError::SftpError(SftpErrorKind::PermDenied, _)) | Ok(()) => {}
                    Err(e) => return Err(e.into()),
                }
                Ok(linked)
            })
        })
    }

    /// Nothing left to do: each write fsyncs its file before renaming it. SFTP cannot
    /// fsync a directory, so a rename is as durable as the server's file system makes
    /// it by itself (docs/design/sftp.md, "Durability").
    fn sync(&self, _kind: FileKind) -> Result<()> {
        Ok(())
    }

    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        Ok(super::names_of(self.list_versions(kind)?))
    }

    fn list_sizes(&self, kind: FileKind) -> Result<Vec<(String, u64)>> {
        Ok(super::sizes_of(self.list_versions(kind)?))
    }

    /// One listing: SFTP lists sizes and modification times (in seconds, the tag)
    /// with names. A kind whose directory is missing has no files.
    fn list_versions(&self, kind: FileKind) -> Result<Vec<(String, FileVersion)>> {
        let entries = self.list_dir(kind.dir())?;
        let mut names: Vec<(String, FileVersion)> = entries
            .into_iter()
            .filter_map(|(file, v)| Some((kind.name_of(&file)?.to_string(), v)))
            .collect();
        names.sort();
        Ok(names)
    }

    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        let path = self.remote(&kind.relative_path(name));
        self.call(&kind.relative_path(name), move |c| async move {
            match c.sftp.fs().remove_file(&path).await {
                Err(e) if !is_not_found(&e) => Err(e.into()),
                _ => Ok(()),
            }
        })
    }

    /// Removes every file in `tmp/`: uploads that a killed writer left, and the
    /// temporary names that an append-only account kept. On such an account (the first
    /// removal refused) it stops and leaves them: nothing there is in the way.
    fn clean_tmp(&self) -> Result<usize> {
        let files = self.list_dir("tmp")?;
        let dir = self.remote("tmp");
        self.call("tmp", move |c| async move {
            let mut fs = c.sftp.fs();
            let mut removed = 0;
            for (file, _) in files {
                match fs.remove_file(dir.join(file)).await {
                    Ok(()) => removed += 1,
                    Err(SftpError::SftpError(SftpErrorKind::PermDenied, _)) => break,
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(removed)
        })
    }

    fn location(&self) -> String {
        self.location.clone()
    }
}

impl SftpBackend {
    /// The regular files in directory `relative` with their lengths and modification
    /// times; none if the directory is missing.
    fn list_dir(&self, relative: &str) -> Result<Vec<(String, FileVersion)>> {
        let dir = self.remote(relative);
        self.call(relative, move |c| async move {
            let opened = c.sftp.fs().open_dir(&dir).await;
            let dir = match opened {
                Err(e) if is_not_found(&e) => return Ok(Vec::new()),
                opened => opened?,
            };
            let entries: Vec<_> = dir.read_dir().try_collect().await?;
            Ok(entries
                .into_iter()
                .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
                .filter_map(|e| {
                    let name = e.filename().to_str()?.to_string();
                    let meta = e.metadata();
                    let tag = meta
                        .modified()
                        .map(|t| t.into_raw().to_string())
                        .unwrap_or_default();
                    let len = meta.len().unwrap_or(0);
                    Some((name, FileVersion { len, tag }))
                })
                .collect())
        })
    }
}
