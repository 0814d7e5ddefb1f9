#!/usr/bin/python3
"""Receive notifications with oslo.messaging's own notification listener.

Runs Debian's python3-oslo.messaging get_notification_listener on
exchange --exchange and topic --topic (each priority's routing key,
TOPIC.info, TOPIC.error, ...), in pool --pool: the listener declares a queue
named after the pool, bound to those keys, so it gets every message of its
own and none another listener takes. It prints:

    READY                                   once the queue is bound
    {"priority": "info", "publisher_id": ..., "event_type": ...,
     "payload": {...}, "metadata": {"message_id": ..., "timestamp": ...}}
                                            one JSON line per notification

flushing each line, in the order the messages arrive (one worker thread,
so the order is the queue's). It stops on SIGTERM, SIGINT or the end of
stdin, prints "STOPPED" and exits 0.

Usage:
    tests/oslo_listen.py --exchange vgpu_bridge --topic versioned_notifications
                         --pool my-test [--url rabbit://guest:guest@127.0.0.1:5672/]

The transport URL comes from --url, else $TRANSPORT_URL, else the local
RabbitMQ. The pool's queue outlives the listener (as oslo.messaging leaves
it): the caller deletes it.

Run it with Debian's /usr/bin/python3: a pyenv or virtualenv python3 cannot
see python3-oslo.messaging (the script re-executes itself with
/usr/bin/python3 when it is started by another interpreter).
"""

import argparse
import json
import logging
import os
import signal
import sys
import threading

DEBIAN_PYTHON = "/usr/bin/python3"

try:
    import oslo_messaging
    from oslo_config import cfg
except ImportError:
    if os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON) \
            and os.path.exists(DEBIAN_PYTHON):
        os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON] + sys.argv)
    sys.exit("oslo_listen.py: python3-oslo.messaging is missing "
             "(run `make services`)")

DEFAULT_URL = "rabbit://guest:guest@127.0.0.1:5672/"

_out = threading.Lock()


def emit(line):
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Endpoint(object):
    """One method per priority oslo.messaging knows: each prints the
    notification (the dispatcher listens only to the priorities its
    endpoints have methods for)."""

    def _print(self, priority, publisher_id, event_type, payload, metadata):
        emit(json.dumps({"priority": priority, "publisher_id": publisher_id,
                         "event_type": event_type, "payload": payload,
                         "metadata": metadata}, sort_keys=True))

    def audit(self, ctxt, publisher_id, event_type, payload, metadata):
        self._print("audit", publisher_id, event_type, payload, metadata)

    def debug(self, ctxt, publisher_id, event_type, payload, metadata):
        self._print("debug", publisher_id, event_type, payload, metadata)

    def info(self, ctxt, publisher_id, event_type, payload, metadata):
        self._print("info", publisher_id, event_type, payload, metadata)

    def warn(self, ctxt, publisher_id, event_type, payload, metadata):
        self._print("warn", publisher_id, event_type, payload, metadata)

    def error(self, ctxt, publisher_id, event_type, payload, metadata):
        self._print("error", publisher_id, event_type, payload, metadata)

    def critical(self, ctxt, publisher_id, event_type, payload, metadata):
        self._print("critical", publisher_id, event_type, payload, metadata)

    def sample(self, ctxt, publisher_id, event_type, payload, metadata):
        self._print("sample", publisher_id, event_type, payload, metadata)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Print the notifications of an exchange and topic, "
                    "received with oslo.messaging's notification listener.")
    p.add_argument("--url", default=os.environ.get("TRANSPORT_URL", DEFAULT_URL),
                   help="oslo transport URL (default: $TRANSPORT_URL or %s)"
                   % DEFAULT_URL)
    p.add_argument("--exchange", required=True, help="the Target's exchange")
    p.add_argument("--topic", required=True, help="the Target's topic")
    p.add_argument("--pool", required=True,
                   help="listener pool: the name of the queue it binds")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="oslo_listen.py: %(levelname)s %(name)s: %(message)s")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def watch_stdin():
        try:
            while sys.stdin.read(4096):
                pass
        except (OSError, ValueError):
            pass
        stop.set()
    threading.Thread(target=watch_stdin, daemon=True).start()

    conf = cfg.ConfigOpts()
    conf([], project="vgpu-bridge-test", default_config_files=[])
    transport = oslo_messaging.get_notification_transport(conf, url=args.url)
    try:
        listener = oslo_messaging.get_notification_listener(
            transport,
            [oslo_messaging.Target(exchange=args.exchange, topic=args.topic)],
            [Endpoint()], executor="threading", pool=args.pool)
        # One worker: notifications are handled (printed) in queue order.
        listener.start(override_pool_size=1)
        emit("READY")
        try:
            while not stop.wait(0.2):
                pass
        finally:
            listener.stop()
            listener.wait()
    finally:
        transport.cleanup()
    emit("STOPPED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
