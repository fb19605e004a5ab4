/*
 * Logging (log.h). The settings are read once from the environment; a callback set by
 * ra__set_log_callback (ringattn_set_log_callback) takes the lines instead of stderr or the
 * file. Lines from several threads (ranks as threads) never interleave: one lock around the
 * sinks.
 */
#define _POSIX_C_SOURCE 200809L /* gethostname, localtime_r */
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"

static const char *const subsys_names[RA_NUM_SUBSYS] = {"plan", "ring", "comm", "kernels", "error"};
static const char *const level_names[] = {"OFF", "WARN", "INFO", "DEBUG", "TRACE"};

#define RA_LOG_FILES 64 /* distinct RINGATTN_LOG_FILE names (ranks) one process writes */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static struct {
    int level, subsys_on[RA_NUM_SUBSYS], timestamps;
    const char *file_pattern;
    char host[64];
    struct { char name[512]; FILE *f; } files[RA_LOG_FILES];
    int nfiles, file_failed;
    ringattn_log_fn callback; /* with its own level */
    void *user;
} g;

/* The level lines are made at: RINGATTN_LOG's, or the callback's (read without the lock). */
static atomic_int effective_level;

/* RINGATTN_LOG_SUBSYS: a comma list of names to keep, or ^ then the names to leave out. */
static void read_subsys(const char *env)
{
    const int exclude = env[0] == '^';
    for (int s = 0; s < RA_NUM_SUBSYS; ++s) g.subsys_on[s] = exclude;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", env + exclude);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        for (int s = 0; s < RA_NUM_SUBSYS; ++s)
            if (!strcmp(tok, subsys_names[s])) g.subsys_on[s] = !exclude;
}

static void read_settings(void)
{
    static const char *names[] = {"off", "warn", "info", "debug", "trace"};
    g.level = RA_LOG_WARN;
    for (int s = 0; s < RA_NUM_SUBSYS; ++s) g.subsys_on[s] = 1;
    const char *env = getenv("RINGATTN_LOG");
    for (int i = 0; env && i < 5; ++i)
        if (strcmp(env, names[i]) == 0) g.level = i;
    atomic_store(&effective_level, g.level);
    if ((env = getenv("RINGATTN_LOG_SUBSYS")) && *env) read_subsys(env);
    env = getenv("RINGATTN_LOG_TIME");
    g.timestamps = env && *env && strcmp(env, "0") != 0;
    env = getenv("RINGATTN_LOG_FILE");
    g.file_pattern = env && *env ? env : NULL;
    if (gethostname(g.host, sizeof g.host) != 0) snprintf(g.host, sizeof g.host, "unknown");
    g.host[sizeof g.host - 1] = '\0';
    char *dot = strchr(g.host, '.'); /* the short name, as NCCL prints it */
    if (dot) *dot = '\0';
}

int ra__log_enabled(enum ra_log_level l, enum ra_log_subsys s)
{
    pthread_once(&once, read_settings);
    return (int)l <= atomic_load_explicit(&effective_level, memory_order_relaxed) && g.subsys_on[s];
}

/* The file pattern with %h, %p and %r (the rank, "-" for none) filled in. */
static void expand(char *out, size_t n, int rank)
{
    size_t k = 0;
    for (const char *c = g.file_pattern; *c && k + 1 < n; ++c) {
        if (c[0] != '%' || !c[1]) {
            out[k++] = *c;
            continue;
        }
        char part[64] = "";
        ++c;
        if (*c == 'h') snprintf(part, sizeof part, "%s", g.host);
        else if (*c == 'p') snprintf(part, sizeof part, "%ld", (long)getpid());
        else if (*c == 'r') rank >= 0 ? snprintf(part, sizeof part, "%d", rank) : snprintf(part, sizeof part, "-");
        else snprintf(part, sizeof part, "%%%c", *c);
        for (const char *p = part; *p && k + 1 < n; ++p) out[k++] = *p;
    }
    out[k] = '\0';
}

/* Where a line of `rank` goes: its file (opened, appending, at its first line), else stderr. */
static FILE *sink(int rank)
{
    if (!g.file_pattern || g.file_failed) return stderr;
    char name[512];
    expand(name, sizeof name, rank);
    for (int i = 0; i < g.nfiles; ++i)
        if (!strcmp(g.files[i].name, name)) return g.files[i].f;
    FILE *f = g.nfiles < RA_LOG_FILES ? fopen(name, "a") : NULL;
    if (!f) {
        g.file_failed = 1; /* said once, then every line to stderr */
        fprintf(stderr, "%s:%ld:- ringattn WARN ring: RINGATTN_LOG_FILE: cannot open %s (or more "
                        "than %d files); logging to stderr\n",
                g.host, (long)getpid(), name, RA_LOG_FILES);
        return stderr;
    }
    setvbuf(f, NULL, _IOLBF, 0);
    snprintf(g.files[g.nfiles].name, sizeof g.files[g.nfiles].name, "%s", name);
    g.files[g.nfiles++].f = f;
    return f;
}

void ra__log(enum ra_log_level l, enum ra_log_subsys s, int rank, int ranks, const char *fmt, ...)
{
    if (!ra__log_enabled(l, s)) return;
    char line[1024], when[48] = "", who[16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&mu);
    if (g.callback) {
        g.callback(g.user, (ringattn_log_level_t)l, subsys_names[s], rank, ranks, line);
        pthread_mutex_unlock(&mu);
        return;
    }
    if (g.timestamps) {
        struct timeval tv;
        struct tm tm;
        gettimeofday(&tv, NULL);
        localtime_r(&tv.tv_sec, &tm);
        const size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(when + n, sizeof when - n, ".%06ld ", (long)tv.tv_usec);
    }
    if (rank >= 0) snprintf(who, sizeof who, "%d", rank);
    else snprintf(who, sizeof who, "-");
    fprintf(sink(rank), "%s:%ld:%s %sringattn %s %s: %s\n", g.host, (long)getpid(), who, when,
            level_names[l], subsys_names[s], line);
    pthread_mutex_unlock(&mu);
}

void ra__set_log_callback(ringattn_log_fn fn, void *user, ringattn_log_level_t level)
{
    pthread_once(&once, read_settings);
    pthread_mutex_lock(&mu);
    g.callback = fn;
    g.user = fn ? user : NULL;
    atomic_store(&effective_level, fn ? (int)level : g.level);
    pthread_mutex_unlock(&mu);
}

void ra__log_failure(enum ra_log_subsys s, int rank, int ranks, int status)
{
    const int refused = status == RINGATTN_ERR_INVALID_ARGUMENT ||
                        status == RINGATTN_ERR_INVALID_USAGE || status == RINGATTN_ERR_UNSUPPORTED;
    ra__log(refused ? RA_LOG_INFO : RA_LOG_WARN, s, rank, ranks, "%s (%s)", ra__last_error(),
            ra__status_text((ringattn_status_t)status));
}
