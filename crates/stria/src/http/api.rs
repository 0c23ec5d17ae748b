//! The REST API under `/api/v1/`: each route turns method, path, query and JSON body into the
//! same [`Request`] the CLI sends over the control socket and runs it through
//! [`Daemon::execute`], so the API can do what the CLI can and answers with the same JSON views
//! (`--json`). Routes: docs/api/openapi.yaml (a test checks the two agree).
//!
//! Building the request: the route names the request's `op`; its path parameters, the query
//! (`?force=true`) and the body's fields (a JSON object) become the request's fields. A body
//! field that a path parameter already sets is refused.

use std::collections::HashMap;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use serde_json::{Map, Value, json};

use super::AppState;
use crate::ops::Request;

/// An error answer: `{"error": MESSAGE}` with a status saying whose fault it is.
#[derive(Debug)]
pub(crate) struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<anyhow::Error> for ApiError {
    /// The status code of the error's kind ([`status_of`]).
    fn from(e: anyhow::Error) -> ApiError {
        ApiError(status_of(crate::refusal::kind_of(&e)), format!("{e:#}"))
    }
}

/// The status code of an error kind: the one mapping, `stria_front::errors::http_status`.
pub(crate) fn status_of(kind: stria_engine::ErrorKind) -> StatusCode {
    let code = stria_front::errors::http_status(kind);
    StatusCode::from_u16(code).expect("the table holds valid status codes")
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// How a route runs its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Wait for the result: 200 with it.
    Wait,
    /// Start a job: 202 with its id (long operations: scrub, import, export, calibrate).
    Job,
}

/// A route's request: its `op`, path parameters renamed to request fields, how it runs.
#[derive(Debug, Clone, Copy)]
struct Route {
    op: &'static str,
    /// (path parameter, request field).
    params: &'static [(&'static str, &'static str)],
    mode: Mode,
}

const VOLUME: &[(&str, &str)] = &[("name", "volume")];
const NAME: &[(&str, &str)] = &[("name", "name")];
const DRIVE: &[(&str, &str)] = &[("id", "drive")];
const NONE: &[(&str, &str)] = &[];

fn wait(op: &'static str, params: &'static [(&'static str, &'static str)]) -> Route {
    Route { op, params, mode: Mode::Wait }
}

fn job(op: &'static str, params: &'static [(&'static str, &'static str)]) -> Route {
    Route { op, params, mode: Mode::Job }
}

/// Every route of the API (paths relative to `/api/v1`) with its methods: what the router
/// serves (checked when it is built) and docs/api/openapi.yaml lists (checked by a test).
pub(crate) const ROUTES: &[(&str, &str)] = &[
    ("/status", "get"),
    ("/stats", "get"),
    ("/jobs", "get"),
    ("/jobs/{id}", "get"),
    ("/volumes", "get post"),
    ("/volumes/{name}", "get delete"),
    ("/volumes/{name}/resize", "post"),
    ("/volumes/{name}/qos", "put"),
    ("/volumes/{name}/cache-mode", "put"),
    ("/volumes/{name}/scrub", "post"),
    ("/volumes/{name}/import", "post"),
    ("/volumes/{name}/export", "post"),
    ("/volumes/{name}/rollback", "post"),
    ("/volumes/{name}/convert", "post"),
    ("/volumes/{name}/snapshots", "get post"),
    ("/volumes/{name}/snapshots/{snap}", "delete"),
    ("/volumes/{name}/snapshots/{snap}/clone", "post"),
    ("/snapshots", "get"),
    ("/drives", "get post"),
    ("/drives/clear-errors", "post"),
    ("/drives/{id}", "delete"),
    ("/drives/{id}/fail", "post"),
    ("/drives/{id}/online", "post"),
    ("/drives/{id}/replace", "post"),
    ("/drives/{id}/clear-errors", "post"),
    ("/pool/rebuild-rate", "put"),
    ("/pool/rebalance", "post"),
    ("/pool/clear", "post"),
    ("/pool/calibrate", "post"),
];

