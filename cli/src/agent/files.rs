//! The files the agent reads besides its config: the cluster secret and the TLS files.

use std::path::{Path, PathBuf};

use crate::Fail;

/// The largest secret file read.
const MAX_SECRET_BYTES: u64 = 4096;

/// Reads the cluster secret from `path`: its bytes, without trailing whitespace. A file
/// that group or others may read or write is refused.
pub fn read_secret(path: &Path) -> Result<Vec<u8>, Fail> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| {
        Fail::usage(format!(
            "cannot read the cluster secret file {shown}: {e}; check --cluster-secret-file"
        ))
    })?;
    if meta.len() > MAX_SECRET_BYTES {
        return Err(Fail::usage(format!(
            "the cluster secret file {shown} has {} bytes, over the limit of {MAX_SECRET_BYTES}",
            meta.len()
        )));
    }
    // As ssh does with private keys: a secret others can read is no longer a secret.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(Fail::usage(format!(
                "the cluster secret file {shown} is open to group or others (mode {mode:04o}); run `chmod 600 {shown}`"
            )));
        }
    }
    let mut bytes = std::fs::read(path).map_err(|e| {
        Fail::usage(format!(
            "cannot read the cluster secret file {shown}: {e}; check --cluster-secret-file"
        ))
    })?;
    while bytes.last().is_some_and(u8::is_ascii_whitespace) {
        bytes.pop();
    }
    let min = roster::transport::handshake::MIN_SECRET_LEN;
    if bytes.len() < min {
        return Err(Fail::usage(format!(
            "the cluster secret in {shown} has {} bytes; use at least {min} (e.g. `head -c 32 /dev/urandom | base64 > {shown}; chmod 600 {shown}`)",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// The three TLS files, all or none.
pub fn tls_files(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> Result<Option<(PathBuf, PathBuf, PathBuf)>, Fail> {
    match (cert, key, ca) {
        (Some(cert), Some(key), Some(ca)) => Ok(Some((cert, key, ca))),
        (None, None, None) => Ok(None),
        (cert, key, ca) => {
            let missing: Vec<&str> = [
                (cert.is_none(), "--tls-cert"),
                (key.is_none(), "--tls-key"),
                (ca.is_none(), "--tls-ca"),
            ]
            .into_iter()
            .filter_map(|(gone, flag)| gone.then_some(flag))
            .collect();
            Err(Fail::usage(format!(
                "TLS needs --tls-cert, --tls-key and --tls-ca together; {} missing (pass all three, or none)",
                missing.join(" and ")
            )))
        }
    }
}
