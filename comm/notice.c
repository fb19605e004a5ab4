/* The failure notice over UDP (comm/notice.h). */
#define _DEFAULT_SOURCE /* getifaddrs, gethostname */
#include "comm/notice.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x52414e31u /* "RAN1" */
#define TEXT_BYTES 400

struct ra_notice {
    int fd;
    int rank, size;
    uint64_t token;
    ra_notice_addr *peers; /* [size] */
    int sent;
};

/* One datagram: the comm's token, the sender, its reason. */
typedef struct datagram {
    uint32_t magic;
    int32_t from;
    uint64_t token;
    char text[TEXT_BYTES];
} datagram;

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* The host's name, boot id and network namespace: two ranks with the same share a loopback. */
static uint64_t host_hash(void)
{
    char name[256] = {0}, boot[64] = {0}, netns[64] = {0};
    (void)gethostname(name, sizeof name - 1);
    if (readlink("/proc/self/ns/net", netns, sizeof netns - 1) < 0) netns[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
    }
    const uint64_t h = fnv(fnv(0xcbf29ce484222325ull, name, strlen(name)), boot, strlen(boot));
    return fnv(h, netns, strlen(netns));
}

static uint64_t random_nonce(int fd)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const uint64_t parts[] = {(uint64_t)ts.tv_nsec, (uint64_t)ts.tv_sec, (uint64_t)getpid(),
                              (uint64_t)fd, (uint64_t)(uintptr_t)&ts};
    return fnv(0xcbf29ce484222325ull, parts, sizeof parts);
}

static void own_ips(ra_notice_addr *a)
{
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0) return;
    for (struct ifaddrs *i = list; i && a->num_ips < RA_NOTICE_IPS; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
            !(i->ifa_flags & IFF_LOOPBACK))
            a->ip[a->num_ips++] = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
    freeifaddrs(list);
}

ra_notice *ra__notice_open(ra_notice_addr *self)
{
    memset(self, 0, sizeof *self);
    self->host = host_hash();
    ra_notice *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof at;
    if (n->fd < 0 || bind(n->fd, (struct sockaddr *)&at, sizeof at) != 0 ||
        getsockname(n->fd, (struct sockaddr *)&at, &len) != 0) {
        if (n->fd >= 0) close(n->fd);
        free(n);
        return NULL;
    }
    self->port = ntohs(at.sin_port);
    self->nonce = random_nonce(n->fd);
    own_ips(self);
    return n;
}

void ra__notice_connect(ra_notice *n, const ra_notice_addr *all, int size, int rank)
{
    if (!n || n->peers) return;
    n->peers = malloc((size_t)size * sizeof *n->peers);
    if (!n->peers) return;
    memcpy(n->peers, all, (size_t)size * sizeof *n->peers);
    n->rank = rank, n->size = size;
    n->token = 0xcbf29ce484222325ull;
    for (int r = 0; r < size; ++r) n->token = fnv(n->token, &all[r].nonce, sizeof all[r].nonce);
}

static void send_to(int fd, const datagram *d, uint32_t ip, uint16_t port)
{
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
    to.sin_addr.s_addr = ip;
    (void)sendto(fd, d, sizeof *d, MSG_DONTWAIT, (const struct sockaddr *)&to, sizeof to);
}

void ra__notice_send(ra_notice *n, const char *reason)
{
    if (!n || !n->peers || n->sent) return;
    n->sent = 1;
    datagram d = {.magic = MAGIC, .from = n->rank, .token = n->token};
    snprintf(d.text, sizeof d.text, "%s", reason);
    const uint64_t here = n->peers[n->rank].host;
    for (int r = 0; r < n->size; ++r) {
        const ra_notice_addr *p = &n->peers[r];
        if (r == n->rank || p->port == 0) continue;
        if (p->host == here) { /* a peer on this host: its loopback only */
            send_to(n->fd, &d, htonl(INADDR_LOOPBACK), p->port);
            continue;
        }
        for (int i = 0; i < p->num_ips; ++i) send_to(n->fd, &d, p->ip[i], p->port);
    }
}

int ra__notice_poll(ra_notice *n, char *reason, size_t cap)
{
    if (!n || !n->peers) return 0;
    datagram d;
    for (;;) {
        const ssize_t got = recv(n->fd, &d, sizeof d, MSG_DONTWAIT);
        if (got < 0) return 0; /* EAGAIN: nothing (more) */
        if (got != (ssize_t)sizeof d || d.magic != MAGIC || d.token != n->token || d.from < 0 ||
            d.from >= n->size || d.from == n->rank)
            continue; /* not one of this comm's */
        d.text[TEXT_BYTES - 1] = '\0';
        snprintf(reason, cap, "rank %d failed the comm: %s", (int)d.from, d.text);
        return 1;
    }
}

void ra__notice_close(ra_notice *n)
{
    if (!n) return;
    close(n->fd);
    free(n->peers);
    free(n);
}
