/*
 * The struct_size policy of the public header: a caller's struct of any released size is read
 * (missing fields take the _INIT defaults) or written (only the fields it has); any other size
 * is refused. Internal.
 */
#ifndef RINGATTN_BASE_ABI_H
#define RINGATTN_BASE_ABI_H

#include "ringattn.h"
#include "ringattn_transport.h"

/* The caller's descriptor (not NULL) as this version's struct, in *out. */
ringattn_status_t ra__desc_in(const char *fn, const ringattn_plan_desc_t *d,
                              ringattn_plan_desc_t *out);
/* The caller's tensors (not NULL) as this version's struct, in *out. */
ringattn_status_t ra__tensors_in(const char *fn, const ringattn_tensors_t *t,
                                 ringattn_tensors_t *out);
/* The caller's transport table (not NULL) as this version's struct, in *out. */
ringattn_status_t ra__transport_in(const char *fn, const ringattn_transport_t *t,
                                   ringattn_transport_t *out);
/* Checks the caller's info struct (not NULL); then ra__info_out copies what it has room for. */
ringattn_status_t ra__info_check(const char *fn, const ringattn_plan_info_t *info);
void ra__info_out(const ringattn_plan_info_t *full, ringattn_plan_info_t *info);

#endif
