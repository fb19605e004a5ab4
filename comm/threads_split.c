/*
 * The threads transport's split_grid (comm.h). The ranks of a hub are threads of one process, so
 * rank 0 makes every new hub with its comms (ra__comm_create_threads: registered, of the parent's
 * memory and device) and hands each rank its two through the parent hub: one allreduce carries
 * the address of what it made, or its failure. That allreduce ends alike on every rank (its
 * barrier passes for all or for none, comm/threads.c), so the new comms are either every rank's
 * or, after a failure, rank 0's to destroy before any rank saw them.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/error.h"
#include "comm/comm.h"
#include "comm/threads_hub.h"

#define FN "ringattn comm threads: split"

/* Rank 0's new comms, for every rank: rank r takes comms[r] (its group's) and comms[size + r]
   (its ring's); the last rank to take its own frees the table. */
typedef struct made {
    _Atomic int readers;
    ringattn_comm_t comms[]; /* [2 size] */
} made;

static void made_free(made *m, int size)
{
    for (int i = 0; i < 2 * size; ++i) ra__comm_destroy(m->comms[i]); /* NULL: not made */
    free(m);
}

/* Every new hub: size / group groups of `group` consecutive ranks, then `group` rings of the
   size / group ranks at one place in every group. */
static ringattn_status_t make_all(ringattn_comm_t c, int group, made **out)
{
    const hub *h = c->impl;
    const int n = c->size, rings = n / group;
    made *m = calloc(1, sizeof *m + 2 * (size_t)n * sizeof m->comms[0]);
    ringattn_comm_t *ring = calloc((size_t)rings, sizeof *ring);
    ringattn_status_t st = m && ring ? RINGATTN_SUCCESS
                                     : ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    for (int g = 0; st == RINGATTN_SUCCESS && g < rings; ++g) /* a group's ranks are consecutive */
        st = ra__comm_create_threads(FN, group, h->dev, h->device, m->comms + (size_t)g * group);
    for (int place = 0; st == RINGATTN_SUCCESS && place < group; ++place) {
        st = ra__comm_create_threads(FN, rings, h->dev, h->device, ring);
        for (int g = 0; st == RINGATTN_SUCCESS && g < rings; ++g)
            m->comms[n + g * group + place] = ring[g];
    }
    free(ring);
    if (st != RINGATTN_SUCCESS) {
        if (m) made_free(m, n);
        return st;
    }
    atomic_init(&m->readers, n);
    *out = m;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__threads_split_grid(ringattn_comm_t c, int group, ringattn_comm_t out[2])
{
    made *m = NULL;
    const ringattn_status_t mine = c->rank == 0 ? make_all(c, group, &m) : RINGATTN_SUCCESS;
    /* a sum: every other rank adds 0 to rank 0's address and status */
    int64_t v[2] = {(int64_t)(intptr_t)m, (int64_t)mine};
    const ringattn_status_t st = c->ops->allreduce_i64(c, v, 2, RA_REDUCE_SUM);
    if (st != RINGATTN_SUCCESS) {
        if (m) made_free(m, c->size); /* no rank got its address */
        return st;
    }
    RA_TRY(mine);
    m = (made *)(intptr_t)v[0];
    RA_CHECK(m != NULL, (ringattn_status_t)v[1],
             FN ": rank %d: rank 0 could not make the new comms (see its message)", c->rank);
    out[0] = m->comms[c->rank];
    out[1] = m->comms[c->size + c->rank];
    if (atomic_fetch_sub(&m->readers, 1) == 1) free(m);
    return RINGATTN_SUCCESS;
}
