/*
 * tools/info.h: what ringattn-info's files share. ringattn_info.c: flags, plans, main;
 * info_system.c: the CPU, BLAS and GPU lines; info_model.c: the link model's lines and table
 * (the model itself: link_model.h, shared with bench_ring --ulysses).
 */
#ifndef RINGATTN_TOOLS_INFO_H
#define RINGATTN_TOOLS_INFO_H

#include <ringattn.h>

#include "link_model.h"

/* The CPU's model and instruction sets, the BLAS and its kernels (info_system.c). */
void info_print_cpu(void);
/* The visible GPUs through the CUDA driver, if it is installed. */
void info_print_gpus(void);

/* The model's estimate for one rank's plan of desc (info: ringattn_plan_get_info's), a line
   under that rank (info_model.c). */
void info_model_rank(const lm_params_t *m, const ringattn_plan_desc_t *desc,
                     const ringattn_plan_info_t *info);
/* The model's table: one row per P_u that P, H and H_kv allow, each from the plan of `rank`
   (-1: every rank, the slowest kept) of a simulated world of P; csv: comma separated. 0, or 2
   when no row could be made (the library's message printed). */
int info_model_table(const lm_params_t *m, const ringattn_plan_desc_t *desc, int P, int rank,
                     int csv);

#endif
