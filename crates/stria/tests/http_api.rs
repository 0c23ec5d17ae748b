//! The HTTP listener of `stria serve --http` as its users meet it: the REST API answers with the
//! CLI's views, refuses every change without the right token (and then nothing happens), maps
//! errors to statuses, bounds bodies, serves HTTPS off the loopback only, and never shows the
//! token in its log or its metrics.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Daemon, POOL, Stria, expect};

/// A port that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// One HTTP/1.1 request; returns the status and the body.
pub(crate) fn http(port: u16, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the http listener");
    s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read the answer");
    let status = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{answer}"));
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

pub(crate) fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A pool of 2 fast and 6 capacity drives with an ec:4+2 volume `e` and a raid1 `r`, served
/// with the HTTP listener on a free port.
fn served() -> (Stria, Daemon, u16, String) {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "2", "--capacity", "6", "--drive-size", "256M"], 0);
    expect(&stria, &["volume", "create", "e", "--size", "64M", "--layout", "ec:4+2"], 0);
    expect(&stria, &["volume", "create", "r", "--size", "16M", "--layout", "raid1", "--class", "fast"], 0);
    let port = free_port();
    let daemon = Daemon::start_with(&stria, &["--http", &format!("tcp:127.0.0.1:{port}")]);
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "the http listener did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let token = std::fs::read_to_string(stria.dir.path().join(POOL).join("http.token")).expect("token file");
    (stria, daemon, port, token.trim().to_string())
}

