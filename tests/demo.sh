#!/usr/bin/env bash
# make demo: run the bridge against the local services (Postgres, RabbitMQ,
# Placement started by `make services`) and show that it is up.
# DEMO_SECONDS bounds how long it runs (default: until Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/vgpu-demo.XXXXXX)
trap 'kill ${pid:-} 2>/dev/null || true; wait ${pid:-} 2>/dev/null || true; rm -rf "$work"' EXIT

db=vgpu_demo
psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$db'" | grep -q 1 \
  || psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE $db"
umask 077
echo "demo-admin-token admin demo" > "$work/tokens"
cat > "$work/bridge.conf" <<CONF
[DEFAULT]
transport_url = rabbit://guest:guest@127.0.0.1:5672/
log_format = text

[database]
connection = postgres://postgres@127.0.0.1:5432/$db?sslmode=disable

[api]
listen = 127.0.0.1:9797
auth_strategy = token
token_file = $work/tokens
CONF

echo "== migrate"
bin/vgpu-bridge --config "$work/bridge.conf" migrate up
echo "== serve (logs below)"
bin/vgpu-bridge --config "$work/bridge.conf" serve &
pid=$!
for _ in $(seq 50); do curl -fsS http://127.0.0.1:9797/healthz >/dev/null 2>&1 && break; sleep 0.2; done
echo "== vgpuctl health"
bin/vgpuctl --url http://127.0.0.1:9797 health
echo "== the bridge is serving on http://127.0.0.1:9797 (OpenAPI at /v1/openapi.json, metrics at /metrics)"
if [ -n "${DEMO_SECONDS:-}" ]; then sleep "$DEMO_SECONDS"; else wait "$pid"; fi
