#!/usr/bin/env bash
# tests/keystone.sh — run a real Keystone for vgpu-bridge's Keystone tests (tests/keystone/).
#
# Idempotent; fast (well under a second) when Keystone already answers. Otherwise it runs
# Debian's Keystone (python3-keystone, installed by tests/services.sh) under uwsgi on
# 127.0.0.1:5000 with its own Postgres database `keystone`, config and state under
# $STATE_DIR/keystone:
#   1. writes keystone.conf (from tests/keystone/keystone.conf.in) and wsgi.py;
#   2. creates the role and database `keystone`, runs `keystone-manage db_sync`,
#      `fernet_setup`, `credential_setup` and `bootstrap` (admin project, admin user
#      whose password is in $STATE_DIR/keystone/admin-password, roles admin, member,
#      reader, region RegionOne, the identity endpoints);
#   3. starts uwsgi and waits until the API answers, then prints where it listens,
#      how to stop it, how long each step took and the memory it uses.
#
# Usage: tests/keystone.sh [start|stop|status]   (default start)
#
# Environment (all optional):
#   VGPU_TEST_STATE_DIR   state dir (default /var/lib/vgpu-bridge-test)
#   VGPU_TEST_LOG_DIR     log dir (default /var/log/vgpu-bridge-test)
#   KEYSTONE_HOST/PORT    listen address (default 127.0.0.1:5000)
#   KEYSTONE_PROCESSES    uwsgi worker processes (default 2)
#   KEYSTONE_THREADS      threads per worker (default 4)
#
# The admin password file is readable by everyone on purpose: this Keystone is a
# throwaway on loopback, and tests running as any user log in with it.
set -euo pipefail

. "$(dirname "$(readlink -f "$0")")/lib.sh"
as_root VGPU_TEST_STATE_DIR,VGPU_TEST_LOG_DIR,KEYSTONE_HOST,KEYSTONE_PORT,KEYSTONE_PROCESSES,KEYSTONE_THREADS "$@"
debian_python_env # uwsgi's embedded interpreter and keystone-manage see the python3-* packages only

HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
STATE_DIR=${VGPU_TEST_STATE_DIR:-/var/lib/vgpu-bridge-test}
KS_DIR=$STATE_DIR/keystone
KS_CONF=$KS_DIR/keystone.conf
KS_WSGI=$KS_DIR/wsgi.py
KS_PID=$KS_DIR/uwsgi.pid
KS_PASSWORD_FILE=$KS_DIR/admin-password
KS_CLOUDS=$KS_DIR/clouds.yaml
KS_LOG=${VGPU_TEST_LOG_DIR:-/var/log/vgpu-bridge-test}/keystone.log
KS_HOST=${KEYSTONE_HOST:-127.0.0.1}
KS_PORT=${KEYSTONE_PORT:-5000}
KS_PROCESSES=${KEYSTONE_PROCESSES:-2}
KS_THREADS=${KEYSTONE_THREADS:-4}
KS_URL=http://$KS_HOST:$KS_PORT/v3/
KS_REGION=RegionOne
KS_DB_URL="postgresql+psycopg2://keystone:keystone@127.0.0.1:5432/keystone"
PG_PORT=5432

# uwsgi's command line; a change restarts a running Keystone (write_files).
UWSGI_ARGS=(
	--plugin python3
	--http-socket "$KS_HOST:$KS_PORT"
	--wsgi-file "$KS_WSGI"
	--master --lazy-apps --die-on-term --no-orphans --thunder-lock --enable-threads
	--processes "$KS_PROCESSES" --threads "$KS_THREADS"
	--listen 128 --buffer-size 65535 --chdir "$KS_DIR"
	--pidfile "$KS_PID" --daemonize "$KS_LOG"
	--log-date --disable-logging
	--add-header 'Connection: close'
)

# ---------------------------------------------------------------- helpers
keystone_ok() { # the version document answers: the app is loaded and serving
	[ "$(curl -s -o /dev/null -w '%{http_code}' -m 3 "$KS_URL" 2>/dev/null)" = 200 ]
}

rss_mib() { # total RSS of uwsgi master + workers, MiB
	local pid=$1 kb=0 p v
	for p in $pid $(ps -o pid= --ppid "$pid" 2>/dev/null); do
		v=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
		kb=$((kb + ${v:-0}))
	done
	echo $((kb / 1024))
}

# ---------------------------------------------------------------- stop
stop_keystone() { stop_uwsgi Keystone "$KS_PID"; }

