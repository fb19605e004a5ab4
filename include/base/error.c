/* Status strings, version and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>

#include "base/error.h"

static _Thread_local char last_error[512];

ringattn_status_t ra__fail(ringattn_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void ra__clear_error(void) { last_error[0] = '\0'; }

const char *ringattn_last_error(void) { return last_error; }

const char *ringattn_status_string(ringattn_status_t status)
{
    switch (status) {
    case RINGATTN_SUCCESS: return "success";
    case RINGATTN_ERR_INVALID_ARGUMENT: return "invalid argument";
    case RINGATTN_ERR_INVALID_USAGE: return "invalid usage";
    case RINGATTN_ERR_UNSUPPORTED: return "unsupported";
    case RINGATTN_ERR_OUT_OF_MEMORY: return "out of memory";
    case RINGATTN_ERR_COMM: return "communication error";
    case RINGATTN_ERR_CUDA: return "CUDA error";
    case RINGATTN_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

int ringattn_version(void) { return RINGATTN_VERSION; }

#define RA_STR2(x) #x
#define RA_STR(x) RA_STR2(x)
const char *ringattn_version_string(void)
{
    return RA_STR(RINGATTN_VERSION_MAJOR) "." RA_STR(RINGATTN_VERSION_MINOR) "." RA_STR(
        RINGATTN_VERSION_PATCH);
}