/// Every route that changes state, with a body it would accept.
const CHANGES: &[(&str, &str, &str)] = &[
    (
        "POST",
        "/api/v1/volumes",
        r#"{"name": "x", "size_bytes": 4194304, "layout": "raid1", "chunk_bytes": null, "class": null}"#,
    ),
    ("DELETE", "/api/v1/volumes/r", ""),
    ("POST", "/api/v1/volumes/r/resize", r#"{"size_bytes": 33554432}"#),
    ("PUT", "/api/v1/volumes/r/qos", r#"{"iops_limit": {"set": 100}}"#),
    ("PUT", "/api/v1/volumes/r/cache-mode", r#"{"cache_mode": "write-back"}"#),
    ("POST", "/api/v1/volumes/e/scrub", ""),
    ("POST", "/api/v1/volumes/r/import", r#"{"path": "/dev/null"}"#),
    ("POST", "/api/v1/volumes/r/export", r#"{"path": "/tmp/stria-http-test-export"}"#),
    ("POST", "/api/v1/volumes/r/rollback", r#"{"snapshot": "s"}"#),
    ("POST", "/api/v1/volumes/r/snapshots", r#"{"name": "s"}"#),
    ("DELETE", "/api/v1/volumes/r/snapshots/s", ""),
    ("POST", "/api/v1/volumes/r/snapshots/s/clone", r#"{"name": "c"}"#),
    ("POST", "/api/v1/drives", r#"{"class": "fast", "size_bytes": 268435456}"#),
    ("POST", "/api/v1/drives/clear-errors", ""),
    ("DELETE", "/api/v1/drives/7", ""),
    ("POST", "/api/v1/drives/2/fail", ""),
    ("POST", "/api/v1/drives/2/online", ""),
    ("POST", "/api/v1/drives/2/replace", ""),
    ("POST", "/api/v1/drives/2/clear-errors", ""),
    ("PUT", "/api/v1/pool/rebuild-rate", r#"{"bytes_per_sec": 1}"#),
    ("POST", "/api/v1/pool/rebalance", ""),
    ("POST", "/api/v1/pool/clear", ""),
    ("POST", "/api/v1/pool/calibrate", ""),
];

#[test]
fn changes_without_the_right_token_get_401_and_change_nothing() {
    let (stria, daemon, port, token) = served();
    let (_, before) = http(port, "GET", "/api/v1/status", None, "");
    let before = json(&before);
    let mut last_byte_off = token.clone();
    let last = if token.ends_with('0') { "1" } else { "0" };
    last_byte_off.replace_range(token.len() - 1.., last);
    for (method, path, body) in CHANGES {
        for (what, t) in [
            ("no token", None),
            ("a wrong token", Some("0123456789abcdef0123456789abcdef")),
            ("the token with its last byte changed", Some(last_byte_off.as_str())),
            ("a prefix of the token", Some(&token[..32])),
        ] {
            let (status, answer) = http(port, method, path, t, body);
            assert_eq!(status, 401, "{method} {path} with {what}: {answer}");
            assert!(json(&answer)["error"].as_str().is_some_and(|e| e.contains("token")), "{answer}");
        }
    }
    // Nothing ran: no job was even started, and the pool's metadata did not move.
    let (_, jobs) = http(port, "GET", "/api/v1/jobs", None, "");
    assert_eq!(json(&jobs), Value::Array(vec![]), "jobs ran without a token");
    let (_, after) = http(port, "GET", "/api/v1/status", None, "");
    let after = json(&after);
    assert_eq!(before["generation"], after["generation"]);
    assert_eq!(before["drives"].as_array().map(Vec::len), after["drives"].as_array().map(Vec::len));
    for d in after["drives"].as_array().expect("drives") {
        assert_eq!(d["state"], "active", "{d}");
    }
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains(&token), "the token appears in the log");
    assert!(log.contains("http request refused"), "refusals are logged (method, path, status)");
    drop(stria);
}

#[test]
fn the_api_answers_with_the_cli_views_and_runs_changes_with_the_token() {
    let (stria, daemon, port, token) = served();
    let t = Some(token.as_str());
    // Reads on the loopback need no token, and match `stria status --json`.
    let (status, body) = http(port, "GET", "/api/v1/status", None, "");
    assert_eq!(status, 200, "{body}");
    let api = json(&body);
    let cli = json(&expect(&stria, &["status", "--json"], 0).stdout);
    assert_eq!(api["uuid"], cli["uuid"]);
    assert_eq!(api["drives"].as_array().map(Vec::len), Some(8));
    let names = |v: &Value| {
        v["volumes"].as_array().expect("volumes").iter().map(|v| v["name"].clone()).collect::<Vec<_>>()
    };
    assert_eq!(names(&api), names(&cli));
    let (status, body) = http(port, "GET", "/api/v1/volumes/e", None, "");
    assert_eq!((status, json(&body)["layout"].as_str()), (200, Some("ec:4+2")), "{body}");

    // Errors: 404 for what does not exist, 400 for a bad body, 409 for a refusal, 413 too big.
    let (status, body) = http(port, "GET", "/api/v1/volumes/nope", None, "");
    assert_eq!(status, 404, "{body}");
    assert!(json(&body)["error"].as_str().is_some_and(|e| e.contains("no volume named `nope`")));
    let (status, body) = http(port, "POST", "/api/v1/drives/42/fail", t, "");
    assert_eq!(status, 404, "{body}");
    let (status, body) = http(port, "POST", "/api/v1/drives/2/fail", t, r#"{"forse": true}"#);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("unknown field `forse`"), "{body}");
    let (status, body) = http(port, "POST", "/api/v1/volumes/e/scrub", t, &" ".repeat(100 << 10));
    assert_eq!(status, 413, "a body over 64 KiB: {body}");
    let (status, _) = http(port, "GET", "/api/v1/nothing-here", None, "");
    assert_eq!(status, 404);
    // By kind, not by text: 400 for a size the CLI refuses too (not rounded up), 409 for a name
    // taken, 507 when the pool has no room.
    let volume = |name: &str, size: u64| {
        format!(
            r#"{{"name": "{name}", "size_bytes": {size}, "layout": "raid1", "chunk_bytes": null, "class": null}}"#
        )
    };
    let (status, body) = http(port, "POST", "/api/v1/volumes", t, &volume("odd", 4096 * 100 + 1));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("4 KiB"), "{body}");
    let (status, body) = http(port, "GET", "/api/v1/volumes/odd", None, "");
    assert_eq!(status, 404, "nothing was created: {body}");
    let (status, body) = http(port, "POST", "/api/v1/volumes", t, &volume("e", 4 << 20));
    assert_eq!(status, 409, "{body}");
    let (status, body) = http(port, "POST", "/api/v1/volumes", t, &volume("huge", 64 << 30));
    assert_eq!(status, 507, "{body}");

    // A scrub runs as a job: 202, then its progress and result under /jobs.
    let (status, body) = http(port, "POST", "/api/v1/volumes/e/scrub", t, "");
    assert_eq!(status, 202, "{body}");
    let href = json(&body)["href"].as_str().expect("href").to_string();
    let start = Instant::now();
    let job = loop {
        let (_, body) = http(port, "GET", &href, None, "");
        let job = json(&body);
        if job["state"] != "running" {
            break job;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "scrub did not finish: {job}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(job["state"], "done", "{job}");
    assert!(job["result"]["blocks_checked"].as_u64().is_some_and(|n| n > 0), "{job}");
    assert_eq!(job["progress"]["done"], job["progress"]["total"], "{job}");

    // The cache mode: a thin volume made write-back, set back; a plain volume has none.
    let thin = r#"{"name": "t", "size_bytes": 16777216, "layout": "log:ec:4+2", "cache_bytes": 4194304, "cache_mode": "write-back"}"#;
    let (status, body) = http(port, "POST", "/api/v1/volumes", t, thin);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["cache_mode"], "write-back", "{body}");
    let (status, body) =
        http(port, "PUT", "/api/v1/volumes/t/cache-mode", t, r#"{"cache_mode": "write-through"}"#);
    assert_eq!(status, 200, "{body}");
    let shown = json(&expect(&stria, &["volume", "show", "t", "--json"], 0).stdout);
    assert_eq!(shown["cache_mode"], "write-through", "{shown}");
    let (status, body) =
        http(port, "PUT", "/api/v1/volumes/r/cache-mode", t, r#"{"cache_mode": "write-back"}"#);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("plain volume"), "{body}");
    let (status, body) = http(port, "PUT", "/api/v1/volumes/t/cache-mode", t, r#"{"cache_mode": "fast"}"#);
    assert_eq!(status, 400, "{body}");
    // A change with the token happens; the guard rails answer 409 with the CLI's message.
    let (status, body) = http(port, "POST", "/api/v1/drives/2/fail", t, "{}");
    assert_eq!((status, json(&body)["failed"].as_u64()), (200, Some(2)), "{body}");
    let (status, body) = http(port, "POST", "/api/v1/drives/2/fail", t, "");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("is failed already"), "{body}");
    let (status, body) = http(port, "POST", "/api/v1/drives/0/fail", t, "");
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(port, "POST", "/api/v1/drives/1/fail", t, "");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("last in-sync copy"), "{body}");
    let (status, body) = http(port, "POST", "/api/v1/volumes/r/snapshots", t, r#"{"name": "s"}"#);
    assert_eq!(status, 400, "raid1 volumes take no snapshots: {body}");
    let (status, body) = http(port, "PUT", "/api/v1/volumes/r/qos", t, r#"{"iops_limit": {"set": 500}}"#);
    assert_eq!(status, 200, "{body}");
    let shown = json(&expect(&stria, &["volume", "show", "r", "--json"], 0).stdout);
    assert_eq!(shown["qos"]["settings"]["iops_limit"].as_u64(), Some(500), "{shown}");
    let (status, body) = http(port, "GET", "/api/v1/jobs", None, "");
    let ops: Vec<String> =
        json(&body).as_array().expect("jobs").iter().map(|j| j["op"].as_str().unwrap_or("").into()).collect();
    assert_eq!(status, 200);
    assert!(ops.contains(&"scrub".to_string()) && ops.contains(&"drive-fail".to_string()), "{ops:?}");

    // Every change route exists: with the token, a body that is not JSON is a 400 (not the
    // fallback's 404 or a 405), and nothing runs.
    let (_, before) = http(port, "GET", "/api/v1/jobs", None, "");
    for (method, path, _) in CHANGES {
        let (status, body) = http(port, method, path, t, "[");
        assert_eq!(status, 400, "{method} {path}: {body}");
    }
    let (_, after) = http(port, "GET", "/api/v1/jobs", None, "");
    assert_eq!(json(&before).as_array().map(Vec::len), json(&after).as_array().map(Vec::len));

    // The metrics carry no token.
    let (status, metrics) = http(port, "GET", "/metrics", None, "");
    assert_eq!(status, 200);
    assert!(metrics.contains("stria_drive_state{drive=\"2\",state=\"failed\"} 1"), "{metrics}");
    assert!(!metrics.contains(&token));
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains(&token), "the token appears in the log");
}

#[test]
fn off_the_loopback_the_listener_needs_tls_and_reads_need_the_token() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "0", "--capacity", "3", "--drive-size", "64M"], 0);
    let out = expect(&stria, &["serve", "--nbd", "unix:nbd.sock", "--http", "tcp:0.0.0.0:0"], 1);
    assert!(out.stderr.contains("is not on the loopback: give --http-tls-cert"), "{}", out.stderr);
    let dir = stria.dir.path();
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-keyout", "key.pem", "-out", "cert.pem"])
        .current_dir(dir)
        .output()
        .expect("openssl (package openssl, installed by scripts/test.sh)");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let port = free_port();
    let cert = dir.join("cert.pem").display().to_string();
    let key = dir.join("key.pem").display().to_string();
    let http_addr = format!("tcp:0.0.0.0:{port}");
    let daemon =
        Daemon::start_with(&stria, &["--http", &http_addr, "--http-tls-cert", &cert, "--http-tls-key", &key]);
    let start = Instant::now();
    let token = loop {
        if let Ok(t) = std::fs::read_to_string(dir.join(POOL).join("http.token")) {
            break t;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no token file");
        std::thread::sleep(Duration::from_millis(20));
    };
    let url = format!("https://127.0.0.1:{port}/api/v1/status");
    let curl = |auth: Option<&str>| {
        let mut c = Command::new("curl");
        c.args(["-sk", "--max-time", "30", "--retry", "20", "--retry-connrefused", "--retry-delay", "1"]);
        c.args(["-o", "/dev/null", "-w", "%{http_code}"]);
        if let Some(t) = auth {
            c.args(["-H", &format!("Authorization: Bearer {}", t.trim())]);
        }
        let out = c.arg(&url).output().expect("curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert_eq!(curl(None), "401", "off the loopback, reads need the token");
    assert_eq!(curl(Some(&token)), "200");
    // Plain HTTP to the HTTPS port gets no answer.
    let plain = Command::new("curl")
        .args(["-s", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://127.0.0.1:{port}/api/v1/status"))
        .output()
        .expect("curl");
    assert_ne!(String::from_utf8_lossy(&plain.stdout), "200");
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
}

/// `GET /api/v1/volumes` lists the volumes clients see, as `volume list --json` does: a tiered
/// volume by its name (its parts only as names in its entry), and its clone.
#[test]
fn the_volume_list_is_of_client_visible_volumes() {
    let (stria, daemon, port, token) = served();
    expect(&stria, &["volume", "create", "vm", "--size", "32M", "--layout", "tiered:ec:4+2"], 0);
    expect(&stria, &["snapshot", "create", "vm", "s"], 0);
    expect(&stria, &["volume", "clone", "vm@s", "c"], 0);
    let (status, body) = http(port, "GET", "/api/v1/volumes", None, "");
    assert_eq!(status, 200, "{body}");
    let api = json(&body);
    let names: Vec<&str> =
        api.as_array().expect("an array").iter().map(|v| v["name"].as_str().expect("name")).collect();
    assert_eq!(names, ["c", "e", "r", "vm"], "{api}");
    let cli = json(&expect(&stria, &["volume", "list", "--json"], 0).stdout);
    assert_eq!(api, cli, "the API and `volume list --json` differ");
    let vm = api.as_array().expect("array").iter().find(|v| v["name"] == "vm").expect("vm");
    assert_eq!(
        (vm["kind"].as_str(), vm["parts"].as_array().map(Vec::len)),
        (Some("tiered"), Some(3)),
        "{vm}"
    );
    // A part is still shown by name.
    let (status, body) = http(port, "GET", "/api/v1/volumes/vm.seg", None, "");
    assert_eq!(status, 200, "{body}");

    // A volume with snapshots is deleted only when the request says they go too (409 names
    // them, and nothing changes); then it is deleted and kept, hidden, for its clone.
    let t = Some(token.as_str());
    let (status, body) = http(port, "DELETE", "/api/v1/volumes/vm", t, "");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("has 1 snapshot(s) (s)") && body.contains("with_snapshots"), "{body}");
    let (status, body) = http(port, "GET", "/api/v1/volumes/vm", None, "");
    assert_eq!(status, 200, "the refused delete changed nothing: {body}");
    let (status, body) = http(port, "DELETE", "/api/v1/volumes/vm", t, r#"{"with_snapshots": true}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["kept_for_clones"], serde_json::json!(["c"]), "{body}");
    let (status, body) = http(port, "GET", "/api/v1/volumes/vm", None, "");
    assert_eq!(status, 404, "{body}");
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
}
