#!/usr/bin/env bash
# tests/services.sh — make this machine ready for vgpu-bridge's tests (`make services`).
#
# Idempotent; fast (under a second on an idle machine) when everything already runs. On a fresh
# Debian 12 machine it:
#   1. installs with apt the packages that are missing (apt-get update only then),
#      with a temporary /usr/sbin/policy-rc.d so packaged daemons do not start;
#   2. starts PostgreSQL and RabbitMQ when their ports do not answer; without
#      systemd RabbitMQ gets an open-file limit of up to 65536 (as Debian's
#      unit sets), and one already running with less than 4096 is restarted;
#   3. runs Debian's Placement API (noauth2) under uwsgi on 127.0.0.1:8778 with
#      its own Postgres database, config and state under $STATE_DIR;
#   4. prints where each service listens, how to stop it, and how long each step took.
#
# Environment (all optional):
#   VGPU_TEST_STATE_DIR   state dir (default /var/lib/vgpu-bridge-test)
#   VGPU_TEST_LOG_DIR     log dir (default /var/log/vgpu-bridge-test)
#   PLACEMENT_HOST/PORT   listen address of Placement (default 127.0.0.1:8778)
#   PLACEMENT_PROCESSES   uwsgi worker processes (default 2)
#   PLACEMENT_THREADS     threads per worker (default 4)
#   SERVICES_NO_APT=1     skip the package step
set -euo pipefail

. "$(dirname "$(readlink -f "$0")")/lib.sh"
as_root VGPU_TEST_STATE_DIR,VGPU_TEST_LOG_DIR,PLACEMENT_HOST,PLACEMENT_PORT,PLACEMENT_PROCESSES,PLACEMENT_THREADS,SERVICES_NO_APT "$@"
debian_python_env

HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
STATE_DIR=${VGPU_TEST_STATE_DIR:-/var/lib/vgpu-bridge-test}
PL_DIR=$STATE_DIR/placement
PL_CONF=$PL_DIR/placement.conf
PL_WSGI=$PL_DIR/wsgi.py
PL_PID=$PL_DIR/uwsgi.pid
PL_LOG=${VGPU_TEST_LOG_DIR:-/var/log/vgpu-bridge-test}/placement.log
PL_HOST=${PLACEMENT_HOST:-127.0.0.1}
PL_PORT=${PLACEMENT_PORT:-8778}
PL_PROCESSES=${PLACEMENT_PROCESSES:-2}
PL_THREADS=${PLACEMENT_THREADS:-4}
PL_DB_URL="postgresql+psycopg2://placement:placement@127.0.0.1:5432/placement"
PG_PORT=5432
PG_MIN_CONNECTIONS=${PG_MIN_CONNECTIONS:-400}
RABBIT_PORT=5672
RABBIT_NOFILE=65536                          # the open-file limit of a RabbitMQ started here
RABBIT_MIN_NOFILE=${RABBIT_MIN_NOFILE:-4096} # below it, a running one (no systemd) is restarted

PACKAGES=(
	postgresql
	rabbitmq-server
	placement-api python3-placement python3-psycopg2 uwsgi-core uwsgi-plugin-python3
	python3-oslo.messaging
	libvirt-dev pkg-config libvirt-daemon
	python3-nova python3-wsgi-intercept
	python3-keystone
	prometheus-alertmanager prometheus
	python3-sphinx
	lintian dpkg-dev fakeroot
	chromium
	curl
	ansible-core
)

have_systemd() { [ -d /run/systemd/system ]; }

