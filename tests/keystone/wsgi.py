"""WSGI entry point for the test Keystone (loaded by uwsgi, see tests/keystone.sh).

It builds Keystone's public application as Debian's /usr/bin/keystone-wsgi-public
does, after the same oslo.log fix as tests/placement-service/wsgi.py:

oslo.log 5.0.1 (Debian 12) swaps the stdlib logging locks for eventlet green
locks whenever the module ``eventlet`` is merely *imported*. Under uwsgi with
more than one thread per worker, two OS threads logging at once then fail with
"greenlet.error: cannot switch to a different thread" and the request hangs
for good (eventlet issue #432). Later oslo.log releases apply the swap only
when eventlet has monkey-patched ``thread``; this does the same.
"""

import sys

from oslo_log import log as _oslo_log

_original_fix = getattr(_oslo_log, "_fix_eventlet_logging", None)


def _fix_eventlet_logging_if_patched():
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        _original_fix()


if _original_fix is not None:
    _oslo_log._fix_eventlet_logging = _fix_eventlet_logging_if_patched

from keystone.server.wsgi import initialize_public_application  # noqa: E402

application = initialize_public_application()
