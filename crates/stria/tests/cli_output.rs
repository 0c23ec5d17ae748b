//! Golden tests of the real command-line output: the built `stria` binary runs against a pool of
//! small sparse file drives in a temporary directory, and what each command gives (stdout,
//! stderr and exit code, in one file) is compared byte for byte with
//! `crates/stria/tests/golden/NAME.txt`, after masking what varies between runs: uuids, the
//! temporary directory, times, durations and pids.
//!
//! `STRIA_BLESS=1 cargo test -p stria --test stria_cli` rewrites the golden files. They pin the
//! JSON key sets and order and the human tables; a change to one is a change of the CLI.
//!
//! The commands run without a daemon (each opens the pool itself), one after the other, from the
//! pool's parent directory with a relative `--pool`. Drive paths are shown absolute (masked as
//! `<TMP>`); they are the last column of the tables, so their length widens no other column.
//! Logs are at `warn`: the info lines are not the command's output, a warning or an error is.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::{Outcome, POOL, Stria};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

impl Stria {
    /// The file as the golden files show it: the command, stdout, stderr and exit code, masked.
    fn render(&self, args: &[&str], out: &Outcome) -> String {
        let code = out.code.map_or_else(|| "killed by a signal".to_string(), |c| c.to_string());
        let text = format!(
            "$ stria --pool {POOL} {}\n--- stdout\n{}--- stderr\n{}--- exit code\n{code}\n",
            args.join(" "),
            ended(&out.stdout),
            ended(&out.stderr),
        );
        mask(&text, &self.tmp_paths())
    }

    /// The temporary directory as the binary may print it (as given and canonical).
    fn tmp_paths(&self) -> Vec<String> {
        let given = self.dir.path().display().to_string();
        let mut paths = vec![given];
        if let Ok(canonical) = self.dir.path().canonicalize() {
            paths.push(canonical.display().to_string());
        }
        // The longer first, so that one is never left half replaced by the other.
        paths.sort_by_key(|p| std::cmp::Reverse(p.len()));
        paths
    }
}

/// The text with a final newline (so that the section markers stay at the start of a line).
fn ended(s: &str) -> String {
    if s.is_empty() || s.ends_with('\n') { s.to_string() } else { format!("{s}\n[no newline at end]\n") }
}

