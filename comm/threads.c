/*
 * The "threads" transport: N ranks as threads of one process (fast ring tests without mpirun,
 * and in-process users). Messages are matched like MPI's (source, tag, FIFO) and copied straight
 * from the sender's buffer, which the sender keeps until its wait returns. Every wait has a
 * deadline (RINGATTN_COMM_TIMEOUT seconds, default 60): a rank that never answers is an error,
 * not a hang.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "base/error.h"
#include "base/registry.h"

typedef struct post {
    int src, dst, tag, consumed;
    const void *buf;
    size_t bytes;
    struct post *next;
} post;

typedef struct hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size, refs;
    post *posts;
    int arrived;
    unsigned generation;
    int64_t acc[RA_ALLREDUCE_MAX], result[RA_ALLREDUCE_MAX];
} hub;

static struct timespec deadline(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)ra__comm_timeout_s();
    return ts;
}

static ringattn_status_t th_start(ringattn_comm_t c, const void *sendbuf, size_t send_bytes,
                                  int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                                  ra_request *req)
{
    hub *h = c->impl;
    post *p = NULL;
    if (send_bytes) {
        p = calloc(1, sizeof *p);
        RA_CHECK(p != NULL, RINGATTN_ERR_OUT_OF_MEMORY, "ringattn comm threads: out of memory");
        *p = (post){c->rank, dst, tag, 0, sendbuf, send_bytes, NULL};
        pthread_mutex_lock(&h->mu);
        post **tail = &h->posts;
        while (*tail) tail = &(*tail)->next;
        *tail = p; /* appended: FIFO per (source, destination, tag) */
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
    req->ptr[0] = p;
    req->ptr[1] = recv_bytes ? recvbuf : NULL;
    req->val[0] = (int64_t)recv_bytes;
    req->val[1] = src;
    req->val[2] = tag;
    return RINGATTN_SUCCESS;
}

