//! Human sizes: parsing `64G`, `512K`, `1TiB` and printing `1.5 GiB`.

/// Parses a size: a number with an optional binary suffix (`K`, `M`, `G`, `T`, `P`, with or
/// without `iB`/`B`, any case). A plain number is bytes. Fractions are allowed (`1.5G`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("`{text}` is not a size (expected e.g. 64G, 512K, 1TiB)"));
    }
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        other => return Err(format!("`{text}`: unknown size suffix `{other}` (use K, M, G, T or P)")),
    };
    let value: f64 = num.parse().map_err(|_| format!("`{text}` is not a size"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{text}` is out of range"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes.round() as u64)
}

/// Formats bytes with a binary unit, e.g. `1.0 GiB`, `512 KiB`, `100 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512K").unwrap(), 512 << 10);
        assert_eq!(parse_size("64G").unwrap(), 64 << 30);
        assert_eq!(parse_size("1TiB").unwrap(), 1 << 40);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size(" 2 MiB ").unwrap(), 2 << 20);
    }

    #[test]
    fn rejects_garbage_with_a_reason() {
        assert!(parse_size("").unwrap_err().contains("not a size"));
        assert!(parse_size("12Q").unwrap_err().contains("suffix"));
        assert!(parse_size("G").is_err());
        assert!(parse_size("1.2.3G").is_err());
        assert!(parse_size("99999999999P").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(100), "100 B");
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }
}
