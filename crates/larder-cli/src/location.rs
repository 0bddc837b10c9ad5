//! `--repo`: where a repository is. A plain path or `file://PATH` is a local
//! directory; `s3://BUCKET/PREFIX` is S3-compatible object storage;
//! `sftp://[USER@]HOST[:PORT]/PATH` is a directory on an SSH server. Any other
//! `SCHEME://` is refused as a usage error, never taken for a path.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use larder_store::{Backend, ObjectBackend, RetryBackend, RetryPolicy, SftpBackend};

/// A repository's location, as `--repo` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoLocation {
    Local(PathBuf),
    /// `s3://BUCKET/PREFIX`.
    S3(String),
    /// `sftp://[USER@]HOST[:PORT]/PATH`.
    Sftp(String),
}

/// The locations larder takes, for messages.
const TAKES: &str = "a path, file://PATH, s3://BUCKET/PREFIX or sftp://[USER@]HOST[:PORT]/PATH";

/// The refusal of restic's `sftp:[USER@]HOST:PATH`, with the URL to write instead.
fn restic_sftp_hint(text: &str) -> String {
    let instead = match text[5..].split_once(':') {
        Some((host, path)) if !host.is_empty() && !path.is_empty() => {
            format!("sftp://{host}/{path}")
        }
        _ => "sftp://[USER@]HOST[:PORT]/PATH (an absolute PATH after two slashes)".into(),
    };
    format!("{text:?} is restic's form of an sftp repository; larder takes the URL {instead}")
}

/// Parses `--repo` (clap's value parser): the error is a usage error.
pub fn parse(text: &str) -> Result<RepoLocation, String> {
    let Some((scheme, rest)) = split_scheme(text) else {
        if let Some(name) = FOREIGN_PREFIXES
            .iter()
            .find(|p| text.to_ascii_lowercase().starts_with(&format!("{p}:")))
        {
            if *name == "sftp" {
                return Err(restic_sftp_hint(text));
            }
            return Err(format!(
                "{text:?} looks like another tool's {name}: repository; larder takes {TAKES}"
            ));
        }
        return Ok(RepoLocation::Local(PathBuf::from(text)));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "file" if rest.is_empty() => Err("file:// names no path".into()),
        "file" => Ok(RepoLocation::Local(PathBuf::from(rest))),
        "s3" => {
            larder_store::parse_s3_url(text).map_err(|e| e.to_string())?;
            Ok(RepoLocation::S3(text.to_string()))
        }
        "sftp" => {
            larder_store::parse_sftp_url(text).map_err(|e| e.to_string())?;
            Ok(RepoLocation::Sftp(text.to_string()))
        }
        _ => Err(format!(
            "larder does not serve {scheme}:// repositories; use {TAKES}"
        )),
    }
}

/// The `NAME:` prefixes of other backup tools' repository strings (restic, rclone),
/// refused rather than taken for a local path that starts that way.
const FOREIGN_PREFIXES: [&str; 10] = [
    "s3", "sftp", "rest", "b2", "gs", "azure", "swift", "rclone", "http", "https",
];

/// `SCHEME` and the rest of `SCHEME://REST`, if `text` is a URL (RFC 3986's scheme
/// characters).
fn split_scheme(text: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = text.split_once("://")?;
    let mut chars = scheme.chars();
    let first_is_letter = chars.next()?.is_ascii_alphabetic();
    let valid = chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    (first_is_letter && valid).then_some((scheme, rest))
}

impl RepoLocation {
    /// The backend of a remote repository, its transient failures retried under
    /// `policy`. An SFTP repository's server is connected to here, through `ssh`
    /// (`LARDER_SFTP_ARGS`, `LARDER_SFTP_COMMAND`: docs/design/sftp.md). Invariant:
    /// called for remote locations only.
    pub fn remote_backend(&self, policy: RetryPolicy) -> Result<Arc<dyn Backend>> {
        match self {
            Self::Local(path) => unreachable!("{} is local", path.display()),
            Self::S3(url) => {
                let store = ObjectBackend::from_url(url)
                    .with_context(|| format!("opening repository {url}"))?;
                Ok(Arc::new(RetryBackend::new(store, policy)))
            }
            // Its errors name the repository and say what ssh said.
            Self::Sftp(url) => {
                let server = SftpBackend::from_url(url)?;
                Ok(Arc::new(RetryBackend::new(server, policy)))
            }
        }
    }
}

impl std::fmt::Display for RepoLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(path) => write!(f, "{}", path.display()),
            Self::S3(url) | Self::Sftp(url) => f.write_str(url),
        }
    }
}

/// Serializes a location as its text (JSON output: a path or a URL).
pub fn serialize<S: serde::Serializer>(location: &&RepoLocation, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(location)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_file_urls_are_local() {
        for (text, path) in [
            ("repo", "repo"),
            ("/srv/backup", "/srv/backup"),
            ("file:///srv/backup", "/srv/backup"),
            ("file://rel/dir", "rel/dir"),
            ("./s3:/bucket", "./s3:/bucket"),
            ("backup:2026", "backup:2026"),
            ("dir/x://y", "dir/x://y"),
        ] {
            assert_eq!(parse(text), Ok(RepoLocation::Local(path.into())), "{text}");
        }
    }

    #[test]
    fn s3_urls_are_s3() {
        assert_eq!(
            parse("s3://bucket/repo"),
            Ok(RepoLocation::S3("s3://bucket/repo".into()))
        );
        assert!(parse("s3:///repo").is_err());
    }

    #[test]
    fn sftp_urls_are_sftp() {
        for text in ["sftp://host/repo", "sftp://ann@host:2222//srv/repo"] {
            assert_eq!(parse(text), Ok(RepoLocation::Sftp(text.into())), "{text}");
        }
        for text in ["sftp://host", "sftp://host/", "sftp://-oProxyCommand=x/r"] {
            assert!(parse(text).is_err(), "{text}");
        }
        // restic's form is refused, with the URL to write instead.
        for (text, url) in [
            ("sftp:ann@host:/srv/repo", "sftp://ann@host//srv/repo"),
            ("sftp:host:backups", "sftp://host/backups"),
            ("SFTP:host", "sftp://[USER@]HOST[:PORT]/PATH"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains("restic's") && e.contains(url), "{e}");
        }
    }

    #[test]
    fn other_schemes_are_refused() {
        for text in ["gs://bucket/repo", "b2://b/p", "HTTP://host/x", "ftp://h/p"] {
            let e = parse(text).unwrap_err();
            assert!(e.contains("does not serve"), "{text}: {e}");
        }
        for text in ["rest:http://x", "s3:s3.amazonaws.com/b"] {
            let e = parse(text).unwrap_err();
            assert!(e.contains("another tool's"), "{text}: {e}");
        }
        assert!(parse("file://").is_err());
    }
}
