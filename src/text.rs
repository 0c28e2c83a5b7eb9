//! Small text formatting shared by the CLI's output and the web page: durations ("3m ago"),
//! one-line clipping, query-value encoding. No I/O.

/// "45s", "3m", "2h", "5d".
pub fn span(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// "3m ago", "2h ago", "5d ago".
pub fn ago(t: chrono::DateTime<chrono::Utc>, now: chrono::DateTime<chrono::Utc>) -> String {
    format!("{} ago", span((now - t).num_seconds()))
}

/// "in 3h", or "overdue by 2d".
pub fn until(t: chrono::DateTime<chrono::Utc>, now: chrono::DateTime<chrono::Utc>) -> String {
    let s = (t - now).num_seconds();
    if s >= 0 {
        format!("in {}", span(s))
    } else {
        format!("overdue by {}", span(-s))
    }
}

/// Percent-encode a query value (RFC 3986 unreserved characters stay).
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Cut to `max` characters, with an ellipsis.
pub fn clip(s: &str, max: usize) -> String {
    let one_line = s.replace(['\n', '\r', '\t'], " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut out: String = one_line.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}
