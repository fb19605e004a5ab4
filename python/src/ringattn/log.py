"""libringattn's log lines in Python's logging (ringattn_set_log_callback, README "Logging").

    import logging, ringattn
    ringattn.log_to(logging.getLogger("ringattn"), logging.INFO)   # from now on
    ringattn.log_to(None)                                          # back to stderr

Each line becomes a record of its level (warn, info, debug; trace as level 5) on the logger,
with the extra fields ``subsystem`` ("plan", "ring", "comm", "kernels"), ``rank`` and ``ranks``
(-1 and 0: none). Lines come from the thread that logs: a rank's thread, or the caller's.
"""
import ctypes
import logging

from ._capi import check, lib

_LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                           ctypes.c_int, ctypes.c_char_p)
_TO_LOGGING = {1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG, 4: 5}
_FROM_LOGGING = ((5, 4), (logging.DEBUG, 3), (logging.INFO, 2), (logging.WARNING, 1))
_callback = None  # the ctypes callback must outlive its use by the library


def _c_level(level):
    for py, c in _FROM_LOGGING:
        if level <= py:
            return c
    return 0  # above WARNING: nothing of the library's


def log_to(logger, level=logging.INFO):
    """Route the library's lines up to `level` (a logging level) to `logger`; None: stderr."""
    global _callback
    if logger is None:
        check(lib().ringattn_set_log_callback(None, None, 0))
        _callback = None
        return

    def emit(user, c_level, subsystem, rank, ranks, message):
        logger.log(_TO_LOGGING.get(c_level, logging.INFO), "%s", message.decode(errors="replace"),
                   extra={"subsystem": subsystem.decode(), "rank": rank, "ranks": ranks})

    fn = _LOG_FN(emit)
    check(lib().ringattn_set_log_callback(fn, None, _c_level(level)))
    _callback = fn
