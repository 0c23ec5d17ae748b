//! The dashboard: one page and its script and style, built into the binary (no build step, no
//! framework). It reads `/api/v1/status`, `/api/v1/stats` and `/api/v1/jobs` and sends its
//! actions to the API with the token the operator gives it.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use super::AppState;

const INDEX_HTML: &str = include_str!("../../ui/index.html");
const APP_JS: &str = include_str!("../../ui/app.js");
const APP_CSS: &str = include_str!("../../ui/app.css");

/// A file of the page: the built-in copy, or with `STRIA_UI_DIR` set (while working on the
/// page) the file of that name in that directory, read at each request.
fn file(content_type: &'static str, name: &str, built_in: &'static str) -> impl IntoResponse + use<> {
    let body = match std::env::var_os("STRIA_UI_DIR") {
        Some(dir) => std::fs::read_to_string(std::path::Path::new(&dir).join(name))
            .unwrap_or_else(|e| format!("cannot read {name} from STRIA_UI_DIR: {e}")),
        None => built_in.to_string(),
    };
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body)
}

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { file("text/html; charset=utf-8", "index.html", INDEX_HTML) }))
        .route("/ui/app.js", get(|| async { file("text/javascript; charset=utf-8", "app.js", APP_JS) }))
        .route("/ui/app.css", get(|| async { file("text/css; charset=utf-8", "app.css", APP_CSS) }))
}
