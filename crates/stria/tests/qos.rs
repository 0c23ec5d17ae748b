//! QoS settings with the real binary (issue 14): admission control against the pool's
//! calibration, with the numbers in the refusal; settings that outlive the process; a refused
//! create that leaves nothing behind; a delete that takes the settings with it. (What the
//! settings do to rates is measured by scripts/bench-qos.sh, not asserted in a timed test.)

use serde_json::Value;

use crate::common::{Outcome, Stria, expect};

fn json(out: &Outcome) -> Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

#[test]
fn reservations_are_admitted_against_the_calibration_and_settings_persist() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "2", "--capacity", "4", "--drive-size", "96M"], 0);
    let cal = json(&expect(&stria, &["pool", "calibrate", "--json"], 0));
    let fast =
        cal["classes"].as_array().expect("classes").iter().find(|c| c["class"] == "fast").expect("fast");
    let write_iops = fast["write_iops"].as_u64().expect("write_iops");
    let read_iops = fast["read_iops"].as_u64().expect("read_iops");
    assert!(write_iops > 0 && read_iops > 0, "{cal}");
    // The scratch volumes are gone.
    let status = expect(&stria, &["status", "--json"], 0).stdout;
    assert!(!status.contains("stria-calibrate"), "{status}");

    // A reserved 4 KiB IO costs the dearer of a read and a write (qos/cost.rs `reserved`): on
    // raid1 a write is two writes of the class, a read one read, so R IOPS take R times the
    // larger of 2 / write_iops and 1 / read_iops of its time (which one depends on how the
    // drives calibrated: a busy machine reads slower than it writes to memory-backed files).
    // 30 % each: two are admitted, the third would make 90 %.
    let r = (write_iops * 3 / 20).min(read_iops * 3 / 10);
    let r_arg = r.to_string();
    // A raid1 volume on the fast drives with a reservation.
    let create = |name: &str, reserve: &str, code| {
        let args = ["volume", "create", name, "--size", "8M", "--layout", "raid1", "--class", "fast"];
        expect(&stria, &[&args[..], &["--iops-reserve", reserve]].concat(), code)
    };
    create("a", &r_arg, 0);
    create("b", &r_arg, 0);
    let refused = create("c", &r_arg, 1);
    for part in [
        "reservation refused: `c` would take 30 % of the fast drives' time",
        "60 % is reserved already (a 30 %, b 30 %)",
        "at most 80 %",
        "2 fast drives were calibrated at",
    ] {
        assert!(refused.stderr.contains(part), "expected `{part}` in:\n{}", refused.stderr);
    }
    expect(&stria, &["volume", "show", "c"], 1);
    // A smaller one fits, and `volume set` is admitted the same way.
    let small = (r / 3).to_string();
    create("c", &small, 0);
    let refused = expect(&stria, &["volume", "set", "c", "--iops-reserve", &r_arg], 1);
    assert!(refused.stderr.contains("reservation refused"), "{}", refused.stderr);

    // Each command above is its own process: what `show` reads comes from the pool metadata.
    let a = json(&expect(&stria, &["volume", "show", "a", "--json"], 0));
    assert_eq!(a["qos"]["settings"]["iops_reserve"].as_u64(), Some(r), "{a}");
    let c = json(&expect(&stria, &["volume", "show", "c", "--json"], 0));
    assert_eq!(c["qos"]["settings"]["iops_reserve"].as_u64(), Some(r / 3), "{c}");

    // A delete takes the settings with it: a new `a` starts without any.
    expect(&stria, &["volume", "delete", "a"], 0);
    expect(&stria, &["volume", "create", "a", "--size", "8M", "--layout", "raid1", "--class", "fast"], 0);
    let a = json(&expect(&stria, &["volume", "show", "a", "--json"], 0));
    assert!(a["qos"]["settings"]["iops_reserve"].is_null(), "{a}");
    // And the room `a` held is free again: `b`'s reservation and one more of 30 % fit.
    expect(&stria, &["volume", "set", "a", "--iops-reserve", &r_arg], 0);
}
