/*
 * A failure notice beside a transport that has no way of its own to tell its peers that the
 * comm failed (NCCL: a failed or absent rank is no error to its peers within one node, and a
 * borrowed communicator is never aborted by ringattn). One UDP socket per comm endpoint; the
 * ranks' addresses are gathered once, on the transport's own control plane, and a failing rank
 * sends every peer one datagram with the comm's token and its reason, which the peers' waits
 * poll for (DESIGN: failure semantics). Best effort: where no socket can be made, or a
 * datagram is lost, the peers find out at their deadlines as before. Internal.
 */
#ifndef RINGATTN_COMM_NOTICE_H
#define RINGATTN_COMM_NOTICE_H

#include <stddef.h>
#include <stdint.h>

#define RA_NOTICE_IPS 4

/* Where a rank's notices go: its port and host, and its host's IPv4 addresses (network order). */
typedef struct ra_notice_addr {
    uint64_t host;  /* a hash of the host's name and boot id: peers on it get 127.0.0.1 */
    uint64_t nonce; /* random; the comm's token is a hash of every rank's */
    uint32_t ip[RA_NOTICE_IPS];
    uint16_t port; /* 0: this rank has no socket */
    uint16_t num_ips;
    uint32_t pad;
} ra_notice_addr;

typedef struct ra_notice ra_notice;

/* This rank's socket (NULL where none can be made: no notices then) and its address record. */
ra_notice *ra__notice_open(ra_notice_addr *self);
/* The gathered records of every rank ([size], this rank's at rank): the peers and the token. */
void ra__notice_connect(ra_notice *n, const ra_notice_addr *all, int size, int rank);
/* Tells every peer, without waiting (once: later calls do nothing). */
void ra__notice_send(ra_notice *n, const char *reason);
/* A peer's notice arrived: 1 and its text ("rank r failed the comm: ...") in reason[cap]. */
int ra__notice_poll(ra_notice *n, char *reason, size_t cap);
void ra__notice_close(ra_notice *n);

#endif
