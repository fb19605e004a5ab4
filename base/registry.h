/*
 * The handles (plans, comms) this library has made and not yet destroyed, so that a destroyed
 * or made-up handle is an INVALID_USAGE error rather than a use after free. Thread-safe.
 */
#ifndef RINGATTN_BASE_REGISTRY_H
#define RINGATTN_BASE_REGISTRY_H

/* 0 on success, -1 when out of memory. */
int ra__registry_add(const void *handle);
/* 1 if handle was live (and is now removed), else 0. */
int ra__registry_remove(const void *handle);
int ra__registry_contains(const void *handle);

#endif
