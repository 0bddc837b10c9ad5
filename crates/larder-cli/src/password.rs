//! Where passwords come from (docs/design/crypto.md, "Password sources"): a file, a
//! command, the environment, the default repository's generated password file, or a
//! prompt on the terminal; and new passwords for `init`, `key add` and `key passwd`.

use std::fs;
use std::io::{self, BufRead, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use clap::Args;
use larder_crypto::KdfParams;
use zeroize::Zeroizing;

/// A password, wiped from memory when dropped.
pub type Password = Zeroizing<String>;

/// The global options that give an encrypted repository's password.
#[derive(Args, Clone, Default)]
pub struct PasswordArgs {
    /// Read the repository password from the first line of FILE
    #[arg(long, global = true, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// Run CMD (with sh -c) and use the first line of its output as the password
    #[arg(long, global = true, value_name = "CMD")]
    pub password_command: Option<String>,
    /// Which repository the password is for: what the environment variable, the
    /// prompt and the messages are.
    #[arg(skip)]
    pub role: PasswordRole,
}

/// Whose password [`PasswordArgs`] gives.
#[derive(Clone, Copy, Default)]
pub enum PasswordRole {
    /// The repository of `--repo`.
    #[default]
    Repository,
    /// The source repository of `copy --from-repo`.
    CopySource,
}

impl PasswordRole {
    /// The environment variable that holds the password.
    fn env(self) -> &'static str {
        match self {
            Self::Repository => "LARDER_PASSWORD",
            Self::CopySource => "LARDER_FROM_PASSWORD",
        }
    }

    fn prompt(self) -> &'static str {
        match self {
            Self::Repository => "password: ",
            Self::CopySource => "source repository password: ",
        }
    }

    /// The names of the options and the environment variable that give the password.
    fn sources(self) -> [&'static str; 3] {
        match self {
            Self::Repository => ["--password-file", "--password-command", "LARDER_PASSWORD"],
            Self::CopySource => [
                "--from-password-file",
                "--from-password-command",
                "LARDER_FROM_PASSWORD",
            ],
        }
    }

    /// What to do when no password was given and there is no terminal to ask on.
    fn advice(self) -> &'static str {
        match self {
            Self::Repository => "no password was given: set LARDER_PASSWORD, or use --password-file or --password-command",
            Self::CopySource => "no password was given for the source repository: set LARDER_FROM_PASSWORD, or use --from-password-file or --from-password-command",
        }
    }
}

/// The options of `copy` that give the source repository's password.
#[derive(Args, Clone, Default)]
pub struct FromPasswordArgs {
    /// Read the source repository's password from the first line of FILE
    #[arg(long, value_name = "FILE", env = "LARDER_FROM_PASSWORD_FILE")]
    from_password_file: Option<PathBuf>,
    /// Run CMD (with sh -c) and use the first line of its output as the source
    /// repository's password
    #[arg(long, value_name = "CMD", env = "LARDER_FROM_PASSWORD_COMMAND")]
    from_password_command: Option<String>,
}

impl FromPasswordArgs {
    /// The source's password options, as the destination's are given: its own
    /// environment variable (`LARDER_FROM_PASSWORD`), prompt and messages.
    pub fn into_password_args(self) -> PasswordArgs {
        PasswordArgs {
            password_file: self.from_password_file,
            password_command: self.from_password_command,
            role: PasswordRole::CopySource,
        }
    }
}

/// The options of commands that set a new password.
#[derive(Args, Clone, Default)]
pub struct NewPasswordArgs {
    /// Read the new password from the first line of FILE (else LARDER_NEW_PASSWORD,
    /// else a prompt)
    #[arg(long, value_name = "FILE")]
    pub new_password_file: Option<PathBuf>,
}

/// The Argon2id parameters of a new first key slot (`init`, `cluster init`).
#[derive(Args, Clone, Default)]
pub struct KdfArgs {
    /// Argon2id memory of the first key slot (default 64MiB; at least 8MiB)
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse)]
    kdf_memory: Option<usize>,
    /// Argon2id iterations of the first key slot (default 3)
    #[arg(long, value_name = "N")]
    kdf_iterations: Option<u32>,
}

impl KdfArgs {
    /// `params` with the options given; on error, the usage message.
    pub fn apply(&self, mut params: KdfParams) -> Result<KdfParams, String> {
        if let Some(memory) = self.kdf_memory {
            params.memory_kib = (memory / 1024).try_into().unwrap_or(u32::MAX);
        }
        if let Some(iterations) = self.kdf_iterations {
            params.iterations = iterations;
        }
        if params.memory_kib < 8 * 1024 {
            return Err("--kdf-memory must be at least 8MiB".into());
        }
        Ok(params)
    }
}

/// The refusal of an empty new password, the same for `init`, `key add` and `key passwd`.
pub const EMPTY_PASSWORD: &str =
    "refusing an empty password: an encrypted repository's password must not be empty";

/// `password`, unless it is empty.
pub fn non_empty(password: Password) -> Result<Password> {
    if password.is_empty() {
        bail!(EMPTY_PASSWORD);
    }
    Ok(password)
}

