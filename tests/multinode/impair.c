/*
 * impair: an impaired wire between two network interfaces, for the multinode tests.
 *
 *   impair IF_A IF_B DELAY_MS LOSS_PERCENT SEED
 *
 * Bridges IF_A and IF_B at layer 2 with AF_PACKET sockets: every frame that arrives on one is
 * held for DELAY_MS and sent out of the other, unless a seeded pseudo-random draw drops it
 * (LOSS_PERCENT of the frames, each direction on its own). The kernel here has no sch_netem
 * and no iptables, and this needs neither. Runs until SIGTERM/SIGINT, then prints what it
 * forwarded and dropped on stderr. Needs CAP_NET_RAW (root) in the namespace holding both ends.
 *
 * Why PACKET_VNET_HDR: the sending host's veth offloads checksums (and may hand over GSO
 * frames); a raw frame re-sent without that information would arrive with a wrong TCP
 * checksum and be dropped. With the virtio header the kernel hands us the checksum/GSO state
 * and takes it back on send, so the frame leaves exactly as it came in.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_FRAME (sizeof(struct virtio_net_hdr) + 65536 + 64)
/* Frames held per direction at most: 100 ms of a fast link fits; beyond it we tail-drop, as a
   router's queue would, rather than grow without bound. */
#define MAX_HELD_BYTES (256u << 20)

typedef struct frame {
    struct frame *next;
    int64_t due_ns;
    size_t len;
    unsigned char data[];
} frame_t;

typedef struct {
    int in, out;                  /* receive on in, send on out */
    frame_t *head, *tail;         /* FIFO: a constant delay keeps the order */
    size_t held;
    uint64_t rng;                 /* xorshift64* state, seeded per direction */
    uint64_t frames, bytes, dropped, overflow, send_errors;
} direction_t;

static volatile sig_atomic_t stop_;

static void on_signal(int sig) { (void)sig; stop_ = 1; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double uniform01(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return (double)((*s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

static int open_port(const char *ifname) {
    const int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (fd < 0) return perror("impair: socket(AF_PACKET)"), -1;
    const int one = 1, big = 64 << 20;
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0)
        return perror("impair: PACKET_VNET_HDR"), -1;
    /* bursts of a TCP window must not overflow the socket while we are busy sending */
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big) < 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    struct sockaddr_ll sll = {0};
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETH_P_ALL);
    sll.sll_ifindex = (int)if_nametoindex(ifname);
    if (!sll.sll_ifindex) return fprintf(stderr, "impair: no interface %s\n", ifname), -1;
    if (bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0) return perror("impair: bind"), -1;
    return fd;
}

/* Reads every frame waiting on d->in; queues or drops each. */
static void receive(direction_t *d, int64_t delay_ns, double loss) {
    unsigned char buf[MAX_FRAME];
    for (;;) {
        struct sockaddr_ll from;
        socklen_t fl = sizeof from;
        const ssize_t n =
            recvfrom(d->in, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
        if (n < 0) return; /* EAGAIN: drained (other errors: try again at the next poll) */
        if (from.sll_pkttype == PACKET_OUTGOING) continue; /* our own sends on this port */
        if ((size_t)n <= sizeof(struct virtio_net_hdr)) continue;
        if (loss > 0 && uniform01(&d->rng) < loss) { ++d->dropped; continue; }
        if (d->held + (size_t)n > MAX_HELD_BYTES) { ++d->overflow; continue; }
        frame_t *f = malloc(sizeof *f + (size_t)n);
        if (!f) { ++d->overflow; continue; }
        struct virtio_net_hdr *vh = (struct virtio_net_hdr *)buf;
        vh->flags &= VIRTIO_NET_HDR_F_NEEDS_CSUM; /* DATA_VALID is a receive-side flag only */
        memcpy(f->data, buf, (size_t)n);
        f->len = (size_t)n, f->next = NULL, f->due_ns = now_ns() + delay_ns;
        if (d->tail) d->tail->next = f; else d->head = f;
        d->tail = f, d->held += (size_t)n;
    }
}

/* Sends the frames whose time has come; returns ns until the next one is due (-1: none). */
static int64_t release(direction_t *d) {
    const int64_t now = now_ns();
    while (d->head && d->head->due_ns <= now) {
        frame_t *f = d->head;
        if (send(d->out, f->data, f->len, 0) < 0) ++d->send_errors; /* a lost frame, as on a wire */
        else ++d->frames, d->bytes += f->len - sizeof(struct virtio_net_hdr);
        d->head = f->next;
        if (!d->head) d->tail = NULL;
        d->held -= f->len;
        free(f);
    }
    return d->head ? d->head->due_ns - now : -1;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s IF_A IF_B DELAY_MS LOSS_PERCENT SEED\n", argv[0]);
        return 2;
    }
    const int64_t delay_ns = (int64_t)(atof(argv[3]) * 1e6);
    const double loss = atof(argv[4]) / 100.0;
    const uint64_t seed = strtoull(argv[5], NULL, 10);
    const int a = open_port(argv[1]), b = open_port(argv[2]);
    if (a < 0 || b < 0) return 1;
    direction_t dir[2] = {{.in = a, .out = b, .rng = seed * 2 + 1},
                          {.in = b, .out = a, .rng = seed * 2 + 2}};
    for (int i = 0; i < 2; ++i) for (int k = 0; k < 8; ++k) uniform01(&dir[i].rng);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    fprintf(stderr, "impair: %s <-> %s, delay %s ms each way, loss %s%% each way, seed %llu\n",
            argv[1], argv[2], argv[3], argv[4], (unsigned long long)seed);
    while (!stop_) {
        int64_t next = -1;
        for (int i = 0; i < 2; ++i) {
            const int64_t w = release(&dir[i]);
            if (w >= 0 && (next < 0 || w < next)) next = w;
        }
        struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        /* round the wait up to whole ms so a frame is never released early */
        const int timeout_ms = next < 0 ? 200 : (int)((next + 999999) / 1000000);
        if (poll(p, 2, timeout_ms) < 0 && errno != EINTR) return perror("impair: poll"), 1;
        if (p[0].revents & POLLIN) receive(&dir[0], delay_ns, loss);
        if (p[1].revents & POLLIN) receive(&dir[1], delay_ns, loss);
    }
    for (int i = 0; i < 2; ++i) {
        const direction_t *d = &dir[i];
        fprintf(stderr, "impair: %s -> %s: %llu frames (%llu bytes) forwarded, %llu dropped "
                "(loss), %llu dropped (queue full), %llu send errors\n",
                argv[1 + i], argv[2 - i], (unsigned long long)d->frames,
                (unsigned long long)d->bytes,
                (unsigned long long)d->dropped, (unsigned long long)d->overflow,
                (unsigned long long)d->send_errors);
    }
    return 0;
}