static void unlink_post(hub *h, post *p)
{
    for (post **pp = &h->posts; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    free(p);
}

/* One matching attempt, lock held. Returns 1 when the request is complete. */
static int progress_locked(ringattn_comm_t c, hub *h, ra_request *req, ringattn_status_t *st)
{
    if (req->ptr[1]) {
        for (post *p = h->posts; p; p = p->next) {
            if (p->consumed || p->dst != c->rank || p->src != req->val[1] || p->tag != req->val[2])
                continue;
            if (p->bytes != (size_t)req->val[0])
                *st = ra__fail(RINGATTN_ERR_COMM,
                               "ringattn comm threads: message from rank %d: got %zu bytes, "
                               "expected %lld",
                               p->src, p->bytes, (long long)req->val[0]);
            else memcpy(req->ptr[1], p->buf, p->bytes);
            p->consumed = 1;
            req->ptr[1] = NULL;
            pthread_cond_broadcast(&h->cv);
            break;
        }
    }
    post *mine = req->ptr[0];
    if (mine && mine->consumed) {
        unlink_post(h, mine);
        req->ptr[0] = NULL;
    }
    return req->ptr[0] == NULL && req->ptr[1] == NULL;
}

static ringattn_status_t th_test(ringattn_comm_t c, ra_request *req, int *done)
{
    hub *h = c->impl;
    ringattn_status_t st = RINGATTN_SUCCESS;
    pthread_mutex_lock(&h->mu);
    *done = progress_locked(c, h, req, &st);
    pthread_mutex_unlock(&h->mu);
    return st;
}

static ringattn_status_t th_wait(ringattn_comm_t c, ra_request *req)
{
    hub *h = c->impl;
    ringattn_status_t st = RINGATTN_SUCCESS;
    const struct timespec until = deadline();
    pthread_mutex_lock(&h->mu);
    while (!progress_locked(c, h, req, &st)) {
        if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT) {
            if (req->ptr[0]) unlink_post(h, req->ptr[0]); /* the sender's buffer goes away */
            req->ptr[0] = req->ptr[1] = NULL;
            st = ra__fail(RINGATTN_ERR_COMM,
                          "ringattn comm threads: rank %d: timed out waiting for rank %lld",
                          c->rank, (long long)req->val[1]);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

static void combine(int64_t *acc, const int64_t *v, int n, ra_reduce_op op)
{
    for (int i = 0; i < n; ++i) {
        if (op == RA_REDUCE_SUM) acc[i] += v[i];
        else if (op == RA_REDUCE_MIN) acc[i] = v[i] < acc[i] ? v[i] : acc[i];
        else acc[i] = v[i] > acc[i] ? v[i] : acc[i];
    }
}

static ringattn_status_t th_allreduce(ringattn_comm_t c, int64_t *vals, int n, ra_reduce_op op)
{
    hub *h = c->impl;
    RA_CHECK(n >= 0 && n <= RA_ALLREDUCE_MAX, RINGATTN_ERR_INTERNAL,
             "ringattn comm threads: allreduce of %d values, expected <= %d", n, RA_ALLREDUCE_MAX);
    ringattn_status_t st = RINGATTN_SUCCESS;
    const struct timespec until = deadline();
    pthread_mutex_lock(&h->mu);
    if (h->arrived == 0) memcpy(h->acc, vals, (size_t)n * sizeof *vals);
    else combine(h->acc, vals, n, op);
    if (++h->arrived == h->size) {
        memcpy(h->result, h->acc, (size_t)n * sizeof *vals);
        h->arrived = 0;
        ++h->generation;
        pthread_cond_broadcast(&h->cv);
    } else {
        const unsigned gen = h->generation;
        while (gen == h->generation && st == RINGATTN_SUCCESS)
            if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT)
                st = ra__fail(RINGATTN_ERR_COMM,
                              "ringattn comm threads: rank %d: allreduce timed out", c->rank);
    }
    if (st == RINGATTN_SUCCESS) memcpy(vals, h->result, (size_t)n * sizeof *vals);
    pthread_mutex_unlock(&h->mu);
    return st;
}

static void th_destroy(ringattn_comm_t c)
{
    hub *h = c->impl;
    pthread_mutex_lock(&h->mu);
    const int last = --h->refs == 0;
    pthread_mutex_unlock(&h->mu);
    if (last) {
        while (h->posts) unlink_post(h, h->posts);
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
        free(h);
    }
    free(c);
}

static const struct ra_comm_ops threads_ops = {
    .name = "threads",
    .sendrecv_start = th_start,
    .test = th_test,
    .wait = th_wait,
    .allreduce_i64 = th_allreduce,
    .destroy = th_destroy,
};

ringattn_status_t ringattn_comm_create_threads(int num_ranks, ringattn_comm_t *comms)
{
    static const char fn[] = "ringattn_comm_create_threads";
    RA_CHECK(comms != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: comms: got NULL, expected an array of num_ranks handles", fn);
    RA_CHECK(num_ranks >= 1 && num_ranks <= 4096, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: num_ranks: got %d, expected 1..4096", fn, num_ranks);
    hub *h = calloc(1, sizeof *h);
    ringattn_comm_t *made = calloc((size_t)num_ranks, sizeof *made);
    int ok = h && made;
    for (int r = 0; ok && r < num_ranks; ++r) ok = (made[r] = calloc(1, sizeof *made[r])) != NULL;
    for (int r = 0; ok && r < num_ranks; ++r) ok = ra__registry_add(made[r]) == 0;
    if (!ok) {
        for (int r = 0; made && r < num_ranks; ++r) {
            ra__registry_remove(made[r]);
            free(made[r]);
        }
        free(made);
        free(h);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->size = h->refs = num_ranks;
    for (int r = 0; r < num_ranks; ++r) {
        *made[r] = (struct ringattn_comm){&threads_ops, r, num_ranks, h};
        comms[r] = made[r];
    }
    free(made);
    return RINGATTN_SUCCESS;
}
