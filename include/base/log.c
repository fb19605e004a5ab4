/* Logging to stderr, level from RINGATTN_LOG (default: warn). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int level = RA_LOG_WARN;

static void read_level(void)
{
    static const char *names[] = {"off", "warn", "info", "debug", "trace"};
    const char *env = getenv("RINGATTN_LOG");
    if (!env) return;
    for (int i = 0; i < 5; ++i)
        if (strcmp(env, names[i]) == 0) level = i;
}

int ra__log_enabled(enum ra_log_level l)
{
    pthread_once(&once, read_level);
    return (int)l <= level;
}

void ra__log(enum ra_log_level l, int rank, int ranks, const char *fmt, ...)
{
    static const char *tags[] = {"", "warn", "info", "debug", "trace"};
    if (!ra__log_enabled(l)) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[ringattn] [rank %d/%d] %s: %s\n", rank, ranks, tags[l], line);
}