impl PasswordArgs {
    /// The source that gives a password, in words (`--password-command`, or
    /// `LARDER_PASSWORD` when it is set, even empty), if one does; nothing is read or
    /// run. A plaintext repository is refused when one does (docs/design/crypto.md,
    /// "Threat model").
    pub fn source(&self) -> Option<&'static str> {
        let [file, command, env] = self.role.sources();
        if self.password_file.is_some() {
            Some(file)
        } else if self.password_command.is_some() {
            Some(command)
        } else {
            std::env::var_os(env).map(|_| env)
        }
    }

    /// The password from `--password-file`, `--password-command` or `LARDER_PASSWORD`
    /// (their `--from-` twins and `LARDER_FROM_PASSWORD` for a copy's source), if one
    /// of them is given.
    pub fn given(&self) -> Result<Option<Password>> {
        if let Some(file) = &self.password_file {
            return first_line_of_file(file).map(Some);
        }
        if let Some(cmd) = &self.password_command {
            return run_password_command(cmd).map(Some);
        }
        Ok(std::env::var(self.role.env()).ok().map(Zeroizing::new))
    }

    /// The password: a given one, else the default repository's generated one (when
    /// `default_file` is set and exists), else a prompt on the terminal.
    pub fn get(&self, default_file: Option<&Path>) -> Result<Password> {
        if let Some(p) = self.given()? {
            return Ok(p);
        }
        if let Some(file) = default_file.filter(|f| f.exists()) {
            return first_line_of_file(file);
        }
        prompt(self.role.prompt()).context(self.role.advice())
    }
}

impl NewPasswordArgs {
    /// The password of something new that has no default (`cluster init`):
    /// `--new-password-file` or `LARDER_NEW_PASSWORD`, else the ordinary sources of
    /// `given` (`--password-file`, `--password-command`, `LARDER_PASSWORD`), else a
    /// prompt asked twice. An empty password is refused.
    pub fn get_or(&self, given: &PasswordArgs) -> Result<Password> {
        if self.new_password_file.is_none() && std::env::var_os("LARDER_NEW_PASSWORD").is_none() {
            if let Some(p) = given.given()? {
                return non_empty(p);
            }
        }
        self.get()
    }

    /// The new password: `--new-password-file`, `LARDER_NEW_PASSWORD`, or a prompt
    /// asked twice. An empty password is refused.
    pub fn get(&self) -> Result<Password> {
        let password = if let Some(file) = &self.new_password_file {
            first_line_of_file(file)?
        } else if let Ok(p) = std::env::var("LARDER_NEW_PASSWORD") {
            Zeroizing::new(p)
        } else {
            let first = prompt("new password: ").context(
                "no new password given: set LARDER_NEW_PASSWORD or use --new-password-file",
            )?;
            let again = prompt("new password again: ")?;
            if first != again {
                bail!("the two new passwords differ");
            }
            first
        };
        non_empty(password)
    }
}

fn first_line_of_file(path: &Path) -> Result<Password> {
    let text = Zeroizing::new(
        fs::read_to_string(path)
            .with_context(|| format!("reading the password file {}", path.display()))?,
    );
    Ok(Zeroizing::new(
        text.lines().next().unwrap_or("").to_string(),
    ))
}

/// Runs `cmd` with `sh -c` and returns the first line it prints. Its errors never
/// show `cmd`, which may hold a secret (a token, a password given to a vault).
fn run_password_command(cmd: &str) -> Result<Password> {
    let output = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::inherit())
        .stderr(Stdio::inherit())
        .output()
        .context("running the password command (`sh -c`)")?;
    let stdout = Zeroizing::new(output.stdout);
    if !output.status.success() {
        bail!("the password command failed ({})", output.status);
    }
    let text = std::str::from_utf8(&stdout).context("the password command printed non-UTF-8")?;
    Ok(Zeroizing::new(
        text.lines().next().unwrap_or("").to_string(),
    ))
}

/// Reads a line from the terminal with echo off. Fails when there is no terminal.
fn prompt(question: &str) -> Result<Password> {
    let tty = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()
        .filter(|_| {
            // SAFETY: isatty only inspects the descriptor.
            unsafe { libc::isatty(libc::STDIN_FILENO) == 1 }
        });
    let Some(mut tty) = tty else {
        bail!("no terminal to ask for a password on");
    };
    tty.write_all(question.as_bytes())?;
    tty.flush()?;
    let echo = EchoOff::new(&tty)?;
    let mut line = Zeroizing::new(String::new());
    io::BufReader::new(&tty).read_line(&mut line)?;
    drop(echo);
    tty.write_all(b"\n")?;
    Ok(Zeroizing::new(
        line.trim_end_matches(['\n', '\r']).to_string(),
    ))
}

/// Turns the terminal's echo off until dropped.
struct EchoOff {
    fd: i32,
    saved: libc::termios,
}

impl EchoOff {
    fn new(tty: &fs::File) -> Result<Self> {
        use std::os::fd::AsRawFd;
        let fd = tty.as_raw_fd();
        // SAFETY: termios is plain data; tcgetattr fills it for a valid descriptor.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            bail!("cannot read the terminal's settings");
        }
        let mut quiet = saved;
        quiet.c_lflag &= !libc::ECHO;
        // SAFETY: a valid descriptor and settings derived from its own.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) } != 0 {
            bail!("cannot turn the terminal's echo off");
        }
        Ok(Self { fd, saved })
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        // SAFETY: restores the settings read from the same descriptor.
        unsafe {
            libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved);
        }
    }
}

/// Where the default repository's generated password lives:
/// `$XDG_CONFIG_HOME/larder/default-repo.password` (or `~/.config/...`).
pub fn default_password_file() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".config"),
    };
    Ok(base.join("larder").join("default-repo.password"))
}

/// Generates the default repository's password and writes it to `path` (mode 0600,
/// its directory 0700); refuses to replace an existing file.
pub fn generate_password_file(path: &Path) -> Result<Password> {
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let password = Zeroizing::new(larder_crypto::random_password());
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating the password file {}", path.display()))?;
    file.write_all(format!("{}\n", password.as_str()).as_bytes())?;
    file.sync_all()?;
    Ok(password)
}
