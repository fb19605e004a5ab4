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
/* This thread's last message, and the name ("RINGATTN_ERR_COMM") and text ("communication
   error") of a status: ringattn_last_error, _status_name and _status_string. */
const char *ra__last_error(void);
const char *ra__status_name(ringattn_status_t status);
const char *ra__status_text(ringattn_status_t status);
/* The same from RA_CHECK, and RA_TRY's propagation: at RINGATTN_LOG=debug each logs
   "file:line -> RINGATTN_ERR_..." (subsystem "error"), the trail of a failure up to its public
   call, as NCCL's NCCLCHECK does. The files are relative to the source tree. */
ringattn_status_t ra__fail_at(const char *file, int line, ringattn_status_t status,
                              const char *fmt, ...) __attribute__((format(printf, 4, 5)));
ringattn_status_t ra__trail(const char *file, int line, ringattn_status_t status);

/* Return from the enclosing function with status and a message unless cond holds. */
#define RA_CHECK(cond, status, ...)                                                 \
    do {                                                                            \
        if (!(cond)) return ra__fail_at(__FILE__, __LINE__, (status), __VA_ARGS__); \
    } while (0)

/* Propagate a failing status (its message is already recorded). */
#define RA_TRY(expr)                                                                    \
    do {                                                                                \
        ringattn_status_t ra_try_s_ = (expr);                                           \
        if (ra_try_s_ != RINGATTN_SUCCESS) return ra__trail(__FILE__, __LINE__, ra_try_s_); \
    } while (0)

#endif
