/*
 * Logging (README, "Logging"; DESIGN): levels RINGATTN_LOG=off|warn|info|debug|trace, a filter
 * of subsystems RINGATTN_LOG_SUBSYS, lines prefixed host:pid:rank (RINGATTN_LOG_TIME=1 adds the
 * time), to stderr, RINGATTN_LOG_FILE (%h host, %p pid, %r rank) or the caller's callback
 * (ringattn_set_log_callback). Internal.
 */
#ifndef RINGATTN_BASE_LOG_H
#define RINGATTN_BASE_LOG_H

#include "ringattn.h"

enum ra_log_level { RA_LOG_OFF = 0, RA_LOG_WARN, RA_LOG_INFO, RA_LOG_DEBUG, RA_LOG_TRACE };

/* Who logs: the filter's names are "plan", "ring", "comm", "kernels", "error" (the debug trail
   of a failure: base/error.h). */
enum ra_log_subsys {
    RA_SUB_PLAN = 0,
    RA_SUB_RING,
    RA_SUB_COMM,
    RA_SUB_KERNELS,
    RA_SUB_ERROR,
    RA_NUM_SUBSYS
};

int ra__log_enabled(enum ra_log_level level, enum ra_log_subsys subsys);
/* rank -1: no rank (a process-wide line, the backend's choice of kernels, say) */
void ra__log(enum ra_log_level level, enum ra_log_subsys subsys, int rank, int ranks,
             const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A failed public call's message as its log line (README, "Logging"): at warn for failures of
   the system (comm, CUDA, memory, internal), at info for refused arguments and usage. */
void ra__log_failure(enum ra_log_subsys subsys, int rank, int ranks, int status);

/* The caller's sink for every line at or below level (fn NULL: back to the environment's
   settings); level already checked (api/library.c). */
void ra__set_log_callback(ringattn_log_fn fn, void *user, ringattn_log_level_t level);

#endif
