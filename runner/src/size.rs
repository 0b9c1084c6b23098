//! Sizes on the command line: `512K`, `2G` are binary units (KiB, GiB), as
//! is `2GiB`; `2GB` is decimal. A bare number is bytes.

/// Parses a size into bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("'{text}' is not a size (try 512M, 2G, 2GiB, 2GB)"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(format!("'{text}': unknown unit '{unit}' (use K, M, G, T, KiB..TiB, or KB..TB)")),
    };
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("'{text}' is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// The smallest memory limit taken as a bare number: `--memory-limit 4`
/// is surely 4 GiB meant, not 4 bytes.
const BARE_MEMORY_LIMIT_FLOOR: u64 = 16 << 20;

/// Parses `--memory-limit`: a size, refused below 16 MiB unless given with a unit.
pub fn parse_memory_limit(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text)?;
    let bare = text.trim().bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if bare && bytes < BARE_MEMORY_LIMIT_FLOOR {
        let number = text.trim();
        return Err(format!(
            "'{number}' is {number} bytes, below 16 MiB: no worker runs in that; give a unit ({number}G, {number}M), or {number}B if bytes are meant"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_by_default_decimal_with_b() {
        assert_eq!(parse_size("512K"), Ok(512 * 1024));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5M"), Ok(1_572_864));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("2X").unwrap_err().contains("unknown unit 'X'"));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn a_bare_memory_limit_below_16_mib_is_refused() {
        let err = parse_memory_limit("4").unwrap_err();
        assert!(err.contains("'4' is 4 bytes, below 16 MiB") && err.contains("4G"), "{err}");
        assert_eq!(parse_memory_limit("4G"), Ok(4 << 30));
        assert_eq!(parse_memory_limit("4B"), Ok(4));
        assert_eq!(parse_memory_limit("1M"), Ok(1 << 20));
        assert_eq!(parse_memory_limit("2000000000"), Ok(2_000_000_000));
    }
}
