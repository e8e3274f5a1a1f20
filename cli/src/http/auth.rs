//! Who may use the HTTP API: clients on loopback, as on the client protocol; others only
//! with a bearer token from `--http-token-file`.
//!
//! The file holds one token per line (blank lines and `# comments` skipped), so a token is
//! rotated without a restart: add the new one, move the clients to it, remove the old one.
//! The agent notices a change of the file (its size or modification time) within a second.
//! A file that turns unreadable or invalid keeps the tokens it last held, with a warning:
//! an edit gone wrong must not lock every client out.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::{App, Client};

/// The largest token file read.
const MAX_FILE_BYTES: u64 = 64 * 1024;
/// The most tokens a file may hold.
const MAX_TOKENS: usize = 64;
/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;
/// How often the file is looked at for a change.
const RECHECK: Duration = Duration::from_secs(1);

/// The tokens of a token file, read again when the file changes.
#[derive(Debug)]
pub struct Tokens {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    /// SHA-256 of each token: compared digest to digest, a token's bytes never are.
    digests: Vec<[u8; 32]>,
    stamp: Option<Stamp>,
    checked: Instant,
}

/// A file's size and modification time: when either moves, it is read again.
type Stamp = (u64, SystemTime);

impl Tokens {
    /// Reads the file at start.
    ///
    /// # Errors
    /// One line naming the file and what to fix.
    pub fn load(path: &Path) -> Result<Self, String> {
        let (digests, stamp) = read(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            loaded: Mutex::new(Loaded {
                digests,
                stamp: Some(stamp),
                checked: Instant::now(),
            }),
        })
    }

    /// Whether `presented` is one of the file's tokens (as it is now, within a second).
    pub fn accepts(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if loaded.checked.elapsed() >= RECHECK {
            loaded.checked = Instant::now();
            self.reload(&mut loaded);
        }
        loaded.digests.contains(&digest)
    }

    fn reload(&self, loaded: &mut Loaded) {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
        if stamp.is_some() && stamp == loaded.stamp {
            return;
        }
        match read(&self.path) {
            Ok((digests, stamp)) => {
                tracing::info!(
                    file = %self.path.display(),
                    tokens = digests.len(),
                    "the HTTP token file changed; its tokens are in use"
                );
                loaded.digests = digests;
                loaded.stamp = Some(stamp);
            }
            Err(e) if loaded.stamp.is_some() => {
                tracing::warn!("{e}; the tokens read before stay in use until it is fixed");
                // Warned once per change: the next look compares against no stamp.
                loaded.stamp = None;
            }
            Err(_) => {}
        }
    }
}

/// The digests of the tokens in `path`, and its size and modification time.
fn read(path: &Path) -> Result<(Vec<[u8; 32]>, Stamp), String> {
    let shown = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the HTTP token file {shown}: {e}; check --http-token-file"))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "the HTTP token file {shown} has {} bytes, over the limit of {MAX_FILE_BYTES}; is it the right file?",
            meta.len()
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "the HTTP token file {shown} is open to group or others (mode {mode:04o}); run `chmod 600 {shown}`"
            ));
        }
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the HTTP token file {shown}: {e}; it must be UTF-8 text"))?;
    let mut digests = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let token = line.trim();
        if token.is_empty() || token.starts_with('#') {
            continue;
        }
        if token.len() < MIN_TOKEN_LEN || !token.chars().all(|c| c.is_ascii_graphic()) {
            return Err(format!(
                "the HTTP token file {shown}, line {}: a token is {MIN_TOKEN_LEN} or more printable ASCII characters without spaces (e.g. `head -c 24 /dev/urandom | base64`)",
                i + 1
            ));
        }
        digests.push(Sha256::digest(token.as_bytes()).into());
    }
    if digests.is_empty() || digests.len() > MAX_TOKENS {
        return Err(format!(
            "the HTTP token file {shown} holds {} tokens; give 1 to {MAX_TOKENS}, one per line",
            digests.len()
        ));
    }
    let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    Ok((digests, (meta.len(), modified)))
}

/// The middleware: loopback passes (unless `--http-require-token`), and so does a client
/// that showed a certificate of the cluster's CA over HTTPS; any other client shows a token
/// the file holds.
pub async fn check(State(app): State<App>, req: Request, next: Next) -> Response {
    let client = req.extensions().get::<Client>().copied();
    let loopback = client.is_some_and(|c| c.addr.ip().is_loopback());
    if (loopback && !app.access.loopback_needs_token) || client.is_some_and(|c| c.certificate) {
        return next.run(req).await;
    }
    let Some(tokens) = &app.access.tokens else {
        if app.access.tls.is_some() {
            return ApiError::unauthorized(
                "a client not on loopback shows a client certificate of the cluster's CA (this agent has no --http-token-file)",
            )
            .into_response();
        }
        return ApiError::forbidden(
            "this agent takes HTTP requests from loopback only; start it with --http-token-file to admit others",
        )
        .into_response();
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        None => ApiError::unauthorized(
            "this agent needs a token: send `Authorization: Bearer TOKEN` with a token of its --http-token-file",
        )
        .into_response(),
        Some(t) if tokens.accepts(t.trim()) => next.run(req).await,
        Some(_) => ApiError::forbidden(
            "this token is not in the agent's --http-token-file (rotated out?); ask its operator for a current one",
        )
        .into_response(),
    }
}
