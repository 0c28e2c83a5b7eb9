//! `deadletter stats`: the queue at a glance, as a compact dashboard (or the API's JSON),
//! read from the database file (no server needed).

use super::{clip, emit, open_readers};
use crate::config::Config;
use crate::store::stats::Stats;

/// ▁▂▃▄▅▆▇█ scaled to the largest value; a blank for zero.
pub fn sparkline(values: &[i64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().max().unwrap_or(0);
    values
        .iter()
        .map(|&v| {
            if v <= 0 || max <= 0 {
                ' '
            } else {
                BARS[(((v * 8 - 1) / max) as usize).min(7)]
            }
        })
        .collect()
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

fn span(secs: f64) -> String {
    super::span(secs.round() as i64)
}

pub fn render(s: &Stats) -> String {
    let mut out = String::new();
    let line = |out: &mut String, k: &str, v: String| out.push_str(&format!("{k:<22}{v}\n"));
    line(
        &mut out,
        "records",
        format!("{} ({} open)", s.total, s.open),
    );
    let statuses: Vec<String> = s
        .by_status
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    line(&mut out, "by status", statuses.join(", "));
    line(
        &mut out,
        "new",
        format!(
            "{} in the last hour, {} in the last day",
            s.new_last_hour, s.new_last_day
        ),
    );
    line(
        &mut out,
        "ingress / hour (24h)",
        format!(
            "|{}| max {}",
            sparkline(&s.ingress_per_hour),
            s.ingress_per_hour.iter().max().copied().unwrap_or(0)
        ),
    );
    line(
        &mut out,
        "open and old",
        format!(
            "{} older than 1h, {} older than 1d, {} past their SLA",
            s.open_older_than_hour, s.open_older_than_day, s.open_past_sla
        ),
    );
    let shares: Vec<String> = s
        .closed_shares
        .iter()
        .map(|(k, v)| format!("{k} {}", pct(*v)))
        .collect();
    line(&mut out, "closed", shares.join(", "));
    line(
        &mut out,
        "time to resolution",
        match &s.time_to_resolution {
            Some(r) => format!(
                "mean {}, p90 {} ({} closed in 7 days)",
                span(r.mean_seconds),
                span(r.p90_seconds),
                r.records
            ),
            None => "nothing closed in the last 7 days".into(),
        },
    );
    line(
        &mut out,
        "48h SLO",
        match &s.slo_48h {
            Some(slo) => format!(
                "{} ({} of {} seen 2–7 days ago closed within 48h)",
                pct(slo.ratio),
                slo.met,
                slo.eligible
            ),
            None => "no records seen 2–7 days ago".into(),
        },
    );
    if s.partitions.iter().any(|p| p.money_impacting) {
        line(
            &mut out,
            "business-loss risk",
            format!(
                "{} open in money-impacting partitions",
                s.business_loss_risk
            ),
        );
    }
    if !s.top_fingerprints.is_empty() {
        out.push_str("\ntop failures (open)\n");
        for f in &s.top_fingerprints {
            out.push_str(&format!(
                "  {:>6}  {}  {:<12} {}\n",
                f.open,
                f.fingerprint,
                f.failure_class,
                clip(
                    &format!(
                        "{}{}",
                        f.workflow_name
                            .as_deref()
                            .map(|w| format!("{w}: "))
                            .unwrap_or_default(),
                        f.sample_message.as_deref().unwrap_or("")
                    ),
                    60
                )
            ));
        }
    }
    if !s.top_workflows.is_empty() {
        out.push_str("\ntop workflows (open)\n");
        for w in &s.top_workflows {
            out.push_str(&format!(
                "  {:>6}  {}\n",
                w.open,
                clip(
                    w.workflow_name
                        .as_deref()
                        .or(w.workflow_id.as_deref())
                        .unwrap_or("(no workflow)"),
                    60
                )
            ));
        }
    }
    if !s.partitions.is_empty() {
        out.push_str("\npartitions\n");
        for p in &s.partitions {
            out.push_str(&format!(
                "  {:<24} {:>6} open {:>6} closed{}\n",
                clip(&p.partition, 24),
                p.open,
                p.closed,
                if p.money_impacting { "  $" } else { "" }
            ));
        }
    }
    out
}

pub fn run(config: &Config, json: bool) -> anyhow::Result<()> {
    let now = chrono::Utc::now().timestamp_millis();
    let s = open_readers(config)?.stats(now, &config.metrics.money_partitions)?;
    if json {
        return emit(&format!("{}\n", serde_json::to_string_pretty(&s)?));
    }
    emit(&render(&s))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sparkline_scales_to_the_largest_and_leaves_zero_blank() {
        assert_eq!(super::sparkline(&[0, 1, 4, 8]), " ▁▄█");
        assert_eq!(super::sparkline(&[0, 0]), "  ");
    }
}
