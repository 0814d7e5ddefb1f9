#!/usr/bin/python3
"""Publish Nova-style versioned notifications with oslo.messaging's own Notifier.

Reads JSON lines from stdin, one notification per line:

    {"event_type": "instance.create.end", "payload": {...},
     "priority": "INFO", "publisher_id": "nova-compute:host1"}

and sends each through Debian's python3-oslo.messaging exactly as Nova does:
control exchange "nova", driver "messagingv2", topic "versioned_notifications",
so the message lands on exchange "nova" with routing key
"versioned_notifications.<priority lowercased>" (oslo.messaging also declares
and binds a queue of that name, as with Nova).

"context" is optional: a request context dict (as Nova's RequestContext
to_dict(): request_id, global_request_id, user_id, project_id, roles, ...);
oslo.messaging keeps only its safe keys and sends each as a top-level
"_context_<key>" field of the message. "priority" is optional (default INFO; one of audit, debug, info, warn,
warning, error, critical, sample; any case). "publisher_id" is optional
(default --publisher-id). "payload" for versioned notifications is the
ovo-serialised object ({"nova_object.name": ..., "nova_object.data": ...}).

Usage:
    tests/oslo_notify.py [--url rabbit://guest:guest@127.0.0.1:5672/]
                         [--exchange nova] [--topic versioned_notifications]
                         < notifications.jsonl

The transport URL comes from --url, else $TRANSPORT_URL, else the local
RabbitMQ. Tests should pass a unique --topic (and/or --exchange) so they do
not fill the shared broker's "versioned_notifications.*" queues.
Prints the number sent to stderr; exit 1 on a bad line (nothing after it is
sent), 2 on bad arguments.

Run it with Debian's /usr/bin/python3: a pyenv or virtualenv python3 cannot
see python3-oslo.messaging (the script re-executes itself with
/usr/bin/python3 when it is started by another interpreter).
"""

import argparse
import json
import logging
import os
import sys

DEBIAN_PYTHON = "/usr/bin/python3"

try:
    import oslo_messaging
    from oslo_config import cfg
except ImportError:
    if os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON) \
            and os.path.exists(DEBIAN_PYTHON):
        os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON] + sys.argv)
    sys.exit("oslo_notify.py: python3-oslo.messaging is missing "
             "(run `make services`)")

DEFAULT_URL = "rabbit://guest:guest@127.0.0.1:5672/"
PRIORITIES = ("audit", "debug", "info", "warn", "warning", "error",
              "critical", "sample")


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Publish JSON-lines notifications from stdin with "
                    "oslo.messaging's Notifier (messagingv2).")
    p.add_argument("--url", default=os.environ.get("TRANSPORT_URL", DEFAULT_URL),
                   help="oslo transport URL (default: $TRANSPORT_URL or %s)"
                   % DEFAULT_URL)
    p.add_argument("--exchange", default="nova",
                   help="control exchange (default: nova)")
    p.add_argument("--topic", action="append",
                   help="notification topic, repeatable "
                        "(default: versioned_notifications)")
    p.add_argument("--driver", default="messagingv2",
                   help="notification driver (default: messagingv2)")
    p.add_argument("--publisher-id", default="nova-compute:vgpu-bridge-test",
                   help="publisher_id for lines without one")
    return p.parse_args(argv)


def read_notifications(stream, default_publisher):
    """Parse every line first, so a bad line sends nothing."""
    out = []
    for lineno, line in enumerate(stream, 1):
        line = line.strip()
        if not line:
            continue
        try:
            n = json.loads(line)
        except ValueError as e:
            raise ValueError("line %d: not JSON: %s" % (lineno, e))
        if not isinstance(n, dict) or not isinstance(n.get("event_type"), str):
            raise ValueError("line %d: want an object with a string "
                             "event_type" % lineno)
        priority = str(n.get("priority") or "info").lower()
        if priority not in PRIORITIES:
            raise ValueError("line %d: priority %r is not one of %s"
                             % (lineno, n.get("priority"), ", ".join(PRIORITIES)))
        context = n.get("context") or {}
        if not isinstance(context, dict):
            raise ValueError("line %d: context must be an object" % lineno)
        out.append((n["event_type"], n.get("payload", {}), priority,
                    n.get("publisher_id") or default_publisher, context))
    return out


class _Failures(logging.Handler):
    """The Notifier logs send errors instead of raising them: count them."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record):
        self.count += 1


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        notifications = read_notifications(sys.stdin, args.publisher_id)
    except ValueError as e:
        print("oslo_notify.py: %s" % e, file=sys.stderr)
        return 1

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="oslo_notify.py: %(levelname)s %(name)s: %(message)s")
    failures = _Failures()
    logging.getLogger().addHandler(failures)

    conf = cfg.ConfigOpts()
    conf([], project="vgpu-bridge-test", default_config_files=[])
    oslo_messaging.set_transport_defaults(control_exchange=args.exchange)
    transport = oslo_messaging.get_notification_transport(conf, url=args.url)
    try:
        notifier = oslo_messaging.Notifier(
            transport, publisher_id=args.publisher_id, driver=args.driver,
            topics=args.topic or ["versioned_notifications"], retry=3)
        for event_type, payload, priority, publisher, context in notifications:
            n = notifier.prepare(publisher_id=publisher)
            getattr(n, priority)(context, event_type, payload)
    finally:
        transport.cleanup()
    if failures.count:
        print("oslo_notify.py: %d error(s) while sending (see above)"
              % failures.count, file=sys.stderr)
        return 1
    print("oslo_notify.py: sent %d notification(s) to exchange %r"
          % (len(notifications), args.exchange), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
