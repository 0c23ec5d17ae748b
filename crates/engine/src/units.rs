//! Human sizes: parsing `64G`, `512K`, `1TiB` and printing `1.5 GiB`.

/// Parses a size: a number with an optional binary suffix (`K`, `M`, `G`, `T`, `P`, alone or
/// with `iB`, any case), each a power of 1024: `G` and `GiB` both mean 2^30 bytes. A plain number
/// is bytes. Fractions are allowed when they come to whole bytes (`1.5G`, not `0.3K`).
///
/// Decimal suffixes (`KB`, `MB`, `GB`, ...) are refused rather than guessed: to some they mean
/// 10^9, to others 2^30, and a size off by 7 % is not a mistake to make silently.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("`{text}` is not a size (expected e.g. 64G, 512K, 1TiB)"));
    }
    let suffix = suffix.trim().to_ascii_lowercase();
    let shift = match suffix.as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        "p" | "pib" => 50,
        "kb" | "mb" | "gb" | "tb" | "pb" => {
            let unit = suffix[..1].to_ascii_uppercase();
            return Err(format!(
                "`{text}`: decimal units are not accepted ({unit}B could mean 10^n or 2^n bytes); \
                 use {unit} or {unit}iB, which mean powers of 1024"
            ));
        }
        other => return Err(format!("`{text}`: unknown size suffix `{other}` (use K, M, G, T or P)")),
    };
    let out_of_range = || format!("`{text}` is out of range: a size is less than 2^64 bytes (16384P)");
    if !num.contains('.') {
        // Whole numbers exactly (a float would round 2^64 - 1 up to 2^64).
        let n: u64 = num.parse().map_err(|e: std::num::ParseIntError| match e.kind() {
            std::num::IntErrorKind::PosOverflow => out_of_range(),
            _ => format!("`{text}` is not a size"),
        })?;
        return n.checked_mul(1u64 << shift).ok_or_else(out_of_range);
    }
    let value: f64 = num.parse().map_err(|_| format!("`{text}` is not a size"))?;
    let bytes = value * (1u64 << shift) as f64;
    // `u64::MAX as f64` rounds up to 2^64, which does not fit: the bound is exclusive.
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(out_of_range());
    }
    if bytes.fract() != 0.0 {
        return Err(format!("`{text}` is not a whole number of bytes"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// [`parse_size`] for what is allocated in whole 4 KiB blocks (volumes, drives, caches,
/// chunks): a size that is not a whole number of blocks is an error, not rounded.
pub fn parse_block_size(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text)?;
    if bytes == 0 {
        return Err(format!("`{text}`: the size must be at least one 4 KiB block"));
    }
    if bytes % 4096 != 0 {
        let down = bytes / 4096 * 4096;
        let hint = match (down, bytes.checked_next_multiple_of(4096)) {
            (0, Some(up)) => format!("try {up}"),
            (_, Some(up)) => format!("try {down} or {up}"),
            (_, None) => format!("try {down}"),
        };
        return Err(format!("`{text}` is {bytes} bytes, not a whole number of 4 KiB blocks; {hint}"));
    }
    Ok(bytes)
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
        // Whole numbers are exact up to 2^64 - 1; beyond, or as a float near it, out of range.
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert!(parse_size("18446744073709551616").unwrap_err().contains("out of range"));
        assert!(parse_size("16384P").unwrap_err().contains("out of range"));
        assert!(parse_size("16384.0P").unwrap_err().contains("out of range"));
        assert_eq!(parse_size("16383P").unwrap(), 16383 << 50);
        let e = parse_block_size("18446744073709547521").unwrap_err();
        assert!(e.contains("not a whole number of 4 KiB blocks"), "{e}");
    }

    #[test]
    fn refuses_decimal_units_and_partial_bytes() {
        for t in ["1GB", "1gb", "512MB", "4KB", "1TB"] {
            let e = parse_size(t).unwrap_err();
            assert!(e.contains("decimal units are not accepted"), "{t}: {e}");
        }
        assert!(parse_size("0.3K").unwrap_err().contains("whole number of bytes"));
        assert_eq!(parse_size("1G").unwrap(), parse_size("1GiB").unwrap());
    }

    #[test]
    fn block_sizes_are_whole_blocks() {
        assert_eq!(parse_block_size("4K").unwrap(), 4096);
        assert_eq!(parse_block_size("1G").unwrap(), 1 << 30);
        let e = parse_block_size("1000").unwrap_err();
        assert!(e.contains("not a whole number of 4 KiB blocks") && e.contains("try 4096"), "{e}");
        assert!(parse_block_size("5000").unwrap_err().contains("try 4096 or 8192"));
        assert!(parse_block_size("0").unwrap_err().contains("at least one"));
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(100), "100 B");
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }
}
