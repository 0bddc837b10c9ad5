//! A repository's immutable files in S3-compatible object storage (docs/design/format.md,
//! "Object storage"): `<prefix>/<kind dir>/<name>.<ext>`, the local layout's paths as
//! keys, through the `object_store` crate.
//!
//! [`Backend`] is synchronous and its callers are plain threads and tokio blocking
//! threads of other runtimes, so the backend owns a small runtime of its own: every
//! request is spawned there and the caller waits on the task's handle with
//! `futures::executor::block_on`, never with `Runtime::block_on` (which panics inside
//! another runtime).

use std::future::Future;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig};
use tokio::runtime::Runtime;

use super::{Backend, FileKind, FileVersion};
use crate::error::{Result, StoreError};

/// Threads of the backend's runtime: requests are I/O-bound, two keep several in
/// flight.
const RUNTIME_THREADS: usize = 2;

/// Files under a key prefix of an object store. A put is atomic (an object is visible
/// complete or not at all) and durable once acknowledged, so `sync` has nothing to do.
pub struct ObjectBackend {
    store: Arc<dyn ObjectStore>,
    /// Keys start with this prefix and a `/`, unless it is empty.
    prefix: String,
    /// `s3://bucket` (or another store's name), for error messages.
    location: String,
    /// Shared by the backends [`ObjectBackend::sub`] makes.
    runtime: Arc<OwnRuntime>,
}

