/* The plan kinds of the composition root (api/kinds.c): the descriptor picks one. Internal. */
#ifndef RINGATTN_API_KINDS_H
#define RINGATTN_API_KINDS_H

#include "plan/kind.h"

extern const ra_plan_kinds ra__plan_kinds;

#endif
