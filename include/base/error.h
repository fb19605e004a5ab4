/*
 * Status, thread-local error message and the check macros (DESIGN: errors).
 * Messages read "<function>: <what>: got <value>, expected <constraint>".
 */
#ifndef RINGATTN_BASE_ERROR_H
#define RINGATTN_BASE_ERROR_H

#include "ringattn.h"

/* Records the message for ringattn_last_error() and returns status. */
ringattn_status_t ra__fail(ringattn_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void ra__clear_error(void);

/* Return from the enclosing function with status and a message unless cond holds. */
#define RA_CHECK(cond, status, ...)                       \
    do {                                                  \
        if (!(cond)) return ra__fail((status), __VA_ARGS__); \
    } while (0)

/* Propagate a failing status (its message is already recorded). */
#define RA_TRY(expr)                                \
    do {                                            \
        ringattn_status_t ra_try_s_ = (expr);       \
        if (ra_try_s_ != RINGATTN_SUCCESS) return ra_try_s_; \
    } while (0)

#endif
