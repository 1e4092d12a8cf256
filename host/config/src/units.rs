//! Durations (`"500ms"`, `"30s"`, `"5m"`, `"1h"`) and sizes (`"512B"`,
//! `"64KiB"`, `"16MiB"`, `"1GiB"`) as written in `config.toml`.

use std::time::Duration;

/// What a duration may look like, for error messages.
pub const DURATION_FORMS: &str = "a whole number followed by ms, s, m or h, such as \"500ms\" or \"30s\"";
/// What a size may look like, for error messages.
pub const SIZE_FORMS: &str = "a whole number followed by B, KiB, MiB or GiB, such as \"64MiB\"";

/// Parses a duration.
pub fn duration(text: &str) -> Option<Duration> {
    let (number, unit) = split(text)?;
    match unit {
        "ms" => Some(Duration::from_millis(number)),
        "s" => Some(Duration::from_secs(number)),
        "m" => number.checked_mul(60).map(Duration::from_secs),
        "h" => number.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
}

/// Parses a size in bytes.
pub fn size(text: &str) -> Option<u64> {
    let (number, unit) = split(text)?;
    let factor: u64 = match unit {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    number.checked_mul(factor)
}

/// `duration` written as config.toml takes it, in its largest exact unit.
pub fn show_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    match ms {
        0 => "0ms".into(),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// `bytes` written as config.toml takes it, in its largest exact unit.
pub fn show_size(bytes: u64) -> String {
    match bytes {
        0 => "0B".into(),
        _ if bytes.is_multiple_of(1 << 30) => format!("{}GiB", bytes >> 30),
        _ if bytes.is_multiple_of(1 << 20) => format!("{}MiB", bytes >> 20),
        _ if bytes.is_multiple_of(1 << 10) => format!("{}KiB", bytes >> 10),
        _ => format!("{bytes}B"),
    }
}

fn split(text: &str) -> Option<(u64, &str)> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    if digits == 0 {
        return None;
    }
    Some((text[..digits].parse().ok()?, text[digits..].trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_parse_and_junk_does_not() {
        assert_eq!(duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(duration("1h"), Some(Duration::from_secs(3600)));
        for bad in ["", "30", "s", "1.5s", "-1s", "10 days", "10sec"] {
            assert_eq!(duration(bad), None, "{bad:?}");
        }
        assert_eq!(size("64MiB"), Some(64 << 20));
        assert_eq!(size("512B"), Some(512));
        for bad in ["64MB", "64", "MiB", "1.5GiB"] {
            assert_eq!(size(bad), None, "{bad:?}");
        }
    }
}