/// The API's router.
pub(crate) fn router() -> Router<AppState> {
    let routes: Vec<(&str, MethodRouter<AppState>)> = vec![
        ("/status", get(|s: State<AppState>| read(s, Request::Status, None))),
        ("/stats", get(stats)),
        ("/jobs", get(|State(s): State<AppState>| async move { Json(s.daemon.jobs.list()) })),
        ("/jobs/{id}", get(job_status)),
        ("/volumes", get(volume_list).post(change(wait("volume-create", NONE)))),
        (
            "/volumes/{name}",
            get(|s: State<AppState>, Path(name): Path<String>| read(s, Request::VolumeShow { name }, None))
                .delete(change(wait("volume-delete", NAME))),
        ),
        ("/volumes/{name}/resize", axum::routing::post(change(wait("volume-resize", NAME)))),
        ("/volumes/{name}/qos", axum::routing::put(change(qos_route()))),
        ("/volumes/{name}/cache-mode", axum::routing::put(change(wait("volume-cache-mode", NAME)))),
        ("/volumes/{name}/scrub", axum::routing::post(change(job("scrub", NAME)))),
        ("/volumes/{name}/import", axum::routing::post(change(job("volume-import", NAME)))),
        ("/volumes/{name}/export", axum::routing::post(change(job("volume-export", NAME)))),
        ("/volumes/{name}/rollback", axum::routing::post(change(wait("volume-rollback", VOLUME)))),
        ("/volumes/{name}/convert", axum::routing::post(change(job("volume-convert", NAME)))),
        (
            "/volumes/{name}/snapshots",
            get(|s: State<AppState>, Path(name): Path<String>| {
                read(s, Request::SnapshotList { volume: Some(name) }, None)
            })
            .post(change(wait("snapshot-create", VOLUME))),
        ),
        (
            "/volumes/{name}/snapshots/{snap}",
            axum::routing::delete(change(wait("snapshot-delete", &[("name", "volume"), ("snap", "name")]))),
        ),
        ("/volumes/{name}/snapshots/{snap}/clone", axum::routing::post(clone)),
        ("/snapshots", get(|s: State<AppState>| read(s, Request::SnapshotList { volume: None }, None))),
        (
            "/drives",
            get(|s: State<AppState>| read(s, Request::Status, Some("drives")))
                .post(change(wait("drive-add", NONE))),
        ),
        ("/drives/clear-errors", axum::routing::post(change(wait("drive-clear-errors", NONE)))),
        ("/drives/{id}", axum::routing::delete(change(wait("drive-remove", DRIVE)))),
        ("/drives/{id}/fail", axum::routing::post(change(wait("drive-fail", DRIVE)))),
        ("/drives/{id}/online", axum::routing::post(change(wait("drive-online", DRIVE)))),
        ("/drives/{id}/replace", axum::routing::post(change(wait("drive-replace", DRIVE)))),
        ("/drives/{id}/clear-errors", axum::routing::post(change(wait("drive-clear-errors", DRIVE)))),
        ("/pool/rebuild-rate", axum::routing::put(change(wait("rebuild-rate", NONE)))),
        ("/pool/rebalance", axum::routing::post(change(wait("pool-rebalance", NONE)))),
        ("/pool/clear", axum::routing::post(change(wait("pool-clear", NONE)))),
        ("/pool/calibrate", axum::routing::post(change(job("pool-calibrate", NONE)))),
    ];
    assert_eq!(
        routes.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        ROUTES.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        "the router and ROUTES list the same paths"
    );
    routes.into_iter().fold(Router::new(), |r, (path, method)| r.route(path, method)).fallback(|| async {
        ApiError(StatusCode::NOT_FOUND, "no such API route (docs/api/openapi.yaml lists them)".into())
    })
}

/// `PUT /volumes/{name}/qos`: the body is the settings (`{"iops_limit": {"set": 1000}}`).
fn qos_route() -> Route {
    wait("volume-set", NAME)
}

/// Runs a read-only request; `field` picks one field of the answer.
async fn read(
    State(state): State<AppState>,
    request: Request,
    field: Option<&str>,
) -> Result<Response, ApiError> {
    let v = state.daemon.execute(request, None).await?;
    Ok(Json(match field {
        Some(f) => v.get(f).cloned().unwrap_or(Value::Null),
        None => v,
    })
    .into_response())
}