/// The backend's runtime. Dropped without waiting for its tasks: dropping a runtime
/// inside another runtime's task would panic, and a request still running when its
/// caller gave up has no one to answer.
struct OwnRuntime(Option<Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for ObjectBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectBackend")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// An `s3://bucket/prefix` URL's bucket and prefix (without slashes at its ends).
pub fn parse_s3_url(url: &str) -> Result<(String, String)> {
    let invalid = |why: &str| StoreError::Config(format!("storage URL {url:?}: {why}"));
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| invalid("expected s3://bucket/prefix"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(invalid("no bucket"));
    }
    Ok((bucket.to_string(), prefix.trim_matches('/').to_string()))
}

impl ObjectBackend {
    /// Files under `prefix` (no leading or trailing `/`; empty for the whole store) of
    /// `store`; `location` names the store in error messages.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, location: &str) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("larder-object-store")
            .enable_all()
            .build()
            .map_err(|e| StoreError::io(location, e))?;
        Ok(Self {
            store,
            prefix: prefix.trim_matches('/').to_string(),
            location: location.trim_end_matches('/').to_string(),
            runtime: Arc::new(OwnRuntime(Some(runtime))),
        })
    }

    /// The S3 bucket and prefix of `url` (`s3://bucket/prefix`), with the endpoint,
    /// region and credentials from the standard AWS environment variables
    /// (`AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, ...).
    pub fn from_url(url: &str) -> Result<Self> {
        let (bucket, prefix) = parse_s3_url(url)?;
        // One retry layer, larder's own (`RetryBackend`), over every backend alike.
        let no_retries = RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        };
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            .with_retry(no_retries)
            .build()
            .map_err(|e| StoreError::Config(format!("storage URL {url:?}: {e}")))?;
        Self::new(Arc::new(store), &prefix, &format!("s3://{bucket}"))
    }

    /// A backend on the same store and runtime for the keys under `sub` (relative to
    /// this backend's prefix).
    pub fn sub(&self, sub: &str) -> Self {
        Self {
            store: self.store.clone(),
            prefix: self.key(sub.trim_matches('/')),
            location: self.location.clone(),
            runtime: self.runtime.clone(),
        }
    }

    /// The object store and the prefix this backend's keys start with.
    pub fn store(&self) -> (&Arc<dyn ObjectStore>, &str) {
        (&self.store, &self.prefix)
    }

    /// The full key of `relative` (a `/`-separated path below the prefix).
    fn key(&self, relative: &str) -> String {
        if self.prefix.is_empty() {
            relative.to_string()
        } else {
            format!("{}/{relative}", self.prefix)
        }
    }

    fn path(&self, relative: &str) -> ObjectPath {
        ObjectPath::from(self.key(relative))
    }

    /// How errors name `relative`: the store's URL and the full key.
    pub fn describe(&self, relative: &str) -> PathBuf {
        PathBuf::from(format!("{}/{}", self.location, self.key(relative)))
    }

    /// `e` as a store error: an S3 `NoSuchBucket` answer names the bucket (a missing
    /// bucket is not a missing repository), anything else the object it concerned.
    fn error(&self, relative: &str, e: object_store::Error) -> StoreError {
        let chain = crate::error::error_chain(&e);
        if chain.contains("<Code>NoSuchBucket</Code>") {
            return StoreError::NoSuchBucket(self.location.clone());
        }
        StoreError::io(
            self.describe(relative),
            io::Error::new(error_kind(&e), chain),
        )
    }

    /// Runs `request` on the backend's runtime and waits for it on this thread.
    fn run<T: Send + 'static>(
        &self,
        relative: &str,
        request: impl Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> Result<T> {
        let runtime = self.runtime.0.as_ref().expect("taken only by drop");
        let task = runtime.spawn(request);
        match futures::executor::block_on(task) {
            Ok(outcome) => outcome.map_err(|e| self.error(relative, e)),
            Err(join) => Err(StoreError::io(
                self.describe(relative),
                io::Error::other(format!("object store request failed: {join}")),
            )),
        }
    }

    /// The object at `relative`.
    pub fn get(&self, relative: &str) -> Result<Vec<u8>> {
        let (store, path) = (self.store.clone(), self.path(relative));
        self.run(relative, async move {
            let got = store.get(&path).await?;
            got.bytes().await.map(|b| b.to_vec())
        })
    }

    /// Stores `data` at `relative`, atomically: replacing any object there, or with
    /// `create_only` refusing (`Ok(false)`) when one exists (a conditional put,
    /// `If-None-Match: *`).
    pub fn put(&self, relative: &str, data: &[u8], create_only: bool) -> Result<bool> {
        let (store, path) = (self.store.clone(), self.path(relative));
        let payload = PutPayload::from(data.to_vec());
        let mode = if create_only {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        let outcome = self.run(relative, async move {
            store
                .put_opts(
                    &path,
                    payload,
                    PutOptions {
                        mode,
                        ..PutOptions::default()
                    },
                )
                .await
        });
        match outcome {
            Ok(_) => Ok(true),
            Err(StoreError::Io { source, .. })
                if create_only && source.kind() == io::ErrorKind::AlreadyExists =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes the object at `relative`; a missing one is no error.
    pub fn delete(&self, relative: &str) -> Result<()> {
        let (store, path) = (self.store.clone(), self.path(relative));
        match self.run(relative, async move { store.delete(&path).await }) {
            Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Ok(())
            }
            outcome => outcome,
        }
    }

    /// The keys below `dir` (relative to `dir`, at any depth), sorted.
    pub fn list_keys(&self, dir: &str) -> Result<Vec<String>> {
        let (store, path) = (self.store.clone(), self.path(dir));
        let base = format!("{}/", self.key(dir));
        let mut keys: Vec<String> = self
            .run(dir, async move {
                store
                    .list(Some(&path))
                    .map_ok(|meta| meta.location.to_string())
                    .try_collect::<Vec<_>>()
                    .await
            })?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&base).map(str::to_string))
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// The names of the "directories" directly below `dir` (common prefixes), sorted.
    pub fn list_dirs(&self, dir: &str) -> Result<Vec<String>> {
        let (store, path) = (self.store.clone(), self.path(dir));
        let listing = self.run(
            dir,
            async move { store.list_with_delimiter(Some(&path)).await },
        )?;
        let mut names: Vec<String> = listing
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    fn relative(kind: FileKind, name: &str) -> String {
        kind.relative_path(name)
    }
}

/// How an object store's error reads as an I/O error: whether the object was missing,
/// already there or forbidden, and whether trying again may succeed
/// ([`StoreError::is_transient`]): a dropped or refused connection, a timeout, a
/// throttled or failing server (HTTP 408, 429, 5xx; S3's `SlowDown` and
/// `InternalError` answers). Anything else is permanent.
fn error_kind(e: &object_store::Error) -> io::ErrorKind {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => return io::ErrorKind::NotFound,
        E::AlreadyExists { .. } | E::Precondition { .. } => return io::ErrorKind::AlreadyExists,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            return io::ErrorKind::PermissionDenied
        }
        E::NotSupported { .. } | E::NotImplemented { .. } => return io::ErrorKind::Unsupported,
        _ => {}
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(http) = c.downcast_ref::<HttpError>() {
            return match http.kind() {
                HttpErrorKind::Connect | HttpErrorKind::Request => io::ErrorKind::ConnectionReset,
                HttpErrorKind::Timeout => io::ErrorKind::TimedOut,
                HttpErrorKind::Interrupted => io::ErrorKind::Interrupted,
                _ => io::ErrorKind::Other,
            };
        }
        cause = c.source();
    }
    match http_status(&crate::error::error_chain(e)) {
        Some(408 | 429 | 500..=599) => io::ErrorKind::ResourceBusy,
        _ if ["SlowDown", "InternalError"]
            .iter()
            .any(|s| e.to_string().contains(s)) =>
        {
            io::ErrorKind::ResourceBusy
        }
        _ => io::ErrorKind::Other,
    }
}

/// The HTTP status an object_store error message reports ("... status code: 503 ..."):
/// the status itself is not reachable through the crate's public types.
fn http_status(message: &str) -> Option<u16> {
    let rest = &message[message.find("status code: ")? + "status code: ".len()..];
    rest.get(..3)?.parse().ok()
}

