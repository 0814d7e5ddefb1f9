#!/bin/sh
# setup-accounts.sh — least-privilege RabbitMQ accounts for vgpu-bridge.
#
#   setup-accounts.sh [-p VHOST] [-P PASSWORD_FILE] bridge USER
#   setup-accounts.sh [-p VHOST] [-P PASSWORD_FILE] agent  USER HOST
#   setup-accounts.sh [-p VHOST] [-P PASSWORD_FILE] nova   USER
#
# Creates USER (or changes its password) when -P is given — the password is
# the first line of PASSWORD_FILE ("-" for standard input) and is passed to
# rabbitmqctl on its standard input, never on a command line — then sets its
# permissions on VHOST (default "/") with rabbitmqctl set_permissions and
# set_topic_permissions. Without -P the user must exist and keeps its
# password. Run it as a user that may run rabbitmqctl (root on the broker).
#
# The three kinds of account (commands, results and reports share the topic
# exchange "vgpu", so routing keys are restricted with topic permissions):
#
#   bridge  reads Nova's notifications (binds its queue to exchange "nova"
#           with versioned_notifications.info/.error only, cannot publish
#           there), declares the exchange "vgpu" and its queues
#           vgpu.bridge.results / vgpu.bridge.reports, may declare and bind
#           the agents' queues (so no command is lost before an agent's first
#           start), publishes commands (routing keys agent.<host>) and
#           nothing else on "vgpu", consumes results and reports. It cannot
#           consume an agent's queue nor publish a result or a report.
#   agent   (one per compute host HOST) declares and consumes only its queue
#           vgpu.agent.HOST, binds it only with agent.HOST, publishes only
#           result.HOST and report.HOST on "vgpu". It cannot read another
#           host's queue, publish a command, or speak for another host; it
#           cannot declare or delete the exchange "vgpu" (the bridge declares
#           it; until then the agent retries).
#   nova    Nova's own account (all its services): everything in the vhost
#           except the names of vgpu-bridge (vgpu, vgpu.*, vgpu-*), so a
#           compute host's Nova credentials cannot command an agent.
#
# Environment (names, if changed in the daemons' configuration):
#   RABBITMQCTL          command to run            (rabbitmqctl)
#   VGPU_EXCHANGE        bridge↔agent exchange     (vgpu)
#   NOVA_EXCHANGE        Nova's control exchange   (nova)
#   NOTIFICATIONS_QUEUE  the bridge's queue        (vgpu-bridge.notifications; [notifications] queue)
#   NOTIFICATION_TOPIC   Nova's notification topic (versioned_notifications)
set -eu

RABBITMQCTL=${RABBITMQCTL:-rabbitmqctl}
VGPU_EXCHANGE=${VGPU_EXCHANGE:-vgpu}
NOVA_EXCHANGE=${NOVA_EXCHANGE:-nova}
NOTIFICATIONS_QUEUE=${NOTIFICATIONS_QUEUE:-vgpu-bridge.notifications}
NOTIFICATION_TOPIC=${NOTIFICATION_TOPIC:-versioned_notifications}

usage() {
	sed -n '3,5p' "$0" | sed 's/^# *//' >&2
	exit 2
}

vhost=/
password_file=
while getopts p:P: opt; do
	case $opt in
	p) vhost=$OPTARG ;;
	P) password_file=$OPTARG ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || usage
kind=$1 user=$2

# re QUOTES a literal name for a regular expression.
re() { printf '%s' "$1" | sed 's/[][\\.^$*+?(){}|/]/\\&/g'; }

ctl() { "$RABBITMQCTL" -q "$@"; }

ensure_user() {
	if [ -n "$password_file" ]; then
		if [ "$password_file" = - ]; then
			IFS= read -r pw || true
		else
			IFS= read -r pw <"$password_file" || true
		fi
		[ -n "$pw" ] || { echo "setup-accounts: empty password" >&2; exit 1; }
		if ! printf '%s\n' "$pw" | ctl add_user "$user" >/dev/null 2>&1; then
			# It exists (or add_user failed for another reason, which
			# change_password then reports).
			printf '%s\n' "$pw" | ctl change_password "$user" >/dev/null
		fi
		unset pw
	elif ! ctl list_users --no-table-headers | cut -f1 | grep -qxF -- "$user"; then
		echo "setup-accounts: user $user does not exist; give -P PASSWORD_FILE to create it" >&2
		exit 1
	fi
}

X=$(re "$VGPU_EXCHANGE")
N=$(re "$NOVA_EXCHANGE")
Q=$(re "$NOTIFICATIONS_QUEUE")
T=$(re "$NOTIFICATION_TOPIC")

case $kind in
bridge)
	[ $# -eq 2 ] || usage
	ensure_user
	own="$X|vgpu\\.bridge\\.(results|reports)|$Q"
	ctl set_permissions -p "$vhost" "$user" \
		"^($own|vgpu\\.agent\\..+)\$" \
		"^($own|vgpu\\.agent\\..+)\$" \
		"^($own|$N)\$"
	# On "vgpu": publish commands only; bind agent, result and report keys.
	ctl set_topic_permissions -p "$vhost" "$user" "$VGPU_EXCHANGE" \
		'^agent\..+$' '^(agent|result|report)\..+$'
	# On Nova's exchange: publish nothing; bind the notification topics only.
	ctl set_topic_permissions -p "$vhost" "$user" "$NOVA_EXCHANGE" \
		'^$' "^$T\\.(info|error)\$"
	;;
agent)
	[ $# -eq 3 ] || usage
	host=$3
	H=$(re "$host")
	ensure_user
	# configure: its queue only; write: the exchange (publish) and its queue
	# (bind); read: its queue (consume) and the exchange (bind).
	ctl set_permissions -p "$vhost" "$user" \
		"^vgpu\\.agent\\.$H\$" \
		"^($X|vgpu\\.agent\\.$H)\$" \
		"^($X|vgpu\\.agent\\.$H)\$"
	ctl set_topic_permissions -p "$vhost" "$user" "$VGPU_EXCHANGE" \
		"^(result|report)\\.$H\$" "^agent\\.$H\$"
	;;
nova)
	[ $# -eq 2 ] || usage
	ensure_user
	notvgpu='^(?!vgpu($|[.-])).*$'
	ctl set_permissions -p "$vhost" "$user" "$notvgpu" "$notvgpu" "$notvgpu"
	;;
*)
	usage
	;;
esac
echo "setup-accounts: $kind account $user set on vhost $vhost"
