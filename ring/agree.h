/* Collective check that every rank passed the same, valid descriptor. Internal. */
#ifndef RINGATTN_RING_AGREE_H
#define RINGATTN_RING_AGREE_H

#include "ringattn.h"

/* Collective over comm. local: this rank's own validation result. */
ringattn_status_t ra__plan_agree(ringattn_comm_t comm, const ringattn_plan_desc_t *desc,
                                 ringattn_status_t local);

#endif
