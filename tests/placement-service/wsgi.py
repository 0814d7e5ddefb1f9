"""WSGI entry point for the test Placement API (loaded by uwsgi, see tests/services.sh).

It loads Debian's /usr/bin/placement-api unchanged, after one fix:

oslo.log 5.0.1 (Debian 12) swaps the stdlib logging locks for eventlet green
locks whenever the module ``eventlet`` is merely *imported* -- and
oslo_concurrency.lockutils imports it in every Placement process. Under uwsgi
with more than one thread per worker, two OS threads logging at once then
fail with "greenlet.error: cannot switch to a different thread" and the
request hangs for good (eventlet issue #432). Later oslo.log releases apply
the swap only when eventlet has monkey-patched ``thread``; this does the same.
"""

import importlib.util
import sys
from importlib.machinery import SourceFileLoader

from oslo_log import log as _oslo_log

_original_fix = getattr(_oslo_log, "_fix_eventlet_logging", None)


def _fix_eventlet_logging_if_patched():
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        _original_fix()


if _original_fix is not None:
    _oslo_log._fix_eventlet_logging = _fix_eventlet_logging_if_patched

_loader = SourceFileLoader("placement_api", "/usr/bin/placement-api")
_module = importlib.util.module_from_spec(
    importlib.util.spec_from_loader(_loader.name, _loader))
_loader.exec_module(_module)
application = _module.application
