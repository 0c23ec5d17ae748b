//! Smaller truths an operator met (issue: "smaller truths the operator met"), each with the real
//! binary: what the command said or did, and what it says and does now. The shipped
//! configuration and unit file are checked in service.rs, the dashboard by tests/ui/run.sh.

use crate::common::{Stria, expect};

fn says(text: &str, part: &str) {
    assert!(text.contains(part), "expected `{part}` in:\n{text}");
}

#[test]
fn a_volume_name_must_start_with_a_letter_or_a_digit() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    for name in ["-rf", ".x", "_x"] {
        let out = expect(&stria, &["volume", "create", "--size", "4M", "--layout", "raid1", "--", name], 1);
        says(&out.stderr, &format!("volume name `{name}` is invalid"));
        says(&out.stderr, "starting with a letter or a digit");
    }
    let list = expect(&stria, &["volume", "list"], 0);
    says(&list.stdout, "no volumes");
}

#[test]
fn a_size_too_large_is_called_too_large() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    for size in ["18446744073709551615", "18446744073709547520", "16383P", "2048P"] {
        let out = expect(&stria, &["volume", "create", "v", "--size", size, "--layout", "raid1"], 2);
        says(&out.stderr, "is too large: a volume is at most 1024 PiB (2^60 bytes)");
    }
    let out =
        expect(&stria, &["volume", "create", "v", "--size", "18446744073709551616", "--layout", "raid1"], 2);
    says(&out.stderr, "out of range");
    expect(&stria, &["volume", "create", "v", "--size", "4M", "--layout", "raid1"], 0);
    let out = expect(&stria, &["volume", "resize", "v", "--size", "16383P"], 2);
    says(&out.stderr, "is too large");
}

#[test]
fn up_help_names_the_volume_it_makes() {
    let stria = Stria::new();
    let out = expect(&stria, &["up", "--help"], 0);
    says(&out.stdout, "a tiered:ec:4+2 volume vol0");
}