# ---------------------------------------------------------------- start
write_files() { # returns 0 when the config or the WSGI file changed
	local changed=1 conf
	install -d -m 0755 "$KS_DIR"
	install -d -m 0750 "$KS_DIR/policy.d"
	conf=$(mktemp)
	sed -e "s|@DB_URL@|$KS_DB_URL|" -e "s|@LOG_FILE@|$KS_LOG|" -e "s|@STATE_DIR@|$KS_DIR|" \
		"$HERE/keystone/keystone.conf.in" >"$conf"
	install_if_changed "$conf" "$KS_CONF" 0640 && changed=0
	rm -f "$conf"
	install_if_changed "$HERE/keystone/wsgi.py" "$KS_WSGI" 0644 && changed=0
	conf=$(mktemp)
	printf '%s\n' "${UWSGI_ARGS[@]}" >"$conf"
	install_if_changed "$conf" "$KS_DIR/uwsgi.args" 0644 && changed=0
	rm -f "$conf"
	if [ ! -s "$KS_PASSWORD_FILE" ]; then
		(umask 022 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$KS_PASSWORD_FILE")
	fi
	chmod 0644 "$KS_PASSWORD_FILE"
	return $changed
}

write_clouds_yaml() { # a clouds.yaml for people poking at it by hand
	local tmp
	tmp=$(mktemp)
	cat >"$tmp" <<EOF
# Written by tests/keystone.sh: the test Keystone's admin.
#   OS_CLIENT_CONFIG_FILE=$KS_CLOUDS openstack --os-cloud vgpu-test-admin project list
clouds:
  vgpu-test-admin:
    auth:
      auth_url: $KS_URL
      username: admin
      password: $(cat "$KS_PASSWORD_FILE")
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: $KS_REGION
    identity_api_version: 3
EOF
	install_if_changed "$tmp" "$KS_CLOUDS" 0644 || true
	rm -f "$tmp"
}

ensure_db() {
	if [ "$(psql_admin -c "select 1 from pg_roles where rolname = 'keystone'")" != 1 ]; then
		psql_admin -c "create role keystone login password 'keystone'"
	fi
	if [ "$(psql_admin -c "select 1 from pg_database where datname = 'keystone'")" != 1 ]; then
		psql_admin -c "create database keystone owner keystone"
	fi
}

# keystone-manage, with the oslo.log fix of wsgi.py (without it every run ends
# with "Exception ignored ... _removeHandlerRef" noise from eventlet's green lock).
manage() {
	$PY -c '
import sys
from oslo_log import log
log._fix_eventlet_logging = lambda: None
from keystone.cmd.manage import main
sys.argv[0] = "keystone-manage"
sys.exit(main())' --config-file "$KS_CONF" "$@"
}

setup_keystone() { # schema, keys, admin; every step is idempotent
	local t
	t=$EPOCHREALTIME
	ensure_db
	manage db_sync
	echo "    db_sync: $(elapsed "$t")s"
	t=$EPOCHREALTIME
	# Keys are made once (fernet_setup/credential_setup keep existing ones).
	[ -s "$KS_DIR/fernet-keys/0" ] || manage fernet_setup --keystone-user root --keystone-group root
	[ -s "$KS_DIR/credential-keys/0" ] || manage credential_setup --keystone-user root --keystone-group root
	echo "    keys: $(elapsed "$t")s"
	t=$EPOCHREALTIME
	# bootstrap creates what is missing and resets the admin password to the file's.
	manage bootstrap \
		--bootstrap-password "$(cat "$KS_PASSWORD_FILE")" \
		--bootstrap-username admin --bootstrap-project-name admin \
		--bootstrap-role-name admin --bootstrap-service-name keystone \
		--bootstrap-region-id "$KS_REGION" \
		--bootstrap-admin-url "$KS_URL" --bootstrap-public-url "$KS_URL" --bootstrap-internal-url "$KS_URL"
	echo "    bootstrap: $(elapsed "$t")s"
}

start_keystone() {
	local changed=0 pid="" t
	[ -f /usr/lib/python3/dist-packages/keystone/server/wsgi.py ] || die "no Keystone (install python3-keystone: make services)"
	port_open 127.0.0.1 $PG_PORT || die "PostgreSQL does not answer on 127.0.0.1:$PG_PORT (make services)"
	write_files && changed=1
	write_clouds_yaml
	if pid=$(uwsgi_pid "$KS_PID"); then
		if [ $changed = 0 ]; then
			local i
			for ((i = 0; i < 30; i++)); do # a busy or starting one gets 30 s
				if keystone_ok; then
					echo "    already running (uwsgi pid $pid, RSS $(rss_mib "$pid") MiB)"
					return 0
				fi
				sleep 1
			done
			echo "    uwsgi $pid does not answer: restarting it"
		else
			echo "    config or wsgi.py changed: restarting uwsgi $pid"
		fi
	elif port_open "$KS_HOST" "$KS_PORT"; then
		die "$KS_HOST:$KS_PORT is taken by a process this script did not start: $(ss -ltnpH "sport = :$KS_PORT" 2>/dev/null | awk '{print $NF}')"
	fi

	setup_keystone

	if [ -n "$pid" ]; then
		stop_keystone >/dev/null
		wait_port_closed "$KS_HOST" "$KS_PORT" 10 || die "$KS_HOST:$KS_PORT still answers after stopping uwsgi $pid"
	fi

	install -d -m 0755 "$(dirname "$KS_LOG")"
	if [ -f "$KS_LOG" ] && [ "$(stat -c %s "$KS_LOG")" -gt $((50 * 1024 * 1024)) ]; then
		mv -f "$KS_LOG" "$KS_LOG.1"
	fi
	rm -f "$KS_PID"
	t=$EPOCHREALTIME
	# Same uwsgi flags as Placement's (see services.sh): --lazy-apps so no DB
	# connection crosses fork, --die-on-term, --no-orphans, --thunder-lock; the
	# pidfile path in the command line lets stop recognise the process.
	# --http-socket closes each connection after its answer but says HTTP/1.1
	# without "Connection: close": clients that reuse the connection get
	# "connection reset" on their next POST. The header tells them not to.
	if ! env -i PATH="$PATH" LANG=C.UTF-8 LC_ALL=C.UTF-8 HOME=/root \
		OS_KEYSTONE_CONFIG_DIR="$KS_DIR" \
		/usr/bin/uwsgi-core "${UWSGI_ARGS[@]}" \
		</dev/null >/dev/null 9>&-; then # fd 9 is services.sh's lock: the daemon must not keep it
		tail -n 20 "$KS_LOG" >&2 || true
		die "uwsgi failed to start Keystone (log: $KS_LOG)"
	fi
	local deadline=$((SECONDS + 120)) ok=0
	while [ $SECONDS -lt $deadline ]; do
		if keystone_ok; then
			ok=1
			break
		fi
		[ -s "$KS_PID" ] && ! uwsgi_pid "$KS_PID" >/dev/null && break # uwsgi died
		sleep 0.2
	done
	if [ $ok = 0 ]; then
		echo "--- last lines of $KS_LOG:" >&2
		tail -n 40 "$KS_LOG" >&2 || true
		die "Keystone did not answer on $KS_URL within 120 s"
	fi
	pid=$(uwsgi_pid "$KS_PID")
	echo "    started (uwsgi pid $pid, ${KS_PROCESSES}x${KS_THREADS}) in $(elapsed "$t")s after setup"
	# --lazy-apps: a worker loads the app when it starts; the first answer came
	# from one of them. A token request warms the other code paths too.
	echo "    RSS after start: $(rss_mib "$pid") MiB (master + $KS_PROCESSES workers)"
}

# ---------------------------------------------------------------- main
cmd=${1:-start}
install -d -m 0755 "$STATE_DIR"
# services.sh holds this lock while it runs (and calls us): take it only alone.
if [ "${SERVICES_LOCK_HELD:-0}" != 1 ]; then
	exec 9>"$STATE_DIR/services.lock"
	if ! flock -n 9; then
		echo "==> waiting for another services.sh/keystone.sh run to finish"
		flock -w 900 9 || die "another run holds $STATE_DIR/services.lock"
	fi
fi

case $cmd in
stop)
	stop_keystone
	exit 0
	;;
status)
	if pid=$(uwsgi_pid "$KS_PID") && keystone_ok; then
		echo "Keystone: running at $KS_URL (uwsgi pid $pid, RSS $(rss_mib "$pid") MiB)"
		exit 0
	fi
	echo "Keystone: not answering at $KS_URL"
	exit 1
	;;
start) ;;
*) die "usage: $0 [start|stop|status]" ;;
esac

step_start "Keystone"
start_keystone
step_end keystone

cat <<EOF

Keystone ready:
  Keystone        $KS_URL  (region $KS_REGION; admin/admin, password in $KS_PASSWORD_FILE)
                 clouds.yaml $KS_CLOUDS (cloud vgpu-test-admin)
                 config $KS_CONF, log $KS_LOG, pid $KS_PID
                 stop: $HERE/keystone.sh stop

Timings:
EOF
printf '  %s\n' "${TIMINGS[@]}"
printf '  %-22s %7ss\n' total "$(elapsed "$T_SCRIPT")"
