/* Collective check at plan creation: every rank passed the same, valid descriptor. Internal. */
#ifndef RINGATTN_PLAN_AGREE_H
#define RINGATTN_PLAN_AGREE_H

#include "kernels/backend.h"
#include "ringattn.h"

/* Collective over comm. local: this rank's own validation result; desc (this version's
   descriptor) and backend are read only when local is RINGATTN_SUCCESS. */
ringattn_status_t ra__plan_agree(ringattn_comm_t comm, const ringattn_plan_desc_t *desc,
                                 const struct ra_backend *backend, ringattn_status_t local);

/* FNV-1a of n bytes, halved so that its negation never overflows (the agreements' MIN over
   {hash, -hash} tells whether every rank had the same). */
int64_t ra__hash_of(const void *data, size_t n);

#endif
