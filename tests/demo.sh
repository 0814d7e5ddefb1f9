#!/usr/bin/env bash
# make demo: the product's main job against the local services (Postgres,
# RabbitMQ, Placement started by `make services`): the bridge and two
# simulated compute hosts, real-shaped Nova notifications and signed
# webhooks, a timeline of what the bridge decided and did, then a summary.
# The program is tests/demo/main.go; it removes everything it creates, also
# on failure or Ctrl-C, and bounds itself (about 30 s; at most 150 s plus
# cleanup). DEMO_KEEP=1 keeps its temporary directory (configuration, logs).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x bin/vgpu-bridge ] && [ -x bin/vgpu-agent ] && [ -x bin/vgpuctl ] || make build
go build -o bin/vgpu-demo ./tests/demo
exec bin/vgpu-demo "$@"