impl Backend for ObjectBackend {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        match self.get(&Self::relative(kind, name)) {
            // A missing config may be a missing bucket: S3 says which only to a list
            // (a GET answers a bare 404), whose `NoSuchBucket` then names the bucket.
            Err(StoreError::Io { source, path })
                if matches!(kind, FileKind::Config) && source.kind() == io::ErrorKind::NotFound =>
            {
                self.list(FileKind::Key)?;
                Err(StoreError::Io { source, path })
            }
            got => got,
        }
    }

    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        let relative = Self::relative(kind, name);
        let (store, path) = (self.store.clone(), self.path(&relative));
        // Empty ranges are not requested (object stores refuse them); they read as
        // nothing, as locally.
        let wanted: Vec<Range<u64>> = ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
        let mut got = self
            .run(
                &relative,
                async move { store.get_ranges(&path, &wanted).await },
            )?
            .into_iter();
        // A range past the end must fail, as a short local read does, whatever the
        // server answered.
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            if range.is_empty() {
                out.push(Vec::new());
                continue;
            }
            let bytes = got.next().unwrap_or_default();
            if bytes.len() as u64 != range.end - range.start {
                return Err(StoreError::io(
                    self.describe(&relative),
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("range {range:?} ends past the object's end"),
                    ),
                ));
            }
            out.push(bytes.to_vec());
        }
        Ok(out)
    }

    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        let relative = Self::relative(kind, name);
        let (store, path) = (self.store.clone(), self.path(&relative));
        self.run(&relative, async move { store.head(&path).await })
            .map(|meta| meta.size)
    }

    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        self.put(&Self::relative(kind, name), data, false)
            .map(|_| ())
    }

    /// A conditional put (`If-None-Match: *`).
    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        self.put(&Self::relative(kind, name), data, true)
    }

    /// Nothing left to do: every acknowledged put is durable.
    fn sync(&self, _kind: FileKind) -> Result<()> {
        Ok(())
    }

    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        Ok(super::names_of(self.list_versions(kind)?))
    }

    fn list_sizes(&self, kind: FileKind) -> Result<Vec<(String, u64)>> {
        Ok(super::sizes_of(self.list_versions(kind)?))
    }

    /// One listing: object stores list sizes and ETags with names. The tag is the
    /// ETag, else the last-modified time (a store that gives no ETag).
    fn list_versions(&self, kind: FileKind) -> Result<Vec<(String, FileVersion)>> {
        let dir = kind.dir();
        let dir_key = match dir {
            "" => self.prefix.clone(),
            _ => self.key(dir),
        };
        let base = match dir_key.as_str() {
            "" => String::new(),
            key => format!("{key}/"),
        };
        let (store, path) = (self.store.clone(), ObjectPath::from(dir_key.as_str()));
        let listing = self.run(dir, async move {
            let prefix = (!path.as_ref().is_empty()).then_some(&path);
            store.list_with_delimiter(prefix).await
        })?;
        let mut names: Vec<(String, FileVersion)> = listing
            .objects
            .into_iter()
            .filter_map(|meta| {
                let key = meta.location.to_string();
                let file = key.strip_prefix(&base)?;
                let tag = meta
                    .e_tag
                    .unwrap_or_else(|| meta.last_modified.to_rfc3339());
                let version = FileVersion {
                    len: meta.size,
                    tag,
                };
                Some((kind.name_of(file)?.to_string(), version))
            })
            .collect();
        names.sort();
        Ok(names)
    }

    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        self.delete(&Self::relative(kind, name))
    }

    fn location(&self) -> String {
        match self.prefix.as_str() {
            "" => self.location.clone(),
            prefix => format!("{}/{prefix}", self.location),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_statuses_are_read_from_object_store_messages() {
        let m = "Generic S3 error: Error performing PUT http://h/b/k in 2ms - Server returned \
                 non-2xx status code: 503 Service Unavailable: SlowDown";
        assert_eq!(http_status(m), Some(503));
        assert_eq!(http_status("status code: 429 Too Many Requests"), Some(429));
        assert_eq!(http_status("no status here"), None);
        assert_eq!(http_status("status code: 5"), None);
    }

    #[test]
    fn missing_and_refused_objects_are_permanent() {
        let e = object_store::Error::NotFound {
            path: "k".into(),
            source: "gone".into(),
        };
        assert_eq!(error_kind(&e), io::ErrorKind::NotFound);
        let e = object_store::Error::PermissionDenied {
            path: "k".into(),
            source: "403".into(),
        };
        assert_eq!(error_kind(&e), io::ErrorKind::PermissionDenied);
        let e = object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 500 Internal Server Error".into(),
        };
        assert_eq!(error_kind(&e), io::ErrorKind::ResourceBusy);
        let e = object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 400 Bad Request".into(),
        };
        assert_eq!(error_kind(&e), io::ErrorKind::Other);
    }
}
