//! `deadletter retention`: what each partition holds against its caps, what is about to
//! expire, and what was removed and why — read from the database file (no server needed).

use super::{emit, open_readers, until};
use crate::config::Config;

pub fn run(config: &Config, json: bool) -> anyhow::Result<()> {
    let cfg = &config.retention;
    let now = chrono::Utc::now();
    let policies = crate::retention::policies(cfg);
    let cap = cfg.max_total_bytes.map(|b| b as i64);
    let warn = cfg.warn_before.as_millis() as i64;
    let s = open_readers(config)?.with(|c| {
        crate::store::retention::status(c, &policies, cap, now.timestamp_millis(), warn)
    })?;
    if json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&s)?));
    }
    let size = |b: i64| {
        bytesize::ByteSize::b(b.max(0) as u64)
            .display()
            .si()
            .to_string()
    };
    let mut out = format!(
        "database   {} used{}\ntombstones {}\nremoved    {}\n",
        size(s.used_bytes),
        s.max_total_bytes
            .map(|c| format!(" of {} ({}%)", size(c), s.used_bytes * 100 / c.max(1)))
            .unwrap_or_default(),
        s.tombstones,
        if s.removed.is_empty() {
            "nothing yet".to_string()
        } else {
            s.removed
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
    );
    if s.expiring_soon > 0 {
        out.push_str(&format!(
            "WARNING    {} open record(s) expire within {}: triage or replay them first\n",
            s.expiring_soon,
            humantime::format_duration(cfg.warn_before)
        ));
    }
    out.push_str(&format!(
        "\n{:<20} {:>8} {:>6} {:>10} {:>10} {:>8} {:>9} {:<18}\n",
        "PARTITION", "RECORDS", "OPEN", "BYTES", "CAP", "MAX AGE", "EXPIRING", "NEXT EXPIRY"
    ));
    for p in &s.partitions {
        out.push_str(&format!(
            "{:<20} {:>8} {:>6} {:>10} {:>10} {:>8} {:>9} {:<18}\n",
            super::clip(&p.partition, 20),
            p.records,
            p.open,
            size(p.bytes),
            p.max_bytes.map(size).unwrap_or_else(|| "none".into()),
            humantime::format_duration(std::time::Duration::from_secs(p.max_age_seconds as u64))
                .to_string(),
            p.expiring_soon,
            p.next_expiry.map(|t| until(t, now)).unwrap_or_default(),
        ));
    }
    if s.partitions.is_empty() {
        out.push_str("(no records)\n");
    }
    emit(&out)
}
