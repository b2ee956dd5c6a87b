/* The wait/warmup/active/repeat schedule and the transitions between its
 * actions, with torch.profiler's semantics. Pure C. */
#ifndef GPUPROF_CSRC_SCHEDULE_H
#define GPUPROF_CSRC_SCHEDULE_H

#include <stdint.h>

#include "common.h"

typedef enum GpAction {
    GP_ACT_NONE = 0,
    GP_ACT_WARMUP = 1,
    GP_ACT_RECORD = 2,
    GP_ACT_RECORD_AND_SAVE = 3,
    GP_ACT_EXIT = 4, /* the profiler stops: "None" in torch's transition table */
} GpAction;

typedef struct GpSchedule {
    int64_t wait, warmup, active, repeat, skip_first, skip_first_wait;
} GpSchedule;

/* GP_OK, or GP_ERR_VALUE when a field is negative or active < 1. */
GpStatus gp_schedule_check(const GpSchedule *s);

/* The action for step `step` (>= 0). */
GpAction gp_schedule_action(const GpSchedule *s, int64_t step);

/* What to do when the action changes from prev to cur, as bits, applied in
 * the order of the bit values below. */
enum {
    GP_TR_STOP = 1,    /* close the recorded window and aggregate it */
    GP_TR_READY = 2,   /* call on_trace_ready */
    GP_TR_DISCARD = 4, /* drop a warm-up that no recording followed */
    GP_TR_PREPARE = 8, /* arm capture, events discarded (warm-up) */
    GP_TR_START = 16,  /* begin a recorded window */
    GP_TR_WARN = 32,   /* the schedule went from recording/warm-up to nothing */
};
unsigned gp_schedule_transition(GpAction prev, GpAction cur);

#endif /* GPUPROF_CSRC_SCHEDULE_H */
