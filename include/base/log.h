/* Logging (DESIGN): RINGATTN_LOG=warn|info|debug|trace, read once; lines carry [rank r/n]. */
#ifndef RINGATTN_BASE_LOG_H
#define RINGATTN_BASE_LOG_H

enum ra_log_level { RA_LOG_OFF = 0, RA_LOG_WARN, RA_LOG_INFO, RA_LOG_DEBUG, RA_LOG_TRACE };

int ra__log_enabled(enum ra_log_level level);
void ra__log(enum ra_log_level level, int rank, int ranks, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
