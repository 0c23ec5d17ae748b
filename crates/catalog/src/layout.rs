//! The one parser of layout names: `raid0[:W]`, `raid1[:N]`, `raid10[:WxN]`, `ec:K+M`,
//! `tiered:ec:K+M` and `log:ec:K+M`.

use std::str::FromStr;

use stria_engine::Layout;

use crate::CatalogError;

/// A layout as the operator names it, before the pool fills in defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutSpec {
    Plain(PlainLayout),
    /// A thin, log-structured volume with its segments on `ec:K+M` of the capacity drives:
    /// `tiered:ec:K+M` keeps its write cache and map on fast drives (`fast_tier`), `log:ec:K+M`
    /// on the capacity drives.
    Log {
        data_shards: u32,
        parity_shards: u32,
        fast_tier: bool,
    },
}

/// A plain layout; `None` parts take their default from the drives of the class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlainLayout {
    /// Default width: every active drive of the class.
    Raid0 {
        width: Option<u32>,
    },
    Raid1 {
        copies: u32,
    },
    /// Default shape: half the active drives of the class, two copies.
    Raid10 {
        shape: Option<(u32, u32)>,
    },
    Ec {
        data_shards: u32,
        parity_shards: u32,
    },
}

/// True when `text` names a log-structured layout, `tiered:` or `log:` (whether or not the rest
/// of it parses).
pub fn is_log_layout(text: &str) -> bool {
    let t = text.trim().to_ascii_lowercase();
    t.starts_with("tiered:") || t.starts_with("log:")
}

fn invalid(message: String) -> CatalogError {
    CatalogError::Invalid(message)
}

/// `K+M` of `<kind>:ec:K+M` (`rest` is what follows `<kind>:`).
fn parse_kind_ec(text: &str, kind: &str, rest: &str) -> Result<(u32, u32), CatalogError> {
    let km = rest
        .strip_prefix("ec:")
        .ok_or_else(|| invalid(format!("`{text}`: a {kind} layout is {kind}:ec:K+M, e.g. {kind}:ec:4+2")))?;
    km.split_once('+')
        .and_then(|(k, m)| Some((k.parse::<u32>().ok()?, m.parse::<u32>().ok()?)))
        .ok_or_else(|| invalid(format!("`{text}`: expected {kind}:ec:K+M, e.g. {kind}:ec:4+2")))
}

fn parse_plain(text: &str, t: &str) -> Result<PlainLayout, CatalogError> {
    let num = |s: &str, what: &str| {
        s.parse::<u32>().map_err(|_| invalid(format!("layout `{text}`: {what} `{s}` is not a number")))
    };
    Ok(if t == "raid0" {
        PlainLayout::Raid0 { width: None }
    } else if let Some(w) = t.strip_prefix("raid0:") {
        PlainLayout::Raid0 { width: Some(num(w, "width")?) }
    } else if t == "raid1" {
        PlainLayout::Raid1 { copies: 2 }
    } else if let Some(n) = t.strip_prefix("raid1:") {
        PlainLayout::Raid1 { copies: num(n, "copies")? }
    } else if t == "raid10" {
        PlainLayout::Raid10 { shape: None }
    } else if let Some(wn) = t.strip_prefix("raid10:") {
        let (w, n) = wn
            .split_once('x')
            .ok_or_else(|| invalid(format!("layout `{text}`: expected raid10:WxN, e.g. raid10:3x2")))?;
        PlainLayout::Raid10 { shape: Some((num(w, "width")?, num(n, "copies")?)) }
    } else if let Some(km) = t.strip_prefix("ec:") {
        let (k, m) = km
            .split_once('+')
            .ok_or_else(|| invalid(format!("layout `{text}`: expected ec:K+M, e.g. ec:4+2")))?;
        PlainLayout::Ec { data_shards: num(k, "K")?, parity_shards: num(m, "M")? }
    } else {
        return Err(invalid(format!(
            "unknown layout `{text}`: use raid0, raid1, raid10, ec:K+M (e.g. ec:4+2), or raid0:W, raid1:N, raid10:WxN"
        )));
    })
}

impl FromStr for LayoutSpec {
    type Err = CatalogError;