# ---------------------------------------------------------------- 1. packages
install_packages() {
	local missing
	mapfile -t missing < <(missing_packages "${PACKAGES[@]}")
	if [ ${#missing[@]} -eq 0 ]; then
		echo "    all ${#PACKAGES[@]} packages installed"
		return 0
	fi
	echo "    missing: ${missing[*]}"
	# The packaged daemons must not start (on systemd machines the packaged
	# placement-api would take port 8778 with keystone auth).
	apt_install_quiet "${missing[@]}"
	# Systemd machines: the packaged unit is enabled and would take 8778 at boot.
	if have_systemd && systemctl is-enabled --quiet placement-api 2>/dev/null; then
		systemctl disable --now placement-api || true
	fi
	# Likewise the packaged Alertmanager (port 9093; tests run their own) and
	# Prometheus (installed for promtool, which checks the shipped rules).
	local unit
	for unit in prometheus-alertmanager prometheus; do
		if have_systemd && systemctl is-enabled --quiet "$unit" 2>/dev/null; then
			systemctl disable --now "$unit" || true
		fi
	done
}

# ---------------------------------------------------------------- 2. postgres, rabbitmq
pg_version() { # the newest major version with a config dir
	local d v=""
	for d in /etc/postgresql/[0-9]*; do
		[ -d "$d" ] || continue
		d=${d##*/}
		[[ $d =~ ^[0-9]+$ ]] && { [ -z "$v" ] || [ "$d" -gt "$v" ]; } && v=$d
	done
	[ -n "$v" ] || die "no PostgreSQL cluster under /etc/postgresql (is postgresql installed?)"
	echo "$v"
}

start_postgres() {
	PG_VER=$(pg_version) || exit 1
	if port_open 127.0.0.1 $PG_PORT; then
		echo "    already listening on 127.0.0.1:$PG_PORT"
	else
		[ -d "/etc/postgresql/$PG_VER/main" ] || pg_createcluster "$PG_VER" main
		if have_systemd; then
			pg_ctlcluster "$PG_VER" main start 9>&- # fd 9 is our lock: the daemon must not keep it
		else
			pg_ctlcluster --skip-systemctl-redirect "$PG_VER" main start 9>&- # fd 9 is our lock: the daemon must not keep it
		fi
		wait_port 127.0.0.1 $PG_PORT 30 || die "PostgreSQL did not open 127.0.0.1:$PG_PORT; see /var/log/postgresql/postgresql-$PG_VER-main.log"
		echo "    started cluster $PG_VER/main"
	fi
	# Tests connect as postgres over TCP without a password. A
	# fresh Debian cluster asks for one: add trust for loopback, once.
	if grep -qE '^host[[:space:]]+all[[:space:]]+(all|postgres)[[:space:]]+127\.0\.0\.1/32[[:space:]]+trust' \
		"/etc/postgresql/$PG_VER/main/pg_hba.conf" 2>/dev/null; then
		: # the usual case, without starting psql
	elif ! PGCONNECT_TIMEOUT=3 psql -X -w -h 127.0.0.1 -p $PG_PORT -U postgres -Atc 'select 1' >/dev/null 2>&1; then
		local hba
		hba=$(psql_admin -c 'show hba_file')
		echo "    adding loopback trust to $hba (test machine)"
		sed -i "1i # vgpu-bridge tests/services.sh: loopback trust for tests\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust" "$hba"
		psql_admin -c 'select pg_reload_conf()' >/dev/null
		sleep 0.5
	fi
	# make test runs packages in parallel, and the real-Nova and Keystone
	# tests bring their own connection pools: Debian's default of 100
	# connections runs out ("too many clients"). Raise it once (a restart;
	# before Placement and Keystone start, whose pools reconnect anyway).
	local maxc
	maxc=$(psql_admin -c 'show max_connections')
	if [ "${maxc:-0}" -lt "$PG_MIN_CONNECTIONS" ]; then
		echo "    raising max_connections $maxc -> $PG_MIN_CONNECTIONS (restart)"
		psql_admin -c "alter system set max_connections = $PG_MIN_CONNECTIONS" >/dev/null
		if have_systemd; then
			pg_ctlcluster "$PG_VER" main restart 9>&- # fd 9 is our lock: the daemon must not keep it
		else
			pg_ctlcluster --skip-systemctl-redirect "$PG_VER" main restart 9>&- # fd 9 is our lock: the daemon must not keep it
		fi
		wait_port 127.0.0.1 $PG_PORT 30 || die "PostgreSQL did not come back on 127.0.0.1:$PG_PORT; see /var/log/postgresql/postgresql-$PG_VER-main.log"
	fi
}

# RabbitMQ's sockets come out of its open-file limit (about 90% of what is
# left after 100 files). Started without systemd, Debian's broker gets 1024
# (about 830 connections; see run_rabbitmq_detached), too few for
# tests/bench/e2e's fleet of 1,000 agents, each with its own connection.
# Debian's systemd unit sets LimitNOFILE=65536: do the same.
rabbit_pid() { # the running broker's Erlang VM, when this machine's /proc shows it
	pgrep -o -f '^[^ ]*beam\.smp .* -s rabbit boot' 2>/dev/null
}

rabbit_nofile() { # pid -> the soft open-file limit of that process
	local n
	n=$(awk '/^Max open files/ {print $4}' "/proc/$1/limits" 2>/dev/null) && [ -n "$n" ] && echo "$n"
}

rabbit_nofile_target() { # the soft limit to start RabbitMQ with: RABBIT_NOFILE, or the hard limit when lower and not raisable
	local hard
	hard=$(ulimit -Hn)
	if [ "$hard" = unlimited ] || [ "$hard" -ge "$RABBIT_NOFILE" ] || (ulimit -Hn "$RABBIT_NOFILE") 2>/dev/null; then
		echo "$RABBIT_NOFILE"
	else
		echo "$hard"
	fi
}

run_rabbitmq_detached() { # no systemd: rabbitmq-server -detached with the raised limit (only in its subshell)
	local target home
	target=$(rabbit_nofile_target)
	(
		hard=$(ulimit -Hn)
		if [ "$hard" != unlimited ] && [ "$hard" -lt "$target" ]; then
			ulimit -Hn "$target"
		fi
		ulimit -Sn "$target"
		# As root, Debian's /usr/sbin/rabbitmq-server runs itself again through
		# `su rabbitmq`, whose PAM session (pam_limits) sets the soft limit back to
		# 1024. Become rabbitmq without PAM instead, as the systemd unit (User=)
		# and the init script (start-stop-daemon --chuid) do.
		if home=$(getent passwd rabbitmq | cut -d: -f6) && [ -n "$home" ]; then
			exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups \
				env HOME="$home" USER=rabbitmq LOGNAME=rabbitmq SHELL=/bin/sh \
				rabbitmq-server -detached 9>&- # fd 9 is our lock: the daemon must not keep it
		fi
		exec rabbitmq-server -detached 9>&- # fd 9 is our lock: the daemon must not keep it
	)
}

await_rabbitmq() { # what a start waits for
	# await_startup fails while the node is not yet reachable: retry.
	local i
	for ((i = 0; i < 60; i++)); do
		rabbitmqctl -q await_startup --timeout 60 >/dev/null 2>&1 && break
		sleep 1
	done
	wait_port 127.0.0.1 $RABBIT_PORT 10 || die "RabbitMQ did not open 127.0.0.1:$RABBIT_PORT; see /var/log/rabbitmq/"
}

start_rabbitmq() {
	if port_open 127.0.0.1 $RABBIT_PORT; then
		local pid nofile="" target i
		if pid=$(rabbit_pid) && nofile=$(rabbit_nofile "$pid") && [ "$nofile" != unlimited ] &&
			[ "$nofile" -lt "$RABBIT_MIN_NOFILE" ]; then
			target=$(rabbit_nofile_target)
			if have_systemd; then
				echo "    warning: its open-file limit is $nofile (< $RABBIT_MIN_NOFILE, too few for the e2e bench's fleet): set LimitNOFILE=65536 in its systemd unit and restart it"
			elif [ "$target" -le "$nofile" ]; then
				echo "    warning: its open-file limit is $nofile (< $RABBIT_MIN_NOFILE) and the hard limit here is no higher"
			else
				# A restart: clients reconnect; durable queues and their messages survive.
				echo "    raising its open-file limit $nofile -> $target (restart)"
				rabbitmqctl -q stop >/dev/null 2>&1 || true
				for ((i = 0; i < 300; i++)); do
					[ -d "/proc/$pid" ] || break
					sleep 0.1
				done
				[ ! -d "/proc/$pid" ] || die "RabbitMQ (pid $pid) did not stop within 30 s after rabbitmqctl stop"
				wait_port_closed 127.0.0.1 $RABBIT_PORT 10 || die "127.0.0.1:$RABBIT_PORT still answers after stopping RabbitMQ"
				run_rabbitmq_detached
				await_rabbitmq
				pid=$(rabbit_pid) || die "RabbitMQ answers on 127.0.0.1:$RABBIT_PORT, but no beam.smp runs it"
				echo "    restarted (open files $(rabbit_nofile "$pid"))"
				return 0
			fi
		fi
		echo "    already listening on 127.0.0.1:$RABBIT_PORT${nofile:+ (open files $nofile)}"
		return 0
	fi
	if have_systemd; then
		systemctl start rabbitmq-server
	else
		run_rabbitmq_detached
	fi
	await_rabbitmq
	local pid nofile=""
	if pid=$(rabbit_pid); then
		nofile=$(rabbit_nofile "$pid") || true
	fi
	echo "    started${nofile:+ (open files $nofile)}"
}

# ---------------------------------------------------------------- 3. placement
placement_ok() { # answers as a noauth2 Placement (a keystone one gives 401)
	# A filtered list: auth and database, but cheap however many providers exist.
	[ "$(curl -s -o /dev/null -w '%{http_code}' -m 3 -H 'X-Auth-Token: admin' \
		"http://$PL_HOST:$PL_PORT/resource_providers?name=vgpu-bridge-services-probe" 2>/dev/null)" = 200 ]
}

write_placement_files() { # returns 0 when the config or the WSGI file changed
	local changed=1 conf
	install -d -m 0750 "$PL_DIR" "$PL_DIR/policy.d"
	conf=$(mktemp)
	sed -e "s|@DB_URL@|$PL_DB_URL|" -e "s|@LOG_FILE@|$PL_LOG|" "$HERE/placement-service/placement.conf.in" >"$conf"
	install_if_changed "$conf" "$PL_CONF" 0640 && changed=0
	rm -f "$conf"
	install_if_changed "$HERE/placement-service/wsgi.py" "$PL_WSGI" 0644 && changed=0
	return $changed
}

ensure_placement_db() {
	if [ "$(psql_admin -c "select 1 from pg_roles where rolname = 'placement'")" != 1 ]; then
		psql_admin -c "create role placement login password 'placement'"
	fi
	if [ "$(psql_admin -c "select 1 from pg_database where datname = 'placement'")" != 1 ]; then
		psql_admin -c "create database placement owner placement"
	fi
}

start_placement() {
	local changed=0 pid="" t
	[ -f /usr/bin/placement-api ] || die "no /usr/bin/placement-api (is placement-api installed?)"
	write_placement_files && changed=1
	if pid=$(uwsgi_pid "$PL_PID"); then
		if [ $changed = 0 ]; then
			# Others' tests may be using it: give a busy or starting one 30 s.
			local i
			for ((i = 0; i < 30; i++)); do
				if placement_ok; then
					echo "    already running (uwsgi pid $pid)"
					return 0
				fi
				sleep 1
			done
			echo "    uwsgi $pid does not answer: restarting it"
		else
			echo "    config or wsgi.py changed: restarting uwsgi $pid"
		fi
	elif port_open "$PL_HOST" "$PL_PORT"; then
		local hint=""
		have_systemd && hint=" (packaged service? try: systemctl disable --now placement-api)"
		die "$PL_HOST:$PL_PORT is taken by a process this script did not start$hint: $(ss -ltnpH "sport = :$PL_PORT" 2>/dev/null | awk '{print $NF}')"
	fi

	# Schema first (safe while an old instance still serves: shorter outage).
	t=$EPOCHREALTIME
	ensure_placement_db
	$PY /usr/bin/placement-manage --config-file "$PL_CONF" db sync
	echo "    db sync: $(elapsed "$t")s"

	if [ -n "$pid" ]; then
		SERVICES_LOCK_HELD=1 "$HERE/services-stop.sh" >/dev/null
		wait_port_closed "$PL_HOST" "$PL_PORT" 10 || die "$PL_HOST:$PL_PORT still answers after stopping uwsgi $pid"
	fi

	install -d -m 0755 "$(dirname "$PL_LOG")"
	# Every request is logged: keep one old log of at most 50 MB.
	if [ -f "$PL_LOG" ] && [ "$(stat -c %s "$PL_LOG")" -gt $((50 * 1024 * 1024)) ]; then
		mv -f "$PL_LOG" "$PL_LOG.1"
	fi
	rm -f "$PL_PID"
	t=$EPOCHREALTIME
	# wsgi.py (from tests/placement-service/) loads /usr/bin/placement-api, fixing
	# oslo.log's eventlet lock swap that hangs threaded workers.
	# --lazy-apps: each worker loads the app itself, so no DB connection made
	# while loading is shared across fork. --die-on-term: SIGTERM stops
	# (uwsgi 2.0 would reload). --no-orphans: workers die with the master.
	# --thunder-lock: serialised accept. The pidfile path in the command line lets
	# services-stop.sh recognise the process.
	if ! env -i PATH="$PATH" LANG=C.UTF-8 LC_ALL=C.UTF-8 HOME=/root \
		OS_PLACEMENT_CONFIG_DIR="$PL_DIR" \
		/usr/bin/uwsgi-core \
		--plugin python3 \
		--http-socket "$PL_HOST:$PL_PORT" \
		--wsgi-file "$PL_WSGI" \
		--master --lazy-apps --die-on-term --no-orphans --thunder-lock --enable-threads \
		--processes "$PL_PROCESSES" --threads "$PL_THREADS" \
		--listen 128 --buffer-size 65535 --chdir "$PL_DIR" \
		--pidfile "$PL_PID" --daemonize "$PL_LOG" \
		--log-date --disable-logging \
		</dev/null >/dev/null 9>&-; then # fd 9 is our lock: the daemon must not keep it
		tail -n 20 "$PL_LOG" >&2 || true
		die "uwsgi failed to start Placement (log: $PL_LOG)"
	fi
	# The socket is bound before the app loads (2-3 s idle, 30 s on a busy box).
	local deadline=$((SECONDS + 120)) ok=0
	while [ $SECONDS -lt $deadline ]; do
		if placement_ok; then
			ok=1
			break
		fi
		[ -s "$PL_PID" ] && ! uwsgi_pid "$PL_PID" >/dev/null && break # uwsgi died
		sleep 0.2
	done
	if [ $ok = 0 ]; then
		echo "--- last lines of $PL_LOG:" >&2
		tail -n 40 "$PL_LOG" >&2 || true
		die "Placement did not answer on http://$PL_HOST:$PL_PORT/ within 120 s"
	fi
	echo "    started (uwsgi pid $(uwsgi_pid "$PL_PID"), ${PL_PROCESSES}x${PL_THREADS}) in $(elapsed "$t")s after db sync"
}

# ---------------------------------------------------------------- main
# One run at a time (several people may run `make test` at once).
install -d -m 0755 "$STATE_DIR"
exec 9>"$STATE_DIR/services.lock"
if ! flock -n 9; then
	echo "==> waiting for another services.sh run to finish"
	flock -w 900 9 || die "another services.sh run holds $STATE_DIR/services.lock"
fi
export SERVICES_LOCK_HELD=1

if [ "${SERVICES_NO_APT:-0}" != 1 ]; then
	step_start "packages"
	install_packages
	step_end packages
fi

step_start "PostgreSQL"
start_postgres
step_end postgresql

step_start "RabbitMQ"
start_rabbitmq
step_end rabbitmq

step_start "Placement"
start_placement
step_end placement

cat <<EOF

Services ready:
  PostgreSQL $PG_VER  127.0.0.1:$PG_PORT  (user postgres, trust)
                 stop: pg_ctlcluster $PG_VER main stop
  RabbitMQ        127.0.0.1:$RABBIT_PORT  amqp://guest:guest@127.0.0.1:$RABBIT_PORT/
                 stop: rabbitmqctl stop
  Placement       http://$PL_HOST:$PL_PORT  (noauth2: header 'X-Auth-Token: admin', microversions up to 1.39)
                 config $PL_CONF, log $PL_LOG, pid $PL_PID
                 stop: $HERE/services-stop.sh

Timings:
EOF
printf '  %s\n' "${TIMINGS[@]}"
printf '  %-22s %7ss\n' total "$(elapsed "$T_SCRIPT")"

# ---------------------------------------------------------------- 5. keystone (tests/keystone.sh)
# A real Keystone on 127.0.0.1:5000 for tests/keystone/ (its own database, state
# and summary; idempotent, ~0.1 s when it already answers). It runs under our lock
# (SERVICES_LOCK_HELD is exported). Stop it with tests/keystone.sh stop.
echo
bash "$HERE/keystone.sh" start
