//! The cluster's certificates (docs/design/cluster.md, "Security"): two authorities
//! made by `larder cluster cert ca` (one for larder's gRPC port, one for etcd, so that
//! a backup client's certificate never opens etcd), the certificates they issue, the
//! directories a node or client reads them from, and who a peer's certificate names.
//!
//! A larder certificate names its holder in a subject alternative name URI:
//! `larder:node:<id>` or `larder:client:<name>`, and a client's grants as
//! `larder:path:<absolute path>` (bytes outside `A-Za-z0-9/._-~` percent-encoded).
//! Only a chain to the cluster's authority is trusted (rustls checks it in the
//! handshake), so these names are as good as the authority's key.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::coord::auth::{NODE_USER, ROOT_USER};
use crate::error::{ClusterError, Result};

/// The authority's files (`cluster cert ca --out DIR`); the keys are 0600.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const ETCD_CA_CERT: &str = "etcd-ca.crt";
pub const ETCD_CA_KEY: &str = "etcd-ca.key";
/// A holder's directory (`--tls DIR`): the larder authority, its certificate and key,
/// and where it talks to etcd, the etcd authority and its etcd certificate and key.
pub const CERT: &str = "cert.crt";
pub const KEY: &str = "key.pem";
pub const ETCD_CERT: &str = "etcd.crt";
pub const ETCD_KEY: &str = "etcd.key";

/// Years an authority, and a certificate it issues, are valid from the start of the
/// year they are made in.
const CA_YEARS: i32 = 20;
const CERT_YEARS: i32 = 10;

/// Who a larder certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A node of the cluster: it may look up, acknowledge and get.
    Node(u16),
    /// A client: it may run jobs over the paths it was granted.
    Client { name: String, paths: Vec<PathBuf> },
}

/// The PEM files of one TLS identity: the authority it trusts, its certificate, its key.
#[derive(Clone)]
pub struct TlsFiles {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsFiles { .. }")
    }
}

impl TlsFiles {
    /// The larder identity in directory `dir` (`ca.crt`, `cert.crt`, `key.pem`).
    pub fn larder(dir: &Path) -> Result<Self> {
        Self::read(dir, CA_CERT, CERT, KEY)
    }

    /// The etcd identity in `dir` (`etcd-ca.crt`, `etcd.crt`, `etcd.key`), if it has one.
    pub fn etcd(dir: &Path) -> Result<Option<Self>> {
        if !dir.join(ETCD_CERT).exists() {
            return Ok(None);
        }
        Self::read(dir, ETCD_CA_CERT, ETCD_CERT, ETCD_KEY).map(Some)
    }

    fn read(dir: &Path, ca: &str, cert: &str, key: &str) -> Result<Self> {
        let read = |name: &str| {
            let path = dir.join(name);
            fs::read(&path).map_err(|source| ClusterError::Io {
                what: format!("TLS file {}", path.display()),
                source,
            })
        };
        Ok(Self {
            ca: read(ca)?,
            cert: read(cert)?,
            key: read(key)?,
        })
    }
}

fn tls_error(what: &str, e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Tls(format!("{what}: {e}"))
}

/// Writes `bytes` to a new file `dir/name` with `mode`; an existing file is an error,
/// never replaced.
fn write_new(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<()> {
    let path = dir.join(name);
    let io = |source| ClusterError::Io {
        what: format!("writing {}", path.display()),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&path)
        .map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

/// Creates `dir` (0700) if missing.
fn make_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| ClusterError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })
}

fn this_year() -> i32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    1970 + (secs / 31_556_952) as i32
}

fn params(common_name: &str, years: i32) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "larder cluster");
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    let year = this_year();
    params.not_before = date_time_ymd(year, 1, 1);
    params.not_after = date_time_ymd(year + years, 1, 1);
    params.use_authority_key_identifier_extension = true;
    params
}

