#!/usr/bin/env bash
# End-to-end on a real n8n (on demand; not in the default test run — it installs ~2 GB):
#
#   tests/e2e/n8n.sh
#
# Installs n8n 2.8.4 from the npm registry into a cache dir (DEADLETTER_E2E_CACHE, default
# ~/.cache/deadletter-e2e; reused), starts it on loopback with a throwaway user folder, imports
# the templates from packaging/n8n/ (error workflow, "send to deadletter" sub-workflow, the
# example orders workflow, the ingest-token credential), starts deadletter (release build) with
# an ingest token, makes the example workflow fail (its upstream answers 500), checks the
# failure arrived in deadletter with the webhook item as payload, fixes the upstream, replays the
# record to n8n's webhook with `deadletter replay --wait`, and checks n8n ran it (the upstream got
# the order) and deadletter marked it replayed. Everything listens on 127.0.0.1 and is stopped
# at the end.
set -euo pipefail

here="$(cd "$(dirname "$0")/../.." && pwd)"
cache="${DEADLETTER_E2E_CACHE:-$HOME/.cache/deadletter-e2e}"
n8n_version="2.8.4"
n8n_port="${N8N_E2E_PORT:-5688}"
dl_port="${DL_E2E_PORT:-7688}"
up_port=7690   # the example workflow's upstream (packaging/n8n/example-orders-workflow.json)
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT
say() { printf '\n== %s\n' "$*"; }
started=$(date +%s)

install_n8n() {
  local dir="$cache/n8n-$n8n_version"
  if [ -x "$dir/node_modules/.bin/n8n" ]; then
    echo "$dir/node_modules/.bin/n8n"
    return
  fi
  say "installing n8n $n8n_version into $dir (once; about 2 GB)" >&2
  mkdir -p "$dir"
  # xlsx's release points at a tarball outside the registry: pin the registry's 0.18.5.
  cat > "$dir/package.json" <<JSON
{ "name": "deadletter-e2e-n8n", "private": true,
  "dependencies": { "n8n": "$n8n_version" },
  "overrides": { "xlsx": "0.18.5" } }
JSON
  # sqlite3 builds from source when its prebuilt download fails: use the local Node headers.
  (cd "$dir" && npm_config_nodedir=/usr npm install --no-audit --no-fund --loglevel=error >&2)
  echo "$dir/node_modules/.bin/n8n"
}

n8n_bin="$(install_n8n)"

say "building deadletter (release)"
(cd "$here" && cargo build --release --locked --quiet)
dl="$here/target/release/deadletter"

# The example workflow's orders API: answers 500 while $work/upstream-down exists, else 200,
# and logs every body it accepts.
touch "$work/upstream-down"
cat > "$work/upstream.py" <<PY
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        down = os.path.exists("$work/upstream-down")
        if not down:
            with open("$work/upstream.log", "ab") as f:
                f.write(body + b"\n")
        self.send_response(500 if down else 200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"down":true}' if down else b'{"ok":true}')
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", $up_port), H).serve_forever()
PY
python3 "$work/upstream.py" & pids+=($!)

say "starting deadletter on 127.0.0.1:$dl_port (tokens: ingest for n8n, operator for the CLI)"
ingest_token="e2e-ingest-token-0123456789abcdef"
operator_token="e2e-operator-token-0123456789abcd"
sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
cat > "$work/deadletter.toml" <<TOML
[server]
listen = "127.0.0.1:$dl_port"
[storage]
data_dir = "$work/dl"
[delivery]
tick = "200ms"
# Records wait for a person: the replay below is the operator's.
[policy.transient]
initial = "review"
[policy.unknown]
initial = "review"
[policy.rate_limited]
initial = "review"
[n8n]
base_url = "http://127.0.0.1:$n8n_port"
# Written once the throwaway n8n has an owner and an API key (read at each call).
api_key = { file = "$work/n8n-api.key" }
tick = "200ms"
[[auth.tokens]]
name = "n8n"
role = "ingest"
sha256 = "$(sha "$ingest_token")"
[[auth.tokens]]
name = "e2e-operator"
role = "operator"
sha256 = "$(sha "$operator_token")"
TOML
printf '%s' "$operator_token" > "$work/operator.token"
"$dl" --config "$work/deadletter.toml" serve > "$work/deadletter.out" 2> "$work/deadletter.err" & pids+=($!)
for _ in $(seq 100); do curl -fsS "http://127.0.0.1:$dl_port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
dlcli() { "$dl" --config "$work/deadletter.toml" --server "http://127.0.0.1:$dl_port" --token-file "$work/operator.token" --actor e2e "$@"; }

