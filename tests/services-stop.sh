#!/usr/bin/env bash
# tests/services-stop.sh — stop the Placement API and Keystone that tests/services.sh started.
#
# Leaves PostgreSQL and RabbitMQ running (other work shares them); stop those
# with `pg_ctlcluster 15 main stop` and `rabbitmqctl stop` if you must.
# Only the uwsgi master named in our pidfile is signalled, and only when its
# command line carries that pidfile path.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then
		exec sudo --preserve-env=VGPU_TEST_STATE_DIR bash "$(readlink -f "$0")" "$@"
	fi
	echo "services-stop.sh: must run as root (and sudo is not installed)" >&2
	exit 1
fi

STATE_DIR=${VGPU_TEST_STATE_DIR:-/var/lib/vgpu-bridge-test}
PL_PID=$STATE_DIR/placement/uwsgi.pid

# services.sh holds this lock while it starts Placement; it sets
# SERVICES_LOCK_HELD=1 when it calls this script itself.
if [ "${SERVICES_LOCK_HELD:-0}" != 1 ] && [ -d "$STATE_DIR" ]; then
	exec 9>"$STATE_DIR/services.lock"
	flock -w 120 9 || { echo "services-stop.sh: another services.sh run holds $STATE_DIR/services.lock" >&2; exit 1; }
fi

SERVICES_LOCK_HELD=1 bash "$(dirname "$(readlink -f "$0")")/keystone.sh" stop || true

if [ ! -s "$PL_PID" ]; then
	echo "Placement: not running (no $PL_PID)"
	exit 0
fi
pid=$(tr -dc 0-9 <"$PL_PID")
if [ -z "$pid" ] || [ ! -r "/proc/$pid/cmdline" ] ||
	! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$PL_PID"; then
	echo "Placement: not running (stale $PL_PID)"
	rm -f "$PL_PID"
	exit 0
fi

kill -TERM "$pid"
for ((i = 0; i < 100; i++)); do
	[ -d "/proc/$pid" ] || break
	sleep 0.1
done
if [ -d "/proc/$pid" ]; then
	echo "Placement: uwsgi $pid still alive after 10 s, sending SIGKILL to its group"
	if [ "$(ps -o pgid= -p "$pid" | tr -d ' ')" = "$pid" ]; then
		kill -KILL -- "-$pid" # uwsgi --daemonize made the master a group leader: take its workers too
	else
		kill -KILL "$pid"
	fi
fi
rm -f "$PL_PID"
echo "Placement: stopped (uwsgi pid $pid)"
