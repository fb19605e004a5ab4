/* Status names and texts, the thread-local last-error message and the debug trail (the public
   functions over them are api/library.c's). */
#include <stdarg.h>
#include <stdio.h>

#include "base/error.h"
#include "base/log.h"

static _Thread_local char last_error[512];

ringattn_status_t ra__fail(ringattn_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

ringattn_status_t ra__fail_at(const char *file, int line, ringattn_status_t status,
                              const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    if (ra__log_enabled(RA_LOG_DEBUG, RA_SUB_ERROR))
        ra__log(RA_LOG_DEBUG, RA_SUB_ERROR, -1, 0, "%s:%d -> %s: %s", file, line,
                ra__status_name(status), last_error);
    return status;
}

ringattn_status_t ra__trail(const char *file, int line, ringattn_status_t status)
{
    if (ra__log_enabled(RA_LOG_DEBUG, RA_SUB_ERROR))
        ra__log(RA_LOG_DEBUG, RA_SUB_ERROR, -1, 0, "%s:%d -> %s", file, line,
                ra__status_name(status));
    return status;
}

void ra__clear_error(void) { last_error[0] = '\0'; }

const char *ra__last_error(void) { return last_error; }

/* Every status: its name (the enumerator) and its text, in one table (ringattn.h). */
static const struct {
    ringattn_status_t status;
    const char *name, *text;
} statuses[] = {
    {RINGATTN_SUCCESS, "RINGATTN_SUCCESS", "success"},
    {RINGATTN_ERR_INVALID_ARGUMENT, "RINGATTN_ERR_INVALID_ARGUMENT", "invalid argument"},
    {RINGATTN_ERR_INVALID_USAGE, "RINGATTN_ERR_INVALID_USAGE", "invalid usage"},
    {RINGATTN_ERR_UNSUPPORTED, "RINGATTN_ERR_UNSUPPORTED", "unsupported"},
    {RINGATTN_ERR_OUT_OF_MEMORY, "RINGATTN_ERR_OUT_OF_MEMORY", "out of memory"},
    {RINGATTN_ERR_COMM, "RINGATTN_ERR_COMM", "communication error"},
    {RINGATTN_ERR_CUDA, "RINGATTN_ERR_CUDA", "CUDA error"},
    {RINGATTN_ERR_INTERNAL, "RINGATTN_ERR_INTERNAL", "internal error"},
};

static int status_index(ringattn_status_t status)
{
    for (int i = 0; i < (int)(sizeof statuses / sizeof statuses[0]); i++)
        if (statuses[i].status == status) return i;
    return -1;
}

const char *ra__status_text(ringattn_status_t status)
{
    const int i = status_index(status);
    return i < 0 ? "unknown status" : statuses[i].text;
}

const char *ra__status_name(ringattn_status_t status)
{
    const int i = status_index(status);
    return i < 0 ? "RINGATTN_STATUS_UNKNOWN" : statuses[i].name;
}
