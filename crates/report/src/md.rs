//! Markdown pieces of REPORT.md.

use std::fmt::Write as _;

/// A pipe table; `right` marks the columns aligned right (numbers).
pub(crate) fn table(headers: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| {} |", headers.join(" | "));
    let align: Vec<&str> = (0..headers.len())
        .map(|i| if right.get(i).copied().unwrap_or(false) { "---:" } else { "---" })
        .collect();
    let _ = writeln!(s, "|{}|", align.join("|"));
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}

/// A figure with `decimals` digits, `-` when absent or not finite.
pub(crate) fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => "-".into(),
    }
}

/// A ratio as `1.23x`, `-` when absent.
pub(crate) fn ratio(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.2}x"),
        _ => "-".into(),
    }
}

/// An image line.
pub(crate) fn image(alt: &str, file: &str) -> String {
    format!("![{alt}]({file})\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_header_alignment_and_rows() {
        let t = table(&["a", "b"], &[false, true], &[vec!["x".into(), "1".into()]]);
        assert_eq!(t, "| a | b |\n|---|---:|\n| x | 1 |\n");
        assert_eq!(num(None, 1), "-");
        assert_eq!(num(Some(f64::NAN), 1), "-");
        assert_eq!(ratio(Some(1.234)), "1.23x");
    }
}
