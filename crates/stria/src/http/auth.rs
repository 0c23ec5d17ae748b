//! The bearer token: 32 random bytes in hex, kept in a file of mode 0600 (made at the first
//! start). Every request that changes state must carry it (`Authorization: Bearer TOKEN`); on a
//! listener off the loopback, reads must too. A request without it, or with a wrong one, is
//! answered 401 before any handler runs, so nothing happens. The token is never logged.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::{Context, Result, bail};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::AppState;

/// Random bytes in a token.
const TOKEN_BYTES: usize = 32;

/// The API token.
pub(crate) struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// Reads the token from `path`, or makes one there (mode 0600) when the file is missing.
    /// A file that others may read is refused.
    pub(crate) fn load_or_create(path: &Path) -> Result<Token> {
        match std::fs::File::open(path) {
            Ok(mut f) => {
                let mode = f.metadata()?.permissions().mode();
                if mode & 0o077 != 0 {
                    bail!(
                        "the token file {} may be read by others (mode {:o}): `chmod 600` it",
                        path.display(),
                        mode & 0o777
                    );
                }
                let mut text = String::new();
                f.read_to_string(&mut text).with_context(|| format!("cannot read {}", path.display()))?;
                let token = text.trim();
                if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
                    bail!(
                        "the token file {} holds no usable token (16 or more printable characters)",
                        path.display()
                    );
                }
                Ok(Token(token.to_string()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut raw = [0u8; TOKEN_BYTES];
                std::fs::File::open("/dev/urandom")
                    .and_then(|mut r| r.read_exact(&mut raw))
                    .context("cannot read /dev/urandom for a token")?;
                let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .with_context(|| format!("cannot create the token file {}", path.display()))?;
                writeln!(f, "{token}")?;
                f.sync_all()?;
                tracing::info!(path = %path.display(), "made a new API token");
                Ok(Token(token))
            }
            Err(e) => Err(e).with_context(|| format!("cannot open the token file {}", path.display())),
        }
    }

    /// True when `headers` carry this token as a bearer token (compared in constant time).
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Some(given) = value.strip_prefix("Bearer ") else { return false };
        bool::from(given.trim().as_bytes().ct_eq(self.0.as_bytes()))
    }
}

/// Paths that hold no pool data: the dashboard's page and its scripts.
fn is_static(path: &str) -> bool {
    path == "/" || path.starts_with("/ui/")
}

/// Middleware: refuses with 401 what needs the token and lacks it.
pub(crate) async fn check(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let reads = matches!(*req.method(), Method::GET | Method::HEAD);
    let needs_token = if reads { state.reads_need_token && !is_static(req.uri().path()) } else { true };
    if needs_token && !state.token.read().admits(req.headers()) {
        let message = if req.headers().contains_key(header::AUTHORIZATION) {
            "wrong token: send the one in the pool's http.token file as `Authorization: Bearer TOKEN`"
        } else {
            "this request needs the API token: send the one in the pool's http.token file as \
             `Authorization: Bearer TOKEN`"
        };
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            axum::Json(serde_json::json!({ "error": message })),
        )
            .into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_made_once_kept_private_and_compared_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("http.token");
        let made = Token::load_or_create(&path).expect("made");
        assert_eq!(made.0.len(), 2 * TOKEN_BYTES);
        assert_eq!(std::fs::metadata(&path).expect("file").permissions().mode() & 0o777, 0o600);
        let again = Token::load_or_create(&path).expect("read back");
        assert_eq!(made.0, again.0);
        assert!(!format!("{made:?}").contains(&made.0), "Debug hides the token");

        let mut headers = HeaderMap::new();
        assert!(!made.admits(&headers));
        headers.insert(header::AUTHORIZATION, format!("Bearer {}", made.0).parse().expect("header"));
        assert!(made.admits(&headers));
        let mut last_byte_off = made.0.clone();
        let last = if last_byte_off.ends_with('0') { "1" } else { "0" };
        last_byte_off.replace_range(last_byte_off.len() - 1.., last);
        headers.insert(header::AUTHORIZATION, format!("Bearer {last_byte_off}").parse().expect("header"));
        assert!(!made.admits(&headers));
        headers.insert(header::AUTHORIZATION, format!("Bearer {}", &made.0[..10]).parse().expect("header"));
        assert!(!made.admits(&headers), "a prefix is not the token");
        headers.insert(header::AUTHORIZATION, made.0.parse().expect("header"));
        assert!(!made.admits(&headers), "the Bearer scheme is needed");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let refused = Token::load_or_create(&path).expect_err("world-readable");
        assert!(refused.to_string().contains("chmod 600"), "{refused}");
    }
}