fn self_signed_ca(common_name: &str) -> Result<(String, String)> {
    let key = KeyPair::generate().map_err(|e| tls_error("generating a key", e))?;
    let mut params = params(common_name, CA_YEARS);
    params.use_authority_key_identifier_extension = false;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params
        .self_signed(&key)
        .map_err(|e| tls_error("signing the authority", e))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Makes the cluster's two authorities in `dir` (created 0700): `ca.crt`/`ca.key`
/// for larder's port and `etcd-ca.crt`/`etcd-ca.key` for etcd. Existing files are
/// never replaced.
pub fn create_authority(dir: &Path) -> Result<()> {
    make_dir(dir)?;
    let (cert, key) = self_signed_ca("larder cluster authority")?;
    let (etcd_cert, etcd_key) = self_signed_ca("larder cluster etcd authority")?;
    write_new(dir, CA_KEY, key.as_bytes(), 0o600)?;
    write_new(dir, CA_CERT, cert.as_bytes(), 0o644)?;
    write_new(dir, ETCD_CA_KEY, etcd_key.as_bytes(), 0o600)?;
    write_new(dir, ETCD_CA_CERT, etcd_cert.as_bytes(), 0o644)
}

/// One authority of `ca_dir`, ready to sign.
struct Authority {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Authority {
    fn load(ca_dir: &Path, cert: &str, key: &str) -> Result<Self> {
        let read = |name: &str| {
            let path = ca_dir.join(name);
            fs::read_to_string(&path).map_err(|source| ClusterError::Io {
                what: format!("the cluster's authority, {}", path.display()),
                source,
            })
        };
        let cert_pem = read(cert)?;
        let key =
            KeyPair::from_pem(&read(key)?).map_err(|e| tls_error("the authority's key", e))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .map_err(|e| tls_error("the authority's certificate", e))?;
        Ok(Self { cert_pem, issuer })
    }

    /// A new key and a certificate for it under `params`, written with the
    /// authority's certificate into `out` as `ca_name`, `cert_name`, `key_name`.
    fn issue(
        &self,
        params: CertificateParams,
        out: &Path,
        [ca_name, cert_name, key_name]: [&str; 3],
    ) -> Result<()> {
        let key = KeyPair::generate().map_err(|e| tls_error("generating a key", e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| tls_error("signing the certificate", e))?;
        make_dir(out)?;
        write_new(out, key_name, key.serialize_pem().as_bytes(), 0o600)?;
        write_new(out, cert_name, cert.pem().as_bytes(), 0o644)?;
        write_new(out, ca_name, self.cert_pem.as_bytes(), 0o644)
    }
}

fn uri(value: String) -> Result<SanType> {
    Ok(SanType::URI(
        value.try_into().map_err(|e| tls_error("a name", e))?,
    ))
}

/// A SAN for an address: an IP address, or a DNS name.
fn address_san(address: &str) -> Result<SanType> {
    Ok(match address.parse::<IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(
            address
                .to_string()
                .try_into()
                .map_err(|e| tls_error(&format!("address {address:?}"), e))?,
        ),
    })
}

fn leaf(common_name: &str, usages: &[ExtendedKeyUsagePurpose]) -> CertificateParams {
    let mut params = params(common_name, CERT_YEARS);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usages.to_vec();
    params
}

/// An etcd client certificate named `common_name` (etcd takes it as the user name:
/// [`NODE_USER`] or [`ROOT_USER`]), into `out` as `etcd-ca.crt`, `etcd.crt`,
/// `etcd.key`.
fn issue_etcd_client(ca_dir: &Path, common_name: &str, out: &Path) -> Result<()> {
    let etcd = Authority::load(ca_dir, ETCD_CA_CERT, ETCD_CA_KEY)?;
    let params = leaf(common_name, &[ExtendedKeyUsagePurpose::ClientAuth]);
    etcd.issue(params, out, [ETCD_CA_CERT, ETCD_CERT, ETCD_KEY])
}

/// Node `id`'s directory `out`: its larder certificate (`node-<id>`, for serving at
/// `addresses` and for asking other nodes) and its etcd client certificate (etcd's
/// user [`NODE_USER`], the same for every node: the node id is bound on larder's port).
pub fn issue_node(ca_dir: &Path, id: u16, addresses: &[String], out: &Path) -> Result<()> {
    if id == 0 {
        return Err(ClusterError::Tls("node ids are 1 to 65535".into()));
    }
    let name = format!("node-{id}");
    let larder = Authority::load(ca_dir, CA_CERT, CA_KEY)?;
    let mut params = leaf(
        &name,
        &[
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    params
        .subject_alt_names
        .push(uri(format!("larder:node:{id}"))?);
    // The name another node checks when it dials this node by the map's address.
    params.subject_alt_names.push(address_san(&name)?);
    for address in addresses {
        params.subject_alt_names.push(address_san(address)?);
    }
    larder.issue(params, out, [CA_CERT, CERT, KEY])?;
    issue_etcd_client(ca_dir, NODE_USER, out)
}

/// Whether `name` may name a client: 1 to 64 of `A-Za-z0-9._-`.
pub fn valid_client_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Client `name`'s directory `out`: a larder certificate (`client-<name>`) granting
/// `paths` (absolute, without `.` or `..`); with `etcd`, also an etcd client
/// certificate (an administrator's, etcd's user [`ROOT_USER`]: `cluster init` and
/// `cluster status`).
pub fn issue_client(
    ca_dir: &Path,
    name: &str,
    paths: &[PathBuf],
    etcd: bool,
    out: &Path,
) -> Result<()> {
    if !valid_client_name(name) {
        return Err(ClusterError::Tls(format!(
            "client name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-'"
        )));
    }
    let common_name = format!("client-{name}");
    let larder = Authority::load(ca_dir, CA_CERT, CA_KEY)?;
    let mut params = leaf(&common_name, &[ExtendedKeyUsagePurpose::ClientAuth]);
    params
        .subject_alt_names
        .push(uri(format!("larder:client:{name}"))?);
    for path in paths {
        if !is_plain_absolute(path) {
            return Err(ClusterError::Tls(format!(
                "granted path {}: give an absolute path without '.' or '..'",
                path.display()
            )));
        }
        params
            .subject_alt_names
            .push(uri(format!("larder:path:{}", encode_path(path)))?);
    }
    larder.issue(params, out, [CA_CERT, CERT, KEY])?;
    if etcd {
        issue_etcd_client(ca_dir, ROOT_USER, out)?;
    }
    Ok(())
}

/// An etcd member's directory `out`: its certificate for clients and peers at
/// `addresses`, as `etcd-ca.crt`, `etcd.crt`, `etcd.key`.
pub fn issue_etcd(ca_dir: &Path, name: &str, addresses: &[String], out: &Path) -> Result<()> {
    let etcd = Authority::load(ca_dir, ETCD_CA_CERT, ETCD_CA_KEY)?;
    let mut params = leaf(
        name,
        &[
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    for address in addresses {
        params.subject_alt_names.push(address_san(address)?);
    }
    etcd.issue(params, out, [ETCD_CA_CERT, ETCD_CERT, ETCD_KEY])
}

/// Whether `path` is absolute and made of plain names only.
pub fn is_plain_absolute(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

fn encode_path(path: &Path) -> String {
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode_path(text: &str) -> Option<PathBuf> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let path =
        PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out));
    is_plain_absolute(&path).then_some(path)
}

/// Who the leaf certificate `der` (already verified against the cluster's authority)
/// names: `None` for a certificate that names no larder node or client, names more
/// than one, or holds a grant that does not decode.
pub fn peer_role(der: &[u8]) -> Option<Role> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let sans = cert.subject_alternative_name().ok()??;
    let mut role = None;
    let mut paths = Vec::new();
    for name in &sans.value.general_names {
        let GeneralName::URI(uri) = name else {
            continue;
        };
        let found = if let Some(id) = uri.strip_prefix("larder:node:") {
            Role::Node(id.parse().ok().filter(|&id| id != 0)?)
        } else if let Some(name) = uri.strip_prefix("larder:client:") {
            valid_client_name(name).then_some(())?;
            Role::Client {
                name: name.to_string(),
                paths: Vec::new(),
            }
        } else if let Some(path) = uri.strip_prefix("larder:path:") {
            paths.push(decode_path(path)?);
            continue;
        } else {
            continue;
        };
        if role.replace(found).is_some() {
            return None;
        }
    }
    match role? {
        Role::Client { name, .. } => Some(Role::Client { name, paths }),
        Role::Node(id) if paths.is_empty() => Some(Role::Node(id)),
        Role::Node(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip_through_their_uri_form() {
        for path in ["/srv/data", "/a b/%x/\u{e9}", "/"] {
            let encoded = encode_path(Path::new(path));
            assert!(encoded.is_ascii());
            assert_eq!(decode_path(&encoded).unwrap(), Path::new(path));
        }
        assert_eq!(decode_path("/a/../b"), None);
        assert_eq!(decode_path("relative"), None);
        assert_eq!(decode_path("/a%2"), None);
    }

    #[test]
    fn certificates_name_their_holders_and_grants() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca");
        create_authority(&ca).unwrap();
        let node = dir.path().join("node");
        issue_node(&ca, 7, &["127.0.0.1".into()], &node).unwrap();
        let client = dir.path().join("client");
        issue_client(&ca, "alice", &[PathBuf::from("/srv/a b")], false, &client).unwrap();
        let der = |dir: &Path| {
            let pem = fs::read_to_string(dir.join(CERT)).unwrap();
            let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
            pem.contents
        };
        assert_eq!(peer_role(&der(&node)), Some(Role::Node(7)));
        assert_eq!(
            peer_role(&der(&client)),
            Some(Role::Client {
                name: "alice".into(),
                paths: vec![PathBuf::from("/srv/a b")],
            })
        );
        assert!(TlsFiles::etcd(&node).unwrap().is_some());
        assert!(TlsFiles::etcd(&client).unwrap().is_none());
        // The authority's keys are private; nothing is ever written over.
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(ca.join(CA_KEY)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(create_authority(&ca).is_err());
        assert!(issue_node(&ca, 7, &[], &node).is_err());
    }
}