say "importing the templates into a throwaway n8n ($work/n8n)"
export N8N_USER_FOLDER="$work/n8n"
export N8N_PORT="$n8n_port" N8N_LISTEN_ADDRESS=127.0.0.1 N8N_HOST=127.0.0.1
export WEBHOOK_URL="http://127.0.0.1:$n8n_port/"
export N8N_DIAGNOSTICS_ENABLED=false N8N_VERSION_NOTIFICATIONS_ENABLED=false
export N8N_TEMPLATES_ENABLED=false N8N_PERSONALIZATION_ENABLED=false
export N8N_HIRING_BANNER_ENABLED=false EXTERNAL_FRONTEND_HOOKS_URLS=""
export N8N_SECURE_COOKIE=false N8N_ENFORCE_SETTINGS_FILE_PERMISSIONS=false
export N8N_RUNNERS_ENABLED=true DB_SQLITE_POOL_SIZE=2
mkdir -p "$work/templates"
for f in "$here"/packaging/n8n/*.json; do
  sed -e "s#http://127.0.0.1:7680#http://127.0.0.1:$dl_port#g" \
      -e "s#Bearer PUT-YOUR-INGEST-TOKEN-HERE#Bearer $ingest_token#" "$f" > "$work/templates/$(basename "$f")"
done
# n8n's CLI spins when its output pipe closes early: send it to files, never to `head`.
n8n() { "$n8n_bin" "$@" > "$work/n8n-cli.out" 2>&1 || { cat "$work/n8n-cli.out"; return 1; }; }
n8n import:credentials --input="$work/templates/credential-deadletter-ingest.json"
for wf in error-workflow send-to-deadletter example-orders-workflow; do
  n8n import:workflow --input="$work/templates/$wf.json"
done
# A workflow whose HTTP Request has no error output: when the orders API fails, the execution
# fails and only the Error Workflow reports it (without the item: n8n's API has to supply it).
cat > "$work/templates/failing.json" <<JSON
{"id": "dlqE2ePlain00001", "name": "e2e: no error output", "active": false,
 "nodes": [
  {"id": "e2e00000-0000-4000-8000-000000000001", "name": "Webhook", "type": "n8n-nodes-base.webhook",
   "typeVersion": 2, "position": [0, 0], "webhookId": "e2e00000-0000-4000-8000-0000000000bb",
   "parameters": {"httpMethod": "POST", "path": "dlq-e2e-plain", "responseMode": "onReceived", "options": {}}},
  {"id": "e2e00000-0000-4000-8000-000000000002", "name": "Call orders API", "type": "n8n-nodes-base.httpRequest",
   "typeVersion": 4.2, "position": [260, 0],
   "parameters": {"method": "POST", "url": "http://127.0.0.1:$up_port/orders", "sendBody": true,
                  "specifyBody": "json", "jsonBody": "={{ JSON.stringify(\$json.body) }}", "options": {"timeout": 5000}}}],
 "connections": {"Webhook": {"main": [[{"node": "Call orders API", "type": "main", "index": 0}]]}},
 "settings": {"executionOrder": "v1", "errorWorkflow": "dlqErrorWf000001"}}
JSON
n8n import:workflow --input="$work/templates/failing.json"
for id in dlqErrorWf000001 dlqSendToDlq0001 dlqExampleMain01 dlqE2ePlain00001; do
  n8n publish:workflow --id="$id"
done
"$n8n_bin" start > "$work/n8n.out" 2>&1 & pids+=($!)
for _ in $(seq 600); do curl -fsS "http://127.0.0.1:$n8n_port/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fsS "http://127.0.0.1:$n8n_port/healthz" >/dev/null || { tail -50 "$work/n8n.out"; exit 1; }

say "creating n8n's owner and an API key for deadletter"
for _ in $(seq 100); do
  curl -fsS -c "$work/n8n.cookies" -X POST "http://127.0.0.1:$n8n_port/rest/owner/setup" \
    -H 'content-type: application/json' \
    -d '{"email":"owner@example.test","firstName":"E2E","lastName":"Owner","password":"E2e-password-123"}' \
    > "$work/owner.json" 2>/dev/null && break
  sleep 0.3   # "n8n is starting up"
done
curl -fsS -b "$work/n8n.cookies" -X POST "http://127.0.0.1:$n8n_port/rest/api-keys" \
  -H 'content-type: application/json' \
  -d '{"label":"deadletter","expiresAt":null,"scopes":["execution:read","execution:list","execution:retry","workflow:read"]}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["rawApiKey"], end="")' > "$work/n8n-api.key"
[ -s "$work/n8n-api.key" ] || { echo "no API key"; exit 1; }
# The webhook answers once its workflow is active.
for _ in $(seq 100); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$n8n_port/webhook/dlq-example-orders" \
    -H 'content-type: application/json' -d '{"probe":true}') || true
  [ "$code" = 200 ] && break
  sleep 0.3
done
[ "$code" = 200 ] || { echo "the example webhook never answered (last: $code)"; tail -50 "$work/n8n.out"; exit 1; }

say "making the example fail (its orders API answers 500)"
curl -fsS -X POST "http://127.0.0.1:$n8n_port/webhook/dlq-example-orders" \
  -H 'content-type: application/json' -d '{"orderId":"E2E-1","amount":5}' >/dev/null
id=""
for _ in $(seq 150); do
  id=$(dlcli list --partition orders --json | python3 -c '
import json, sys
items = [r for r in json.load(sys.stdin)["items"] if r.get("idempotency_key") == "order-E2E-1"]
print(items[0]["id"] if items else "")')
  [ -n "$id" ] && break
  sleep 0.2
done
[ -n "$id" ] || { echo "no record for order E2E-1 arrived"; tail -30 "$work/n8n.out"; tail -30 "$work/deadletter.err"; exit 1; }
dlcli show "$id" --json > "$work/record.json"
python3 - "$work/record.json" "$n8n_port" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["partition"] == "orders", r
assert r["replay_url"] == f"http://127.0.0.1:{sys.argv[2]}/webhook/dlq-example-orders", r["replay_url"]
assert r["workflow_id"] == "dlqExampleMain01", r
assert r["node_name"] == "Call orders API", r
print("record", r["id"], "status", r["status"], "class", r["failure_class"])
PY
payload=$(curl -fsS -H "Authorization: Bearer $operator_token" "http://127.0.0.1:$dl_port/v1/dead-letters/$id/payload")
echo "$payload" | python3 -c 'import json,sys; p=json.load(sys.stdin); assert p["body"]["orderId"]=="E2E-1", p; print("payload: the webhook item, body", p["body"])'

say "a workflow without an error output fails: only the Error Workflow reports it, n8n's API adds the item"
curl -fsS -X POST "http://127.0.0.1:$n8n_port/webhook/dlq-e2e-plain" \
  -H 'content-type: application/json' -d '{"orderId":"E2E-2","amount":7}' >/dev/null
plain=""
for _ in $(seq 150); do
  plain=$(dlcli list --workflow dlqE2ePlain00001 --json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
print(items[0]["id"] if items else "")')
  [ -n "$plain" ] && break
  sleep 0.2
done
[ -n "$plain" ] || { echo "the Error Workflow never reported the failure"; tail -30 "$work/n8n.out"; exit 1; }
for _ in $(seq 150); do
  state=$(dlcli show "$plain" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["enrichment"]["state"])')
  [ "$state" = enriched ] || [ "$state" = unavailable ] && break
  sleep 0.2
done
dlcli show "$plain" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["source"] == "n8n_error_trigger", r["source"]
assert r["enrichment"]["state"] == "enriched", r["enrichment"]
assert r["payload"]["body"] == {"orderId": "E2E-2", "amount": 7}, r["payload"]
print("record", r["id"], "from the Error Trigger, enriched from the n8n API:", r["enrichment"]["detail"]["trigger_node"], "->", r["enrichment"]["detail"]["failing_node"], "payload body", r["payload"]["body"])'

say "fixing the orders API and replaying records $id and $plain to their webhooks"
rm -f "$work/upstream-down"
dlcli replay "$id" "$plain" --wait
for _ in $(seq 100); do
  grep -q 'E2E-1' "$work/upstream.log" 2>/dev/null && break
  sleep 0.2
done
grep -q 'E2E-1' "$work/upstream.log" || { echo "n8n never called the orders API with the replayed order"; tail -30 "$work/n8n.out"; exit 1; }
for _ in $(seq 100); do
  grep -q 'E2E-2' "$work/upstream.log" 2>/dev/null && break
  sleep 0.2
done
grep -q 'E2E-2' "$work/upstream.log" || { echo "n8n never called the orders API with the replayed E2E-2"; exit 1; }
for r in "$id" "$plain"; do
  status=$(dlcli show "$r" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
  [ "$status" = replayed ] || { echo "record $r is $status, not replayed"; exit 1; }
done

say "passed in $(( $(date +%s) - started )) s: both failures reached deadletter with their items (one through the sub-workflow, one through the Error Workflow and n8n's API), and the replays ran the workflows"