/// `GET /volumes`: the volumes clients see, as `volume list --json` gives them (a tiered or log
/// volume by its name, not its parts).
async fn volume_list(State(state): State<AppState>) -> Result<Response, ApiError> {
    let v = state.daemon.execute(Request::Status, None).await?;
    let status: stria_catalog::StatusView = serde_json::from_value(v).map_err(anyhow::Error::from)?;
    Ok(Json(status.volume_list()).into_response())
}

async fn stats(State(state): State<AppState>) -> Response {
    Json(state.daemon.stats()).into_response()
}

async fn job_status(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let id = id.parse::<u64>().map_err(|_| bad_request(format!("job id `{id}` is not a number")))?;
    let job =
        state.daemon.jobs.get(id).ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no job {id}")))?;
    Ok(Json(job).into_response())
}

/// `POST /volumes/{name}/snapshots/{snap}/clone` with `{"name": NEW}`.
async fn clone(
    state: State<AppState>,
    Path((volume, snap)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut fields = body_object(&body)?;
    let Some(Value::String(name)) = fields.remove("name") else {
        return Err(bad_request("the body needs `name`: the new clone's name"));
    };
    if let Some(extra) = fields.keys().next() {
        return Err(bad_request(format!("unknown field `{extra}`")));
    }
    run(state, Request::VolumeClone { source: format!("{volume}@{snap}"), name }, Mode::Wait).await
}

type ChangeFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, ApiError>> + Send>>;

/// A route that changes state: builds its request from path, query and body, and runs it.
#[allow(clippy::type_complexity)] // an axum handler's signature: its extractors in order
fn change(
    route: Route,
) -> impl Fn(State<AppState>, Path<HashMap<String, String>>, Query<HashMap<String, String>>, Bytes) -> ChangeFuture
+ Clone
+ Send
+ 'static {
    move |state, Path(params), Query(query), body| {
        Box::pin(async move {
            let request = build_request(route, &params, &query, &body)?;
            let request = confine_paths(state.transfer_dir.as_deref().map(|d| d.as_path()), request)?;
            run(state, request, route.mode).await
        })
    }
}

/// The request of `route` (see the module's doc).
fn build_request(
    route: Route,
    params: &HashMap<String, String>,
    query: &HashMap<String, String>,
    body: &[u8],
) -> Result<Request, ApiError> {
    let mut fields = body_object(body)?;
    for (key, text) in query {
        if fields.contains_key(key) {
            return Err(bad_request(format!("`{key}` is given in both the query and the body")));
        }
        fields.insert(key.clone(), query_value(text));
    }
    for (param, field) in route.params {
        let value =
            params.get(*param).ok_or_else(|| bad_request(format!("missing `{param}` in the path")))?;
        if fields.insert((*field).to_string(), Value::String(value.clone())).is_some() {
            return Err(bad_request(format!("`{field}` is set by the path; leave it out of the body")));
        }
    }
    if route.op == "volume-set" {
        // The settings travel as `qos`; the body is the settings alone.
        let name = fields.remove("name");
        let qos = Value::Object(std::mem::take(&mut fields));
        fields.insert("name".into(), name.unwrap_or(Value::Null));
        fields.insert("qos".into(), qos);
    }
    if fields.insert("op".into(), Value::String(route.op.into())).is_some() {
        return Err(bad_request("`op` is set by the route; leave it out of the body"));
    }
    let given = Value::Object(fields);
    let request: Request =
        serde_json::from_value(given.clone()).map_err(|e| bad_request(format!("bad request body: {e}")))?;
    // Serde passes over fields it does not know; a misspelt `force` must not go unnoticed.
    let known = serde_json::to_value(&request).map_err(|e| bad_request(e.to_string()))?;
    if let Some(field) = unknown_field(&given, &known) {
        return Err(bad_request(format!("unknown field `{field}` for {}", route.op)));
    }
    Ok(request)
}

/// Import and export read and write only inside `api_transfer_dir` (transfer.rs): 403 otherwise.
fn confine_paths(dir: Option<&std::path::Path>, mut request: Request) -> Result<Request, ApiError> {
    if let Request::VolumeImport { path, .. } | Request::VolumeExport { path, .. } = &mut request {
        *path = super::transfer::confine(dir, path).map_err(|m| ApiError(StatusCode::FORBIDDEN, m))?;
    }
    Ok(request)
}

