//! The key that signs tokens. `JWT_SECRET` when it is set; unset, a server on its embedded
//! database generates one into `DATA_ROOT/jwt-secret` at its first start and reads it back at every
//! later one, so tokens outlive restarts without an operator choosing a secret. With
//! `DB_CONNECTION` it stays required: the nodes sharing one database must share one key, and a file
//! on one node's disk cannot give them that.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rand::RngCore;
use secrecy::SecretSlice;

use super::{invalid, Config, ConfigError, DatabaseConfig};

/// The file under `DATA_ROOT`.
pub const FILE_NAME: &str = "jwt-secret";
/// Shortest key accepted, from the variable or the file (HS256 wants at least its hash size).
pub const MIN_BYTES: usize = 32;
/// Random bytes of a generated key; the file holds them as hex, so it can be copied into
/// `JWT_SECRET` as it is (moving to `DB_CONNECTION` without signing everybody out).
const GENERATED_BYTES: usize = 32;

/// Where the key came from, for the one line start-up logs (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Variable,
    Generated(PathBuf),
    ReadFrom(PathBuf),
}

impl Source {
    pub fn log(&self) {
        match self {
            Source::Variable => tracing::info!("tokens are signed with JWT_SECRET"),
            Source::Generated(path) => tracing::info!(
                path = %path.display(),
                "JWT_SECRET is unset: generated a secret into the data root; it is read from there at every start"
            ),
            Source::ReadFrom(path) => {
                tracing::info!(path = %path.display(), "JWT_SECRET is unset: read the secret from the data root")
            }
        }
    }
}

/// What `JWT_SECRET` being unset means for `config`: the data root's file, or an error that says
/// why several nodes need the variable.
pub(super) fn check_unset(database: &DatabaseConfig) -> Result<(), String> {
    match database {
        DatabaseConfig::Embedded { .. } => Ok(()),
        DatabaseConfig::External(_) => Err(format!(
            "is required with DB_CONNECTION (at least {MIN_BYTES} bytes): every node sharing the database \
             must sign tokens with the same secret; only a server on its embedded database generates one \
             into DATA_ROOT/{FILE_NAME}"
        )),
    }
}

impl Config {
    /// `DATA_ROOT/jwt-secret`.
    pub fn jwt_secret_file(&self) -> PathBuf {
        self.data_root.join(FILE_NAME)
    }

    /// The signing key: `JWT_SECRET`, or the data root's file, created on first use.
    pub fn signing_key(&self) -> Result<(SecretSlice<u8>, Source), ConfigError> {
        if let Some(key) = &self.jwt_secret {
            return Ok((key.clone(), Source::Variable));
        }
        check_unset(&self.database).map_err(|reason| invalid("JWT_SECRET", reason))?;
        load_or_create(&self.jwt_secret_file()).map_err(|reason| invalid("JWT_SECRET", reason))
    }
}

/// Reads the key at `path`, or generates it there: written to a private temporary file, synced,
/// then linked into place, which fails when another process got there first (its key is read
/// then), so the file is whole or absent and two starts never end with two keys.
fn load_or_create(path: &Path) -> Result<(SecretSlice<u8>, Source), String> {
    if let Some(key) = read(path)? {
        return Ok((key, Source::ReadFrom(path.to_path_buf())));
    }
    let dir = path.parent().ok_or_else(|| format!("{} has no folder", path.display()))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut bytes = [0u8; GENERATED_BYTES];
    rand::thread_rng().fill_bytes(&mut bytes);
    let text = hex::encode(bytes);
    let temp = dir.join(format!(".{FILE_NAME}.{}", uuid::Uuid::new_v4().simple()));
    let written = write_private(&temp, &text);
    let linked = written.and_then(|()| std::fs::hard_link(&temp, path));
    let _ = std::fs::remove_file(&temp);
    match linked {
        Ok(()) => {
            // The link is durable once the folder is.
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| format!("cannot sync {}: {e}", dir.display()))?;
            Ok((SecretSlice::from(text.into_bytes()), Source::Generated(path.to_path_buf())))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match read(path)? {
            Some(key) => Ok((key, Source::ReadFrom(path.to_path_buf()))),
            None => Err(format!("{} appeared and vanished while it was being created", path.display())),
        },
        Err(e) => Err(format!("cannot write {}: {e}", path.display())),
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    // The mode above is filtered by the umask; the key's file is the owner's alone whatever it is.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(text.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()
}

/// The key in the file (its text without the line end), `None` when there is no file.
fn read(path: &Path) -> Result<Option<SecretSlice<u8>>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => secrecy::SecretString::from(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    use secrecy::ExposeSecret;
    let key = text.expose_secret().trim_end_matches(['\n', '\r']);
    if key.len() < MIN_BYTES {
        return Err(format!(
            "{} holds fewer than {MIN_BYTES} bytes; remove it to have a new secret generated (everybody \
             signs in again) or set JWT_SECRET",
            path.display()
        ));
    }
    Ok(Some(SecretSlice::from(key.as_bytes().to_vec())))
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777
    }

    #[test]
    fn generated_once_private_then_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("data").join(FILE_NAME);
        let (first, source) = load_or_create(&path).expect("generate");
        assert_eq!(source, Source::Generated(path.clone()));
        assert_eq!(mode(&path), 0o600);
        assert_eq!(first.expose_secret().len(), 2 * GENERATED_BYTES);
        let (again, source) = load_or_create(&path).expect("read");
        assert_eq!(source, Source::ReadFrom(path.clone()));
        assert_eq!(again.expose_secret(), first.expose_secret());
        // Nothing but the key is left beside it.
        let names: Vec<_> = std::fs::read_dir(path.parent().expect("dir"))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, [FILE_NAME]);
    }

    #[test]
    fn concurrent_first_starts_agree_on_one_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE_NAME);
        let keys: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| load_or_create(&path).expect("key").0.expose_secret().to_vec()))
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]), "one key for all");
    }

    #[test]
    fn a_short_or_unreadable_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, "short\n").expect("write");
        let err = load_or_create(&path).expect_err("short");
        assert!(err.contains(&path.display().to_string()) && err.contains("32 bytes"), "{err}");
        // An operator's own key, written without a line end, is taken as it is.
        std::fs::write(&path, "k".repeat(40)).expect("write");
        assert_eq!(load_or_create(&path).expect("own key").0.expose_secret(), "k".repeat(40).as_bytes());
    }
}
