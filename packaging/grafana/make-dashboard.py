#!/usr/bin/env python3
"""Writes deadletter.json, the Grafana dashboard, from the panel list below (the JSON is
committed; rerun this after changing a panel: python3 packaging/grafana/make-dashboard.py)."""
import json
import os

DS = {"type": "prometheus", "uid": "${datasource}"}

# (title, unit, kind, [(expr, legend)], width)
PANELS = [
    ("Open records by status", "short", "timeseries",
     [('sum by (status) (dlq_depth{status!~"replayed|resolved|skipped"})', "{{status}}")], 12),
    ("Ingress by partition (per minute)", "short", "timeseries",
     [("sum by (partition) (rate(dlq_ingress_total[5m])) * 60", "{{partition}}")], 12),
    ("Oldest open record by partition", "s", "timeseries",
     [("dlq_oldest_open_age_seconds", "{{partition}}")], 12),
    ("Time to replay or disposition (p50, p90)", "s", "timeseries",
     [("histogram_quantile(0.5, sum by (le) (rate(dlq_age_seconds_bucket[1h])))", "p50"),
      ("histogram_quantile(0.9, sum by (le) (rate(dlq_age_seconds_bucket[1h])))", "p90")], 12),
    ("Replays per minute by target", "short", "timeseries",
     [("sum by (target) (rate(dlq_replay_success_total[5m])) * 60", "{{target}} ok"),
      ("sum by (target, reason) (rate(dlq_replay_failure_total[5m])) * 60", "{{target}} {{reason}}")], 12),
    ("Replay success ratio (1h)", "percentunit", "timeseries",
     [("sum by (target) (increase(dlq_replay_success_total[1h])) / (sum by (target) (increase(dlq_replay_success_total[1h])) + sum by (target) (increase(dlq_replay_failure_total[1h])))", "{{target}}")], 12),
    ("Waiting for a retry / more than 3 attempts", "short", "timeseries",
     [("dlq_retry_scheduled", "retry scheduled"), ("dlq_records_over_3_attempts", "over 3 attempts")], 8),
    ("Breaker state (0 closed, 1 half-open, 2 open)", "short", "timeseries",
     [("dlq_breaker_state", "{{target}}"), ("increase(dlq_drain_paused_total[5m])", "{{target}} paused / 5m")], 8),
    ("Deduplicated and credential incidents (per hour)", "short", "timeseries",
     [("rate(dlq_deduplicated_total[1h]) * 3600", "deduplicated"),
      ("increase(dlq_credential_incidents_total[1h])", "credential incidents")], 8),
    ("Removed by retention (per day)", "short", "timeseries",
     [("sum by (reason) (increase(dlq_expired_total[1d]))", "{{reason}}")], 8),
    ("Writer: batch size and commit p99", "short", "timeseries",
     [("rate(dlq_writer_batch_size_sum[5m]) / rate(dlq_writer_batch_size_count[5m])", "mean batch"),
      ("histogram_quantile(0.99, sum by (le) (rate(dlq_writer_commit_seconds_bucket[5m]))) * 1000", "commit p99 ms")], 8),
    ("HTTP requests by route (per second)", "reqps", "timeseries",
     [("sum by (route, status) (rate(dlq_http_requests_total[5m]))", "{{route}} {{status}}")], 8),
    ("HTTP p99 latency by route", "s", "timeseries",
     [("histogram_quantile(0.99, sum by (le, route) (rate(dlq_http_request_duration_seconds_bucket[5m])))", "{{route}}")], 12),
    ("Alerts sent, failed, held back (per hour)", "short", "timeseries",
     [("sum by (rule) (increase(dlq_alerts_sent_total[1h]))", "{{rule}} sent"),
      ("sum by (rule) (increase(dlq_alerts_failed_total[1h]))", "{{rule}} failed"),
      ("sum by (rule) (increase(dlq_alerts_suppressed_total[1h]))", "{{rule}} held back")], 12),
]


def panel(i, x, y, title, unit, kind, targets, width):
    return {
        "id": i + 1,
        "type": kind,
        "title": title,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": width, "h": 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + j), "datasource": DS, "expr": expr, "legendFormat": legend}
            for j, (expr, legend) in enumerate(targets)
        ],
    }


def main():
    panels, x, y = [], 0, 0
    for i, (title, unit, kind, targets, width) in enumerate(PANELS):
        if x + width > 24:
            x, y = 0, y + 8
        panels.append(panel(i, x, y, title, unit, kind, targets, width))
        x += width
    dash = {
        "title": "deadletter",
        "uid": "deadletter",
        "description": "The n8n dead-letter queue: depth, ingress, age, replays, retention, writer, HTTP, alerts.",
        "tags": ["deadletter", "n8n"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-24h", "to": "now"},
        "templating": {"list": [{
            "name": "datasource", "label": "Prometheus", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0,
        }]},
        "panels": panels,
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deadletter.json")
    with open(out, "w") as f:
        json.dump(dash, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