    fn from_str(text: &str) -> Result<LayoutSpec, CatalogError> {
        let t = text.trim().to_ascii_lowercase();
        if let Some(rest) = t.strip_prefix("tiered:") {
            let (data_shards, parity_shards) = parse_kind_ec(text, "tiered", rest)?;
            return Ok(LayoutSpec::Log { data_shards, parity_shards, fast_tier: true });
        }
        if let Some(rest) = t.strip_prefix("log:") {
            let (data_shards, parity_shards) = parse_kind_ec(text, "log", rest)?;
            return Ok(LayoutSpec::Log { data_shards, parity_shards, fast_tier: false });
        }
        parse_plain(text, &t).map(LayoutSpec::Plain)
    }
}

impl PlainLayout {
    /// The layout on a class with `active_in_class` active drives (defaults filled in), checked.
    pub fn resolve(self, active_in_class: u32) -> Result<Layout, CatalogError> {
        let layout = match self {
            PlainLayout::Raid0 { width } => Layout::Raid0 { width: width.unwrap_or(active_in_class.max(1)) },
            PlainLayout::Raid1 { copies } => Layout::Raid1 { copies },
            PlainLayout::Raid10 { shape: Some((width, copies)) } => Layout::Raid10 { width, copies },
            PlainLayout::Raid10 { shape: None } => {
                Layout::Raid10 { width: (active_in_class / 2).max(1), copies: 2 }
            }
            PlainLayout::Ec { data_shards, parity_shards } => Layout::Ec { data_shards, parity_shards },
        };
        layout.validate().map_err(CatalogError::Invalid)?;
        Ok(layout)
    }
}

/// Parses a plain layout name against a class with `active_in_class` active drives.
pub fn parse_plain_layout(text: &str, active_in_class: u32) -> Result<Layout, CatalogError> {
    match text.parse::<LayoutSpec>()? {
        LayoutSpec::Plain(p) => p.resolve(active_in_class),
        LayoutSpec::Log { .. } => {
            Err(invalid(format!("`{text}` names a volume kind of its own; a plain layout is needed here")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str, drives: u32) -> Result<Layout, String> {
        parse_plain_layout(text, drives).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_come_from_the_drives_of_the_class() {
        assert_eq!(plain("raid0", 5), Ok(Layout::Raid0 { width: 5 }));
        assert_eq!(plain("RAID10", 6), Ok(Layout::Raid10 { width: 3, copies: 2 }));
        assert_eq!(plain(" raid1 ", 6), Ok(Layout::Raid1 { copies: 2 }));
        assert_eq!(plain("raid10:2x3", 6), Ok(Layout::Raid10 { width: 2, copies: 3 }));
        assert_eq!(plain("ec:4+2", 0), Ok(Layout::Ec { data_shards: 4, parity_shards: 2 }));
    }

    #[test]
    fn mistakes_name_the_layout_and_what_is_wrong() {
        assert_eq!(plain("raid0:x", 3), Err("layout `raid0:x`: width `x` is not a number".into()));
        assert_eq!(
            plain("raid10:3", 3),
            Err("layout `raid10:3`: expected raid10:WxN, e.g. raid10:3x2".into())
        );
        assert_eq!(plain("ec:4", 3), Err("layout `ec:4`: expected ec:K+M, e.g. ec:4+2".into()));
        assert!(plain("raid5", 3).unwrap_err().starts_with("unknown layout `raid5`: use raid0"));
        let tiered = |t: &str| t.parse::<LayoutSpec>().map_err(|e| e.to_string());
        assert_eq!(
            tiered("Tiered:ec:4+2"),
            Ok(LayoutSpec::Log { data_shards: 4, parity_shards: 2, fast_tier: true })
        );
        assert_eq!(
            tiered("tiered:raid1"),
            Err("`tiered:raid1`: a tiered layout is tiered:ec:K+M, e.g. tiered:ec:4+2".into())
        );
        assert_eq!(
            tiered("tiered:ec:4"),
            Err("`tiered:ec:4`: expected tiered:ec:K+M, e.g. tiered:ec:4+2".into())
        );
        assert!(is_log_layout(" TIERED:whatever") && !is_log_layout("ec:4+2"));
        assert_eq!(
            tiered("log:ec:4+2"),
            Ok(LayoutSpec::Log { data_shards: 4, parity_shards: 2, fast_tier: false })
        );
        assert_eq!(
            tiered("log:raid1"),
            Err("`log:raid1`: a log layout is log:ec:K+M, e.g. log:ec:4+2".into())
        );
        assert!(is_log_layout("Log:ec:8+2") && !is_log_layout("ec:4+2"));
    }
}