/// Replaces what varies between runs by placeholders: the temporary directory (`<TMP>`), ANSI
/// colour codes (removed), uuids (`<UUID>`), RFC 3339 and `YYYY-MM-DD HH:MM:SS UTC` times
/// (`<TIME>`), unix times in `*_unix_secs` fields (`<UNIX_SECS>`), durations such as `12ms`,
/// `1.5s` or `0.004 s` (`<DURATION>`) and `pid N` (`pid <PID>`).
fn mask(text: &str, tmp_paths: &[String]) -> String {
    let mut text = text.to_string();
    for p in tmp_paths {
        text = text.replace(p.as_str(), "<TMP>");
    }
    let text = strip_ansi(&text);
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let boundary = i == 0 || !chars[i - 1].is_ascii_alphanumeric();
        if boundary {
            if let Some(n) = matches(&chars[i..], "hhhhhhhh-hhhh-hhhh-hhhh-hhhhhhhhhhhh")
                && !chars.get(i + n).is_some_and(char::is_ascii_alphanumeric)
            {
                out.push_str("<UUID>");
                i += n;
                continue;
            }
            if let Some(n) = time(&chars[i..]) {
                out.push_str("<TIME>");
                i += n;
                continue;
            }
            if let Some(n) = duration(&chars[i..]) {
                out.push_str("<DURATION>");
                i += n;
                continue;
            }
        }
        let numbered = [("_unix_secs\": ", "<UNIX_SECS>"), ("pid ", "<PID>")].into_iter().find_map(
            |(prefix, placeholder)| {
                let n = literal(&chars[i..], prefix)?;
                let digits = chars[i + n..].iter().take_while(|c| c.is_ascii_digit()).count();
                (digits > 0).then_some((prefix, placeholder, n + digits))
            },
        );
        if let Some((prefix, placeholder, n)) = numbered {
            out.push_str(prefix);
            out.push_str(placeholder);
            i += n;
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// The text without ANSI colour codes (`ESC [ digits/semicolons m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("\u{1b}[") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let params = after.find(|c: char| !(c.is_ascii_digit() || c == ';')).unwrap_or(after.len());
        if after[params..].starts_with('m') {
            rest = &after[params + 1..];
        } else {
            out.push_str(&rest[at..at + 2]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The length of `lit` when `s` starts with it.
fn literal(s: &[char], lit: &str) -> Option<usize> {
    let n = lit.chars().count();
    (s.len() >= n && s.iter().zip(lit.chars()).all(|(a, b)| *a == b)).then_some(n)
}

/// The length of the match of `pattern` at the start of `s`, where `h` in the pattern is a
/// lowercase hex digit, `d` a decimal digit and any other character itself.
fn matches(s: &[char], pattern: &str) -> Option<usize> {
    let mut n = 0;
    for p in pattern.chars() {
        let c = *s.get(n)?;
        let ok = match p {
            'h' => c.is_ascii_digit() || ('a'..='f').contains(&c),
            'd' => c.is_ascii_digit(),
            _ => c == p,
        };
        if !ok {
            return None;
        }
        n += 1;
    }
    Some(n)
}

/// `2026-01-02T03:04:05.678Z` (fraction and `Z` optional) or `2026-01-02 03:04:05 UTC`.
fn time(s: &[char]) -> Option<usize> {
    let date = matches(s, "dddd-dd-dd")?;
    let sep = *s.get(date)?;
    if sep != 'T' && sep != ' ' {
        return None;
    }
    let mut n = date + 1 + matches(&s[date + 1..], "dd:dd:dd")?;
    if s.get(n) == Some(&'.') {
        let digits = s[n + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits > 0 {
            n += 1 + digits;
        }
    }
    if s.get(n) == Some(&'Z') {
        n += 1;
    } else if literal(&s[n..], " UTC").is_some() {
        n += 4;
    }
    Some(n)
}

/// A number directly followed by a time unit (`ns`, `µs`, `us`, `ms`, `s`) and then not by a
/// letter or digit: `12ms`, `1.5s`, `300µs`.
fn duration(s: &[char]) -> Option<usize> {
    let mut n = s.iter().take_while(|c| c.is_ascii_digit()).count();
    if n == 0 {
        return None;
    }
    if s.get(n) == Some(&'.') {
        let fraction = s[n + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if fraction == 0 {
            return None;
        }
        n += 1 + fraction;
    }
    // Seconds are also printed with a space before the unit ("in 0.004 s").
    let unit = ["ns", "µs", "us", "ms", "s", " s"].iter().find_map(|u| literal(&s[n..], u))?;
    n += unit;
    if s.get(n).is_some_and(|c| c.is_alphanumeric()) {
        return None;
    }
    Some(n)
}

/// Compares outputs with the golden files (or rewrites them under `STRIA_BLESS=1`), and reports
/// every difference at the end rather than stopping at the first.
struct Golden {
    bless: bool,
    checked: BTreeSet<String>,
    failures: Vec<String>,
}

impl Golden {
    fn new() -> Self {
        let bless = std::env::var_os("STRIA_BLESS").is_some_and(|v| !v.is_empty() && v != "0");
        if bless {
            std::fs::create_dir_all(golden_dir()).expect("create the golden directory");
        }
        Self { bless, checked: BTreeSet::new(), failures: Vec::new() }
    }

    /// Runs `stria ARGS` and compares what it gave with golden/NAME.txt.
    fn check(&mut self, name: &str, stria: &Stria, args: &[&str]) -> Outcome {
        assert!(self.checked.insert(name.to_string()), "golden name {name} used twice");
        let out = stria.run(args);
        let actual = stria.render(args, &out);
        let path = golden_dir().join(format!("{name}.txt"));
        if self.bless {
            std::fs::write(&path, &actual).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            return out;
        }
        match std::fs::read_to_string(&path) {
            Ok(expected) if expected == actual => {}
            Ok(expected) => self.failures.push(format!(
                "{name}: the output differs from {}\n{}",
                path.display(),
                diff(&expected, &actual)
            )),
            Err(e) => self
                .failures
                .push(format!("{name}: cannot read {} ({e}); the output was:\n{actual}", path.display())),
        }
        out
    }

    /// Fails with every difference found, and with golden files that no check uses.
    fn finish(mut self) {
        let dir = std::fs::read_dir(golden_dir()).expect("read the golden directory");
        for entry in dir {
            let file = entry.expect("golden directory entry").file_name().to_string_lossy().into_owned();
            let name = file.strip_suffix(".txt").unwrap_or(&file);
            if !self.checked.contains(name) {
                self.failures.push(format!("golden/{file} is not checked by any test; remove it"));
            }
        }
        assert!(
            self.failures.is_empty(),
            "{} golden check(s) failed (STRIA_BLESS=1 rewrites the files, if the change is \
             intended):\n\n{}",
            self.failures.len(),
            self.failures.join("\n\n")
        );
    }
}

/// The lines that differ, as `-expected` / `+actual` pairs with their line numbers.
fn diff(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let mut out = String::new();
    for i in 0..e.len().max(a.len()) {
        let (x, y) = (e.get(i), a.get(i));
        if x != y {
            out.push_str(&format!(
                "line {}:\n-{}\n+{}\n",
                i + 1,
                x.unwrap_or(&"<none>"),
                y.unwrap_or(&"<none>")
            ));
        }
    }
    if out.is_empty() {
        out.push_str("(the lines are the same; the difference is in line endings)\n");
    }
    out
}

/// 4 MiB of data, 4 MiB of zeros, 100 KiB of data.
fn raw_image() -> Vec<u8> {
    let data = |n: usize, seed: usize| {
        (0..n).map(|i| u8::try_from((i * 7 + seed) % 251).expect("< 251")).collect::<Vec<u8>>()
    };
    let mut image = data(4 << 20, 3);
    image.extend(std::iter::repeat_n(0u8, 4 << 20));
    image.extend(data(100 << 10, 5));
    image
}

/// The commands in this order on one pool: each opens the pool (which commits its metadata) and
/// some read, so the generation and the counters each one shows depend on the ones before.
#[test]
fn cli_output_matches_the_golden_files() {
    let stria = Stria::new();
    let mut golden = Golden::new();
    let mut check = |name: &str, args: &[&str], code: i32| {
        let out = golden.check(name, &stria, args);
        assert_eq!(out.code, Some(code), "`stria {}`: stderr {}", args.join(" "), out.stderr);
    };

    // A pool of 2 fast and 6 capacity sparse drives, and one volume of each kind.
    check("pool_create", &["pool", "create", "--fast", "2", "--capacity", "6", "--drive-size", "256M"], 0);
    check("volume_create_raid1", &["volume", "create", "r1", "--size", "16M", "--layout", "raid1"], 0);
    check("volume_create_ec", &["volume", "create", "ec", "--size", "16M", "--layout", "ec:4+2"], 0);
    check(
        "volume_create_tiered",
        &["volume", "create", "tv", "--size", "32M", "--layout", "tiered:ec:4+2"],
        0,
    );
    check(
        "volume_create_overcommitted",
        &[
            "volume",
            "create",
            "thin",
            "--size",
            "64M",
            "--layout",
            "log:ec:4+2",
            "--space",
            "32M",
            "--cache-size",
            "16M",
            "--gc",
            "greedy",
        ],
        0,
    );

    // Data in the plain volumes, so that their counters are not all zero: a raw image of 4 MiB of
    // data, 4 MiB of zeros (written as zeroes) and 100 KiB of data (a partial ec row). Import
    // writes one step at a time, so the counters are the same on every run. The tiered volume
    // stays empty: its destager may start on its own once the cache holds data.
    let image = raw_image();
    std::fs::write(stria.dir.path().join("image.raw"), &image).expect("write image.raw");
    let too_large = std::fs::File::create(stria.dir.path().join("large.raw")).expect("create large.raw");
    too_large.set_len(40 << 20).expect("size large.raw");
    check("volume_import_raid1", &["volume", "import", "r1", "image.raw"], 0);
    check("volume_import_ec", &["volume", "import", "ec", "image.raw"], 0);
    check("volume_export_ec", &["volume", "export", "ec", "ec.raw"], 0);
    let exported = std::fs::read(stria.dir.path().join("ec.raw")).expect("read ec.raw");
    assert!(exported.len() == 16 << 20, "the export is the whole volume, {} bytes", exported.len());
    assert!(exported[..image.len()] == image[..], "the export begins with the imported image");
    assert!(exported[image.len()..].iter().all(|&b| b == 0), "the rest of the volume reads as zeros");

    // Reports.
    check("status", &["status"], 0);
    check("status_json", &["status", "--json"], 0);
    check("volume_list", &["volume", "list"], 0);
    check("volume_list_json", &["volume", "list", "--json"], 0);
    check("drive_list", &["drive", "list"], 0);
    check("drive_list_json", &["drive", "list", "--json"], 0);
    check("volume_show_raid1", &["volume", "show", "r1"], 0);
    check("volume_show_raid1_json", &["volume", "show", "r1", "--json"], 0);
    check("volume_show_ec", &["volume", "show", "ec"], 0);
    check("volume_show_ec_json", &["volume", "show", "ec", "--json"], 0);
    check("volume_show_tiered", &["volume", "show", "tv"], 0);
    check("volume_show_tiered_json", &["volume", "show", "tv", "--json"], 0);
    check("volume_show_tier_part", &["volume", "show", "tv.cache"], 0);
    check("volume_show_tier_part_json", &["volume", "show", "tv.cache", "--json"], 0);
    check("scrub_raid1", &["scrub", "r1"], 0);
    check("scrub_raid1_json", &["scrub", "r1", "--json"], 0);
    check("scrub_ec", &["scrub", "ec"], 0);
    check("scrub_tiered", &["scrub", "tv"], 0);
    check("scrub_tiered_json", &["scrub", "tv", "--json"], 0);

    // Operator mistakes: each fails with exit code 1 and says why; none changes the pool.
    check("mistake_unknown_layout", &["volume", "create", "x", "--size", "16M", "--layout", "raid7"], 1);
    check(
        "mistake_unknown_tiered_layout",
        &["volume", "create", "x", "--size", "16M", "--layout", "tiered:raid1"],
        1,
    );
    check(
        "mistake_cache_copies_out_of_range",
        &["volume", "create", "x", "--size", "16M", "--layout", "tiered:ec:4+2", "--cache-copies", "4"],
        1,
    );
    check("mistake_too_few_drives", &["volume", "create", "x", "--size", "16M", "--layout", "ec:8+2"], 1);
    check(
        "mistake_cache_size_on_plain_layout",
        &["volume", "create", "x", "--size", "16M", "--layout", "raid1", "--cache-size", "8M"],
        1,
    );
    check(
        "mistake_gc_on_plain_layout",
        &["volume", "create", "x", "--size", "16M", "--layout", "raid1", "--gc", "greedy"],
        1,
    );
    // A value the parser refuses is a usage error: exit code 2, as for every unknown option.
    check(
        "mistake_unknown_gc_policy",
        &["volume", "create", "x", "--size", "16M", "--layout", "tiered:ec:4+2", "--gc", "lazy"],
        2,
    );
    check("mistake_shrink_tiered", &["volume", "resize", "tv", "--size", "16M"], 1);
    check("mistake_resize_missing", &["volume", "resize", "nope", "--size", "64M"], 1);
    check("mistake_delete_missing", &["volume", "delete", "nope"], 1);
    check("mistake_show_missing", &["volume", "show", "nope"], 1);
    check("mistake_scrub_missing", &["scrub", "nope"], 1);
    check("mistake_scrub_tier_part", &["scrub", "tv.cache"], 1);
    check("mistake_resize_tier_part", &["volume", "resize", "tv.meta", "--size", "1M"], 1);
    check("mistake_delete_tier_part", &["volume", "delete", "tv.seg"], 1);
    check("mistake_drive_fail_unknown", &["drive", "fail", "42"], 1);
    check("mistake_import_too_large", &["volume", "import", "r1", "large.raw"], 1);
    check("mistake_import_too_large_tiered", &["volume", "import", "tv", "large.raw"], 1);
    // The pool is unchanged by all of the above.
    check("volume_list_after_mistakes", &["volume", "list"], 0);

    // A clone of a snapshot is a volume of its own; mistakes around it are refused.
    check("snapshot_create", &["snapshot", "create", "tv", "s1"], 0);
    // A shrink keeps the snapshot as it was (its size too); the volume grows back.
    check(
        "volume_resize_tiered_with_snapshot",
        &["volume", "resize", "tv", "--size", "16M", "--allow-shrink"],
        0,
    );
    check("volume_resize_tiered_with_snapshot_back", &["volume", "resize", "tv", "--size", "32M"], 0);
    check("volume_clone", &["volume", "clone", "tv@s1", "tvc"], 0);
    check("volume_show_clone", &["volume", "show", "tvc"], 0);
    check("volume_show_with_snapshot_and_clone", &["volume", "show", "tv"], 0);
    check("mistake_clone_without_snapshot", &["volume", "clone", "tv", "x"], 1);
    check("mistake_clone_missing_snapshot", &["volume", "clone", "tv@nope", "x"], 1);
    check("mistake_clone_plain", &["volume", "clone", "r1@s1", "x"], 1);
    check("mistake_clone_name_taken", &["volume", "clone", "tv@s1", "r1"], 1);
    check("mistake_clone_bad_name", &["volume", "clone", "tv@s1", "no/slash"], 1);
    // A clone's own snapshots, a clone of one, a rollback, deletes.
    check("snapshot_of_clone", &["snapshot", "create", "tvc", "s"], 0);
    check("volume_clone_of_clone", &["volume", "clone", "tvc@s", "tvcc"], 0);
    check("volume_show_clone_with_snapshot", &["volume", "show", "tvc"], 0);
    check("snapshot_list_of_clone", &["snapshot", "list", "tvc"], 0);
    check("volume_rollback_clone", &["volume", "rollback", "tvc", "s"], 0);
    check("mistake_snapshot_of_clone_taken", &["snapshot", "create", "tvc", "s"], 1);
    check("volume_delete_clone_of_clone", &["volume", "delete", "tvcc"], 0);
    check("snapshot_delete_of_clone", &["snapshot", "delete", "tvc", "s"], 0);
    check("snapshot_list", &["snapshot", "list"], 0);
    // Past its origin's 32 MiB: the family's map grows, the origin keeps its size.
    check("volume_resize_clone_past_origin", &["volume", "resize", "tvc", "--size", "64M"], 0);
    check("mistake_shrink_clone", &["volume", "resize", "tvc", "--size", "16M"], 1);
    check("volume_resize_clone", &["volume", "resize", "tvc", "--size", "16M", "--allow-shrink"], 0);
    check("volume_resize_clone_back", &["volume", "resize", "tvc", "--size", "32M"], 0);
    check("snapshot_delete_kept_for_clone", &["snapshot", "delete", "tv", "s1"], 0);
    check("volume_list_with_clone", &["volume", "list"], 0);
    check("volume_delete_clone", &["volume", "delete", "tvc"], 0);

    // A plain volume made log-structured, so that it takes snapshots (docs/design/convert.md).
    check("volume_create_to_convert", &["volume", "create", "pc", "--size", "16M", "--layout", "raid1"], 0);
    check(
        "volume_convert",
        &["volume", "convert", "pc", "--layout", "tiered:ec:4+2", "--cache-size", "4M"],
        0,
    );
    check("volume_show_converted", &["volume", "show", "pc"], 0);
    check("snapshot_create_converted", &["snapshot", "create", "pc", "s"], 0);
    check("mistake_convert_log_volume", &["volume", "convert", "pc", "--layout", "log:ec:4+2"], 1);
    check("mistake_convert_to_plain_layout", &["volume", "convert", "r1", "--layout", "raid10"], 1);
    check("mistake_convert_missing", &["volume", "convert", "nope", "--layout", "log:ec:4+2"], 1);
    check("mistake_convert_no_layout", &["volume", "convert", "r1"], 2);
    // Its snapshot would go with it: refused, naming it, until the command says so.
    check("mistake_delete_with_snapshots", &["volume", "delete", "pc"], 1);
    check("snapshot_list_after_refused_delete", &["snapshot", "list", "pc"], 0);
    check("volume_delete_converted", &["volume", "delete", "pc", "--with-snapshots"], 0);

    // QoS settings (limits need no calibration; what reservations need is in tests/qos.rs).
    check(
        "volume_set_limits",
        &["volume", "set", "r1", "--iops-limit", "500", "--bw-limit", "64M", "--weight", "50"],
        0,
    );
    check("volume_show_with_qos_json", &["volume", "show", "r1", "--json"], 0);
    check("mistake_qos_reserve_above_limit", &["volume", "set", "r1", "--iops-reserve", "1000"], 1);
    check("mistake_qos_zero", &["volume", "set", "r1", "--iops-limit", "0"], 1);
    check("mistake_qos_weight_too_large", &["volume", "set", "r1", "--weight", "20000"], 1);
    check("mistake_qos_nothing_to_set", &["volume", "set", "r1"], 1);
    check("mistake_qos_not_a_number", &["volume", "set", "r1", "--iops-limit", "fast"], 2);
    check(
        "mistake_qos_none_at_create",
        &["volume", "create", "x", "--size", "16M", "--layout", "raid1", "--weight", "none"],
        1,
    );
    check("mistake_qos_missing", &["volume", "set", "nope", "--weight", "5"], 1);
    check(
        "volume_set_clear",
        &["volume", "set", "r1", "--iops-limit", "none", "--bw-limit", "none", "--weight", "none"],
        0,
    );

    // The cache mode of a thin volume: kept in its record (each command opens the pool anew, so
    // `show` reads it back from there); plain volumes and unknown modes refused.
    check("volume_set_cache_mode", &["volume", "set", "tv", "--cache-mode", "write-back"], 0);
    check("volume_show_tiered_write_back", &["volume", "show", "tv"], 0);
    check("mistake_cache_mode_on_plain_volume", &["volume", "set", "r1", "--cache-mode", "write-back"], 1);
    check("mistake_unknown_cache_mode", &["volume", "set", "tv", "--cache-mode", "fast"], 2);
    check(
        "mistake_cache_mode_on_plain_layout",
        &["volume", "create", "x", "--size", "16M", "--layout", "raid1", "--cache-mode", "write-back"],
        1,
    );
    check(
        "volume_set_cache_mode_back",
        &["volume", "set", "tv", "--cache-mode", "write-through", "--json"],
        0,
    );

    // A drive joins the pool; the next volume uses it (its members include drive 8).
    check("drive_add", &["drive", "add", "--class", "capacity", "--size", "256M", "--domain", "r2"], 0);
    check(
        "volume_create_on_added_drive",
        &["volume", "create", "wide", "--size", "16M", "--layout", "ec:5+2"],
        0,
    );
    check("mistake_drive_add_nothing", &["drive", "add", "--class", "capacity"], 1);
    check(
        "mistake_drive_add_member",
        &["drive", "add", "pool/drives/capacity-2.img", "--class", "capacity"],
        1,
    );
    check("mistake_drive_add_missing_file", &["drive", "add", "nope.img", "--class", "fast"], 1);
    // ec:5+2 needs seven capacity drives: with drive 8 gone there would be six.
    check("mistake_drive_remove_no_room", &["drive", "remove", "8"], 1);
    // With one more, removing a drive that holds data moves it there first (no daemon: in the
    // request).
    check("drive_add_again", &["drive", "add", "--class", "capacity", "--size", "256M", "--domain", "r2"], 0);
    check("drive_remove_with_data", &["drive", "remove", "8"], 0);
    check("volume_show_after_drive_remove", &["volume", "show", "wide"], 0);
    check("volume_delete_wide", &["volume", "delete", "wide"], 0);
    check("drive_remove", &["drive", "remove", "9"], 0);
    check("drive_list_after_remove", &["drive", "list"], 0);
    check("pool_rebalance", &["pool", "rebalance"], 0);
    check("drive_list_after_rebalance", &["drive", "list"], 0);

    // A tiered volume whose snapshot has a clone is deleted for the user and kept, hidden, for
    // the clone; the clone's delete takes it.
    check("snapshot_create_for_clone", &["snapshot", "create", "tv", "s2"], 0);
    check("volume_clone_for_origin_delete", &["volume", "clone", "tv@s2", "tvk"], 0);
    check("volume_delete_origin_with_clone", &["volume", "delete", "tv", "--with-snapshots"], 0);
    check("volume_list_origin_kept_for_clone", &["volume", "list"], 0);
    check(
        "mistake_reuse_kept_origin_name",
        &["volume", "create", "tv", "--size", "16M", "--layout", "raid1"],
        1,
    );
    check("mistake_show_deleted_origin", &["volume", "show", "tv"], 1);
    check("mistake_snapshot_of_deleted_origin", &["snapshot", "create", "tv", "s3"], 1);
    check("volume_delete_last_clone", &["volume", "delete", "tvk"], 0);
    check("volume_list_after_last_clone", &["volume", "list"], 0);

    // A directory without a pool.
    let empty = Stria::new();
    let out = golden.check("mistake_no_pool", &empty, &["status"]);
    assert_eq!(out.code, Some(1), "`stria status` without a pool: stderr {}", out.stderr);

    golden.finish();
}

#[test]
fn masking_hides_what_varies_and_keeps_the_rest() {
    let tmp = vec!["/tmp/.tmpAbC123".to_string()];
    let text = "pool x (0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0), \u{1b}[2m2026-11-22T22:45:55.911340Z\u{1b}[0m \
                /tmp/.tmpAbC123/pool/drives/fast-0.img last read error 2023-11-14 22:13:20 UTC \
                \"last_read_error_unix_secs\": 1700000000, locked (pid 4242), took 12ms and 1.5s; \
                64 MiB, 256 rows, ec:4+2, 4@0, abcdef0123";
    assert_eq!(
        mask(text, &tmp),
        "pool x (<UUID>), <TIME> <TMP>/pool/drives/fast-0.img last read error <TIME> \
         \"last_read_error_unix_secs\": <UNIX_SECS>, locked (pid <PID>), took <DURATION> and \
         <DURATION>; 64 MiB, 256 rows, ec:4+2, 4@0, abcdef0123"
    );
}
