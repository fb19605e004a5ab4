/* A mutex-guarded set of live handle addresses (see registry.h). */
#include <pthread.h>
#include <stdlib.h>

#include "base/registry.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const void **live;
static size_t count, capacity;

int ra__registry_add(const void *handle)
{
    int rc = 0;
    pthread_mutex_lock(&lock);
    if (count == capacity) {
        const size_t cap = capacity ? 2 * capacity : 16;
        const void **grown = realloc(live, cap * sizeof *grown);
        if (grown) {
            live = grown;
            capacity = cap;
        }
    }
    if (count < capacity) live[count++] = handle;
    else rc = -1;
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Index of handle, or count when absent; call with the lock held. */
static size_t find(const void *handle)
{
    size_t i = 0;
    while (i < count && live[i] != handle) ++i;
    return i;
}

int ra__registry_remove(const void *handle)
{
    pthread_mutex_lock(&lock);
    const size_t i = find(handle);
    const int found = i < count;
    if (found) live[i] = live[--count];
    pthread_mutex_unlock(&lock);
    return found;
}

int ra__registry_contains(const void *handle)
{
    pthread_mutex_lock(&lock);
    const int found = find(handle) < count;
    pthread_mutex_unlock(&lock);
    return found;
}