/// A field of `given` (with a value other than null) that the request it became does not have,
/// looking into nested objects.
fn unknown_field(given: &Value, known: &Value) -> Option<String> {
    let (Value::Object(given), Value::Object(known)) = (given, known) else { return None };
    given.iter().filter(|(_, v)| !v.is_null()).find_map(|(k, v)| match known.get(k) {
        None => Some(k.clone()),
        Some(inner) => unknown_field(v, inner).map(|f| format!("{k}.{f}")),
    })
}

/// The body as a JSON object (an empty body is an empty object).
fn body_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad_request("the request body must be a JSON object")),
        Err(e) => Err(bad_request(format!("the request body is not JSON: {e}"))),
    }
}

/// A query value: `true`/`false` and whole numbers as such, anything else a string.
fn query_value(text: &str) -> Value {
    match text {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ => text.parse::<u64>().map_or_else(|_| Value::String(text.to_string()), Value::from),
    }
}

async fn run(State(state): State<AppState>, request: Request, mode: Mode) -> Result<Response, ApiError> {
    match mode {
        Mode::Wait => Ok(Json(state.daemon.execute(request, None).await?).into_response()),
        Mode::Job => {
            let (id, _task) = state.daemon.spawn(request, None)?;
            let href = format!("/api/v1/jobs/{id}");
            Ok((
                StatusCode::ACCEPTED,
                [(axum::http::header::LOCATION, href.clone())],
                Json(json!({ "job": id, "href": href })),
            )
                .into_response())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
    }

    #[test]
    fn requests_are_built_from_path_query_and_body() {
        let r = build_request(
            wait("drive-fail", DRIVE),
            &params(&[("id", "3")]),
            &params(&[("force", "true")]),
            b"",
        )
        .expect("built");
        assert!(matches!(r, Request::DriveFail { ref drive, force: true } if drive == "3"), "{r:?}");
        let r = build_request(
            wait("snapshot-delete", &[("name", "volume"), ("snap", "name")]),
            &params(&[("name", "tv"), ("snap", "s1")]),
            &HashMap::new(),
            b"{}",
        )
        .expect("built");
        assert!(
            matches!(r, Request::SnapshotDelete { ref volume, ref name, force: false, wait: false } if volume == "tv" && name == "s1")
        );
        let r = build_request(
            qos_route(),
            &params(&[("name", "v")]),
            &HashMap::new(),
            br#"{"iops_limit": {"set": 500}, "weight": "clear"}"#,
        );
        assert!(matches!(r, Ok(Request::VolumeSet { .. })), "{r:?}");
        let r = build_request(
            wait("volume-create", NONE),
            &HashMap::new(),
            &HashMap::new(),
            br#"{"name": "v", "size_bytes": 1073741824, "layout": "raid1", "chunk_bytes": null, "class": null}"#,
        );
        assert!(matches!(r, Ok(Request::VolumeCreate(_))), "{r:?}");
    }

    #[test]
    fn the_openapi_file_lists_every_route_and_method_and_no_other() {
        let yaml = include_str!("../../../../docs/api/openapi.yaml");
        let mut listed: Vec<(String, Vec<String>)> = Vec::new();
        let mut in_paths = false;
        for line in yaml.lines() {
            if line == "paths:" {
                in_paths = true;
            } else if in_paths && line.starts_with("  /") && line.ends_with(':') {
                listed.push((line.trim().trim_end_matches(':').to_string(), Vec::new()));
            } else if let Some(method) = line.strip_prefix("    ").and_then(|l| l.strip_suffix(':'))
                && ["get", "post", "put", "delete", "patch"].contains(&method)
                && let Some(last) = listed.last_mut()
            {
                last.1.push(method.to_string());
            }
        }
        let routes: Vec<(String, Vec<String>)> = ROUTES
            .iter()
            .map(|(p, m)| ((*p).to_string(), m.split(' ').map(String::from).collect()))
            .collect();
        assert_eq!(listed, routes);
    }

    #[test]
    fn bad_bodies_are_refused_with_a_reason() {
        let route = wait("drive-fail", DRIVE);
        let p = params(&[("id", "3")]);
        let none = HashMap::new();
        for (body, wanted) in [
            (&b"[1]"[..], "must be a JSON object"),
            (b"{", "not JSON"),
            (br#"{"drive": "4"}"#, "set by the path"),
            (br#"{"op": "drive-replace"}"#, "set by the route"),
            (br#"{"force": "yes"}"#, "bad request body"),
        ] {
            let e = build_request(route, &p, &none, body).expect_err("refused");
            assert_eq!(e.0, StatusCode::BAD_REQUEST);
            assert!(e.1.contains(wanted), "{}: {}", String::from_utf8_lossy(body), e.1);
        }
        let e = build_request(route, &p, &none, br#"{"forse": true}"#).expect_err("misspelt");
        assert!(e.1.contains("unknown field `forse`"), "{}", e.1);
        let e = build_request(qos_route(), &params(&[("name", "v")]), &none, br#"{"iops_limt": {"set": 5}}"#)
            .expect_err("misspelt setting");
        assert!(e.1.contains("unknown field `qos.iops_limt`"), "{}", e.1);
        let e = build_request(route, &p, &params(&[("force", "true")]), br#"{"force": true}"#)
            .expect_err("twice");
        assert!(e.1.contains("both the query and the body"), "{}", e.1);
    }

    /// Every route that builds its request from path, query and body.
    fn built_routes() -> Vec<Route> {
        vec![
            wait("volume-create", NONE),
            wait("volume-delete", NAME),
            wait("volume-resize", NAME),
            qos_route(),
            job("scrub", NAME),
            job("volume-import", NAME),
            wait("volume-rollback", VOLUME),
            job("volume-convert", NAME),
            wait("snapshot-create", VOLUME),
            wait("snapshot-delete", &[("name", "volume"), ("snap", "name")]),
            wait("drive-add", NONE),
            wait("drive-clear-errors", DRIVE),
            wait("drive-remove", DRIVE),
            wait("drive-fail", DRIVE),
            wait("drive-replace", DRIVE),
            wait("rebuild-rate", NONE),
            wait("pool-rebalance", NONE),
        ]
    }

    /// JSON values of every kind, nested a little.
    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            "[a-z_]{0,12}".prop_map(Value::String),
            "\\PC{0,20}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(FIELD_NAMES, inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
            ]
        })
    }

    /// Field names the requests have, and some they do not.
    const FIELD_NAMES: &str = "(name|force|size_bytes|layout|snapshot|path|class|drive|volume|new_path|domain|overwrite|bytes_per_sec|rate_bytes_per_sec|iops_limit|weight|set|clear|op|qos|x|[a-z]{1,6})";

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any bytes as a body, any path and query values: a request or a 400, never a panic.
        #[test]
        fn any_bytes_give_a_request_or_a_400(
            route in proptest::sample::select(built_routes()),
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            name in "\\PC{0,16}",
            query in proptest::collection::hash_map(FIELD_NAMES, "\\PC{0,8}", 0..3),
        ) {
            let params = params(&[("name", &name), ("snap", &name), ("id", &name)]);
            if let Err(e) = build_request(route, &params, &query, &body) {
                proptest::prop_assert_eq!(e.0, StatusCode::BAD_REQUEST);
            }
        }

        /// Structured JSON bodies with the requests' own field names: the same.
        #[test]
        fn any_json_object_gives_a_request_or_a_400(
            route in proptest::sample::select(built_routes()),
            fields in proptest::collection::btree_map(FIELD_NAMES, any_json(), 0..6),
        ) {
            let body = serde_json::to_vec(&fields).expect("serializes");
            let params = params(&[("name", "v"), ("snap", "s"), ("id", "1")]);
            match build_request(route, &params, &HashMap::new(), &body) {
                Ok(request) => {
                    // What was built is what the route names, with nothing of the body left out.
                    let built = serde_json::to_value(&request).expect("serializes");
                    proptest::prop_assert_eq!(built["op"].as_str(), Some(route.op));
                }
                Err(e) => proptest::prop_assert_eq!(e.0, StatusCode::BAD_REQUEST),
            }
        }
    }
}
