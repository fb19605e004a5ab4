/* The library's own public functions: status names and texts, the last error, the version, the
   CPU kernels' line and the log callback (ringattn.h). Each is a thin face over base/ and
   kernels/: the floors below api/ define no public function (docs/DESIGN.md, the floors). */
#include "base/error.h"
#include "base/log.h"
#include "base/version.h"
#include "kernels/backends.h"

const char *ringattn_status_string(ringattn_status_t status) { return ra__status_text(status); }

const char *ringattn_status_name(ringattn_status_t status) { return ra__status_name(status); }

const char *ringattn_last_error(void) { return ra__last_error(); }

int ringattn_version(void) { return RINGATTN_VERSION; }

const char *ringattn_version_string(void) { return RA_VERSION_STRING; }

const char *ringattn_cpu_kernels(void) { return ra__cpu_kernels(); }

ringattn_status_t ringattn_set_log_callback(ringattn_log_fn fn, void *user,
                                            ringattn_log_level_t level)
{
    RA_CHECK(level >= RINGATTN_LOG_OFF && level <= RINGATTN_LOG_TRACE,
             RINGATTN_ERR_INVALID_ARGUMENT,
             "ringattn_set_log_callback: level: got %d, expected RINGATTN_LOG_OFF .. _TRACE",
             (int)level);
    ra__set_log_callback(fn, user, level);
    ra__clear_error();
    return RINGATTN_SUCCESS;
}
