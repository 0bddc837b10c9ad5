//! Storage that swaps an encrypted repository's config for a plaintext one
//! (docs/design/crypto.md, "Threat model"): larder refuses to open it, whatever the
//! password source, beside key slots, and on a client that has seen it encrypted,
//! and writes nothing to the repository before refusing. A remote repository's
//! config cannot be smuggled through its local cache, nor can its id lead the cache
//! outside the cache directory.

mod support;

#[path = "../../larder-store/tests/support/s3s.rs"]
mod s3s;

use std::fs;
use std::path::{Path, PathBuf};

use support::{files, list_tree, pseudo_random, Repo};

/// Every file's bytes and every entry's path under `dir`: what "nothing was written"
/// compares.
type Contents = (
    std::collections::BTreeMap<PathBuf, Vec<u8>>,
    Vec<std::path::PathBuf>,
);

fn contents(dir: &Path) -> Contents {
    (files(dir), list_tree(dir))
}

/// An encrypted repository with one snapshot of `src`, whose config was then replaced
/// by a new plaintext repository's: what hostile storage can do.
fn swapped() -> (Repo, PathBuf) {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    fs::write(src.join("secret.txt"), b"the plaintext of a secret file").unwrap();
    repo.backup(&[&src]);
    let plain = Repo::init_plain(&[]);
    fs::copy(plain.path.join("config"), repo.path.join("config")).unwrap();
    (repo, src)
}

/// Runs `args` on `repo` with the environment `env` set on top of the fixture's
/// (`LARDER_PASSWORD` removed first when `no_env_password`; the fixture gives none to
/// a repository whose config is plaintext).
fn run_with(
    repo: &Repo,
    no_env_password: bool,
    env: &[(&str, &str)],
    args: &[&str],
) -> support::Output {
    let mut c = repo.command(args);
    if no_env_password {
        c.env_remove("LARDER_PASSWORD");
    }
    for (k, v) in env {
        c.env(k, v);
    }
    support::run_command(c, support::RUN_TIMEOUT)
}

#[track_caller]
fn assert_refused(out: &support::Output, repo: &Path, reason: &str) {
    out.expect_code(1)
        .expect_stderr(&[&repo.display().to_string(), "not encrypted", reason]);
}

#[test]
fn a_swapped_plaintext_config_is_refused_with_any_password_source() {
    let (repo, src) = swapped();
    let before = contents(&repo.path);
    let secret = repo.scratch.path().join("password");
    fs::write(&secret, format!("{}\n", support::PASSWORD)).unwrap();
    let secret = secret.to_str().unwrap();
    let backup = ["backup", src.to_str().unwrap()];
    let env_password = run_with(
        &repo,
        false,
        &[("LARDER_PASSWORD", support::PASSWORD)],
        &backup,
    );
    assert_refused(&env_password, &repo.path, "LARDER_PASSWORD");
    for (flag, value) in [
        ("--password-file", secret.to_string()),
        ("--password-command", format!("cat {secret}")),
    ] {
        let mut args = vec![flag, value.as_str()];
        args.extend_from_slice(&backup);
        let out = run_with(&repo, true, &[], &args);
        assert_refused(&out, &repo.path, "a password was given");
    }
    // No password at all: the key slots beside the config still give it away.
    let none = run_with(&repo, true, &[], &backup);
    assert_refused(&none, &repo.path, "key slots");
    for reader in [vec!["snapshots"], vec!["ls", "latest"], vec!["check"]] {
        assert_refused(
            &run_with(&repo, true, &[], &reader),
            &repo.path,
            "key slots",
        );
    }
    assert!(
        contents(&repo.path) == before,
        "a refused command changed the repository (a lock, a container, a snapshot)"
    );
}

#[test]
fn a_client_that_saw_the_repository_encrypted_refuses_it_without_keys_or_password() {
    let (repo, src) = swapped();
    // The storage also removed the key slots; no password is given.
    fs::remove_dir_all(repo.path.join("keys")).unwrap();
    let before = contents(&repo.path);
    let out = run_with(&repo, true, &[], &["backup", src.to_str().unwrap()]);
    assert_refused(
        &out,
        &repo.path,
        "was encrypted when this client last opened it",
    );
    assert!(contents(&repo.path) == before, "the refused backup wrote");

    // Another client, which never saw it, has nothing to go by (borg's "unknown
    // unencrypted repository"); with the password it still refuses.
    let mut c = repo.command(["snapshots"]);
    let other = repo.dir("other-client");
    c.env("XDG_CONFIG_HOME", &other)
        .env("LARDER_PASSWORD", support::PASSWORD);
    assert_refused(
        &support::run_command(c, support::RUN_TIMEOUT),
        &repo.path,
        "a password was given",
    );
    assert!(contents(&repo.path) == before);
}

#[test]
fn the_record_follows_the_repository_not_the_path_it_is_named_by() {
    let (repo, src) = swapped();
    fs::remove_dir_all(repo.path.join("keys")).unwrap();
    // The same repository through a symlink and a path with `..` in it.
    let link = repo.scratch.path().join("link");
    std::os::unix::fs::symlink(&repo.path, &link).unwrap();
    let dotted = repo.dir("sub").join("../repo");
    for path in [&link, &dotted] {
        let mut c = support::larder_command(repo.xdg());
        c.env_remove("LARDER_PASSWORD")
            .arg("--repo")
            .arg(path)
            .args(["backup", src.to_str().unwrap()]);
        let out = support::run_command(c, support::RUN_TIMEOUT);
        out.expect_code(1).expect_stderr(&[
            "not encrypted",
            "was encrypted when this client last opened it",
        ]);
    }
}

