/* The release as "major.minor.patch", from ringattn.h's numbers. Internal. */
#ifndef RINGATTN_BASE_VERSION_H
#define RINGATTN_BASE_VERSION_H

#include "ringattn.h"

#define RA_STR2_(x) #x
#define RA_STR_(x) RA_STR2_(x)
#define RA_VERSION_STRING                                                    \
    RA_STR_(RINGATTN_VERSION_MAJOR) "." RA_STR_(RINGATTN_VERSION_MINOR) "." \
        RA_STR_(RINGATTN_VERSION_PATCH)

#endif
