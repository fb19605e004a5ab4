/*
 * NCCL and ringattn's NCCL constructor for bench_ring_cuda's --transport nccl, found by name in
 * the library under test (a CUDA build with RINGATTN_ENABLE_NCCL links libnccl; the emulated
 * library of build/emu exports its fake NCCL), so that the benchmark builds without NCCL's header
 * and runs on every build. The raw NCCL calls time the exchange alone. Header-only; bench/ only.
 */
#ifndef RINGATTN_BENCH_NCCL_BY_NAME_H
#define RINGATTN_BENCH_NCCL_BY_NAME_H

#include <dlfcn.h>
#include <ringattn.h>
#include <stddef.h>

typedef struct {
    char internal[128]; /* ncclUniqueId's layout (NCCL_UNIQUE_ID_BYTES) */
} nccl_id_t;

enum { NCCL_INT8 = 0 }; /* ncclInt8 */

typedef struct {
    int (*get_id)(nccl_id_t *);
    int (*init_rank)(void **, int, nccl_id_t, int);
    int (*destroy)(void *);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*send)(const void *, size_t, int, int, void *, void *);
    int (*recv)(void *, size_t, int, int, void *, void *);
    ringattn_status_t (*create_comm)(const nccl_id_t *, int, int, int, ringattn_comm_t *);
} nccl_t;

/* 1 when every call is found */
static inline int nccl_load(nccl_t *n) {
    *(void **)&n->get_id = dlsym(RTLD_DEFAULT, "ncclGetUniqueId");
    *(void **)&n->init_rank = dlsym(RTLD_DEFAULT, "ncclCommInitRank");
    *(void **)&n->destroy = dlsym(RTLD_DEFAULT, "ncclCommDestroy");
    *(void **)&n->group_start = dlsym(RTLD_DEFAULT, "ncclGroupStart");
    *(void **)&n->group_end = dlsym(RTLD_DEFAULT, "ncclGroupEnd");
    *(void **)&n->send = dlsym(RTLD_DEFAULT, "ncclSend");
    *(void **)&n->recv = dlsym(RTLD_DEFAULT, "ncclRecv");
    *(void **)&n->create_comm = dlsym(RTLD_DEFAULT, "ringattn_comm_create_nccl_id");
    return n->get_id && n->init_rank && n->destroy && n->group_start && n->group_end && n->send &&
           n->recv && n->create_comm;
}

#endif
