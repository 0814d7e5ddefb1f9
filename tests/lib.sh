# tests/lib.sh — what tests/services.sh, tests/keystone.sh, tests/services-stop.sh and
# tests/lab/lab.sh share. Sourced, never run: . "$(dirname "$(readlink -f "$0")")/lib.sh"

# as_root ENV_LIST ARGS...: re-run the calling script as root through sudo,
# keeping the variables named in ENV_LIST (comma-separated); exit if neither works.
as_root() {
	local keep=$1
	shift
	[ "$(id -u)" -eq 0 ] && return 0
	if command -v sudo >/dev/null 2>&1; then
		exec sudo --preserve-env="$keep" bash "$(readlink -f "$0")" "$@"
	fi
	echo "$(basename "$0"): must run as root (and sudo is not installed)" >&2
	exit 1
}

# debian_python_env: Debian's tools first. A pyenv/virtualenv python3 earlier on
# PATH cannot see the python3-* packages, and uwsgi's embedded interpreter must
# not pick up foreign prefixes either.
debian_python_env() {
	export PATH=/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin
	unset PYTHONPATH PYTHONHOME PYTHONSTARTUP VIRTUAL_ENV PYENV_VERSION CONDA_PREFIX
	export LC_ALL=C.UTF-8 LANG=C.UTF-8
	PY=/usr/bin/python3
}

# Step timings, printed at the end of a run from TIMINGS.
T_SCRIPT=$EPOCHREALTIME
TIMINGS=()
step_start() { T_STEP=$EPOCHREALTIME; echo "==> $1"; }
step_end() { # name
	local line
	printf -v line '%-22s %7ss' "$1" "$(elapsed "$T_STEP")"
	TIMINGS+=("$line")
}
elapsed() { # start-time (an $EPOCHREALTIME) -> seconds since, 2 decimals; no forks
	local now=$EPOCHREALTIME a b
	a=${1/./}
	b=${now/./}
	local cs=$(((10#$b - 10#$a) / 10000))
	printf '%d.%02d' $((cs / 100)) $((cs % 100))
}
die() { echo "$(basename "$0"): error: $*" >&2; exit 1; }

port_open() { # host port
	case $1 in
	127.*) (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null ;; # loopback answers or refuses at once
	*) timeout 1 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null ;;
	esac
}
wait_port() { # host port seconds
	local i
	for ((i = 0; i < $3 * 10; i++)); do
		port_open "$1" "$2" && return 0
		sleep 0.1
	done
	return 1
}
wait_port_closed() { # host port seconds
	local i
	for ((i = 0; i < $3 * 10; i++)); do
		port_open "$1" "$2" || return 0
		sleep 0.1
	done
	return 1
}

psql_admin() { # psql as the postgres superuser over the local socket
	runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -At "$@"
}

install_if_changed() { # src dst mode -> returns 0 when dst changed
	if [ -f "$2" ] && cmp -s "$1" "$2"; then
		return 1
	fi
	local tmp
	tmp=$(mktemp "$(dirname "$2")/.$(basename "$2").XXXXXX")
	cat "$1" >"$tmp"
	chmod "$3" "$tmp"
	mv -f "$tmp" "$2"
}

uwsgi_pid() { # pidfile -> prints the pid of the uwsgi master started with it, if alive
	local pid
	[ -s "$1" ] || return 1
	pid=$(tr -dc 0-9 <"$1")
	[ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$1" || return 1
	echo "$pid"
}

stop_uwsgi() { # name pidfile: stop the uwsgi master of pidfile (and its workers)
	local pid i
	if ! pid=$(uwsgi_pid "$2"); then
		rm -f "$2"
		echo "$1: not running"
		return 0
	fi
	kill -TERM "$pid"
	for ((i = 0; i < 100; i++)); do
		[ -d "/proc/$pid" ] || break
		sleep 0.1
	done
	if [ -d "/proc/$pid" ]; then
		echo "$1: uwsgi $pid still alive after 10 s, sending SIGKILL to its group"
		if [ "$(ps -o pgid= -p "$pid" | tr -d ' ')" = "$pid" ]; then
			kill -KILL -- "-$pid" # --daemonize made the master a group leader: take its workers too
		else
			kill -KILL "$pid"
		fi
	fi
	rm -f "$2"
	echo "$1: stopped (uwsgi pid $pid)"
}

# missing_packages PKG...: the PKGs dpkg does not have installed, one per line.
missing_packages() {
	local p st
	declare -A installed=()
	while IFS=$'\t' read -r p st; do
		[ "$st" = "install ok installed" ] && installed[$p]=1
	done < <(dpkg-query -W -f='${Package}\t${Status}\n' "$@" 2>/dev/null || true)
	for p in "$@"; do
		[ -n "${installed[$p]:-}" ] || echo "$p"
	done
}

# apt_install_quiet PKG...: installs the PKGs with apt, without starting the
# daemons they package on this machine. A policy-rc.d that refuses every start
# is written where none exists (some machines have their own: it is left as it
# is) and removed afterwards, or at the script's exit if apt fails; only the
# file this function wrote, recognised by its mark, is ever removed.
APT_POLICY_RC=/usr/sbin/policy-rc.d
APT_POLICY_MARK="# vgpu-bridge $(basename "$0"): temporary, removed when the script ends"
remove_our_policy_rc() {
	if [ -f "$APT_POLICY_RC" ] && grep -qxF "$APT_POLICY_MARK" "$APT_POLICY_RC"; then
		rm -f "$APT_POLICY_RC"
	fi
}
apt_install_quiet() {
	if [ ! -e "$APT_POLICY_RC" ]; then
		printf '#!/bin/sh\n%s\nexit 101\n' "$APT_POLICY_MARK" >"$APT_POLICY_RC"
		chmod 0755 "$APT_POLICY_RC"
		trap remove_our_policy_rc EXIT
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get -q update
	apt-get -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
		install --no-install-recommends "$@"
	remove_our_policy_rc
}