#[test]
fn init_of_a_plaintext_repository_in_place_of_an_encrypted_one_is_taken_as_meant() {
    let repo = Repo::init(&[]);
    fs::remove_dir_all(&repo.path).unwrap();
    let mut c = repo.command(["init", "--encryption", "none"]);
    c.env_remove("LARDER_PASSWORD");
    support::run_command(c, support::RUN_TIMEOUT).expect_ok();
    let src = repo.dir("src");
    fs::write(src.join("a"), b"a").unwrap();
    let mut c = repo.command(["backup", src.to_str().unwrap()]);
    c.env_remove("LARDER_PASSWORD");
    support::run_command(c, support::RUN_TIMEOUT).expect_ok();
}

#[test]
fn a_plaintext_repository_opens_without_a_password_and_is_refused_with_one() {
    let repo = Repo::init_plain(&[]);
    let src = repo.dir("src");
    fs::write(src.join("a"), pseudo_random(1, 1000)).unwrap();
    repo.backup(&[&src]);
    let out = run_with(
        &repo,
        false,
        &[("LARDER_PASSWORD", "some password")],
        &["snapshots"],
    );
    out.expect_code(1)
        .expect_stderr(&["not encrypted", "a password was given", "LARDER_PASSWORD"]);
}

/// A plaintext config swapped into an encrypted S3 repository is refused; a config
/// planted in the local cache is never read; a plaintext config whose id climbs out
/// of the cache directory is refused before anything is made there.
#[test]
fn a_remote_repository_is_refused_too_and_its_cache_holds_no_config() {
    let server = s3s::S3sServer::start(&["larder"]);
    let repo = Repo::remote("s3://larder/enc".into(), server.env());
    let mut init = vec!["init"];
    init.extend_from_slice(&support::CHEAP_KDF);
    repo.run(&init).expect_ok();
    let src = repo.dir("src");
    fs::write(src.join("secret.txt"), b"remote secret").unwrap();
    repo.backup(&[&src]);

    // A plaintext config in the cache directory changes nothing: it is not read.
    let cache_root = repo.xdg().join("cache/larder");
    for entry in fs::read_dir(&cache_root).unwrap().flatten() {
        if entry.path().is_dir() {
            let plain = Repo::init_plain(&[]);
            fs::copy(plain.path.join("config"), entry.path().join("config")).unwrap();
        }
    }
    repo.backup(&[&src]);

    let bucket = server.bucket_dir("larder").join("enc");
    let plain = Repo::init_plain(&[]);
    fs::copy(plain.path.join("config"), bucket.join("config")).unwrap();
    let before = contents(&bucket);
    let out = repo.run(["backup", src.to_str().unwrap()]);
    out.expect_code(1)
        .expect_stderr(&["s3://larder/enc", "not encrypted"]);
    assert!(contents(&bucket) == before, "the refused backup wrote");

    // A plaintext repository whose config names an id that leaves the cache.
    let escape = bucket.parent().unwrap().join("escape");
    fs::create_dir_all(&escape).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&fs::read(plain.path.join("config")).unwrap()).unwrap();
    config["id"] = "../../../outside".into();
    fs::write(escape.join("config"), serde_json::to_vec(&config).unwrap()).unwrap();
    let mut c = support::larder_command(repo.xdg());
    c.env_remove("LARDER_PASSWORD")
        .envs(repo.env.iter().map(|(k, v)| (k, v)))
        .args(["--repo", "s3://larder/escape", "snapshots"]);
    let out = support::run_command(c, support::RUN_TIMEOUT);
    out.expect_code(1).expect_stderr(&["id"]);
    assert!(
        !repo.xdg().join("outside").exists() && !repo.scratch.path().join("outside").exists(),
        "the cache followed the id out of its directory"
    );
}

/// The default repository, made encrypted on first use with a generated password:
/// a plaintext config swapped in is refused by the password file alone, even when
/// this client's record of it is gone.
#[test]
fn the_default_repository_is_refused_by_its_password_file() {
    let scratch = support::Scratch::new();
    let xdg = scratch.dir("xdg");
    let mut c = support::larder_command(&xdg);
    c.env_remove("LARDER_PASSWORD").arg("snapshots");
    support::run_command(c, support::RUN_TIMEOUT).expect_ok();
    let default = xdg.join("larder/repo");
    let plain = Repo::init_plain(&[]);
    fs::copy(plain.path.join("config"), default.join("config")).unwrap();
    fs::remove_dir_all(default.join("keys")).unwrap();
    fs::remove_dir_all(xdg.join("config/larder/security")).unwrap();
    let before = contents(&default);
    let mut c = support::larder_command(&xdg);
    c.env_remove("LARDER_PASSWORD").arg("snapshots");
    let out = support::run_command(c, support::RUN_TIMEOUT);
    out.expect_code(1)
        .expect_stderr(&["not encrypted", "default-repo.password"]);
    assert!(contents(&default) == before, "the refused command wrote");
}
