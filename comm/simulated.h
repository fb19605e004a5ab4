/* The simulated transport (comm/simulated.c), for the API's entry point. Internal. */
#ifndef RINGATTN_COMM_SIMULATED_H
#define RINGATTN_COMM_SIMULATED_H

#include "ringattn.h"

/* Rank `rank` of `size` (checked by the caller: 0 <= rank < size), a live comm with no peers. */
ringattn_status_t ra__comm_create_simulated(const char *fn, int rank, int size,
                                            ringattn_comm_t *comm);

#endif
