#!/usr/bin/env bash
# tests/services-stop.sh — stop the Placement API and Keystone that tests/services.sh started.
#
# Leaves PostgreSQL and RabbitMQ running (other work shares them); stop those
# with `pg_ctlcluster 15 main stop` and `rabbitmqctl stop` if you must.
# Only the uwsgi master named in our pidfile is signalled, and only when its
# command line carries that pidfile path.
set -euo pipefail

. "$(dirname "$(readlink -f "$0")")/lib.sh"
as_root VGPU_TEST_STATE_DIR "$@"

STATE_DIR=${VGPU_TEST_STATE_DIR:-/var/lib/vgpu-bridge-test}
PL_PID=$STATE_DIR/placement/uwsgi.pid

# services.sh holds this lock while it starts Placement; it sets
# SERVICES_LOCK_HELD=1 when it calls this script itself.
if [ "${SERVICES_LOCK_HELD:-0}" != 1 ] && [ -d "$STATE_DIR" ]; then
	exec 9>"$STATE_DIR/services.lock"
	flock -w 120 9 || { echo "services-stop.sh: another services.sh run holds $STATE_DIR/services.lock" >&2; exit 1; }
fi

SERVICES_LOCK_HELD=1 bash "$(dirname "$(readlink -f "$0")")/keystone.sh" stop || true

stop_uwsgi Placement "$PL_PID"
