/* Schedule actions and transitions (torch.profiler.schedule semantics). */
#include "schedule.h"

GpStatus
gp_schedule_check(const GpSchedule *s)
{
    if (s->wait < 0 || s->warmup < 0 || s->active < 1 || s->repeat < 0 || s->skip_first < 0 ||
        s->skip_first_wait < 0)
        return GP_ERR_VALUE;
    return GP_OK;
}

GpAction
gp_schedule_action(const GpSchedule *s, int64_t step)
{
    if (step < s->skip_first)
        return GP_ACT_NONE;
    step -= s->skip_first;
    if (s->skip_first_wait != 0)
        step += s->wait; /* the first cycle starts without its wait */
    int64_t cycle = s->wait + s->warmup + s->active;
    if (s->repeat > 0 && step >= s->repeat * cycle)
        return GP_ACT_NONE;
    int64_t mod = step % cycle;
    if (mod < s->wait)
        return GP_ACT_NONE;
    if (mod < s->wait + s->warmup)
        return GP_ACT_WARMUP;
    return mod < cycle - 1 ? GP_ACT_RECORD : GP_ACT_RECORD_AND_SAVE;
}

unsigned
gp_schedule_transition(GpAction prev, GpAction cur)
{
    int recording = prev == GP_ACT_RECORD || prev == GP_ACT_RECORD_AND_SAVE;
    switch (cur) {
    case GP_ACT_EXIT:
        if (recording)
            return GP_TR_STOP | GP_TR_READY;
        return prev == GP_ACT_WARMUP ? GP_TR_DISCARD : 0;
    case GP_ACT_NONE:
        if (prev == GP_ACT_RECORD_AND_SAVE)
            return GP_TR_STOP | GP_TR_READY;
        if (prev == GP_ACT_RECORD)
            return GP_TR_STOP | GP_TR_WARN;
        if (prev == GP_ACT_WARMUP)
            return GP_TR_DISCARD | GP_TR_WARN;
        return 0;
    case GP_ACT_WARMUP:
        if (prev == GP_ACT_RECORD_AND_SAVE)
            return GP_TR_STOP | GP_TR_READY | GP_TR_PREPARE;
        if (prev == GP_ACT_RECORD)
            return GP_TR_STOP | GP_TR_WARN | GP_TR_PREPARE;
        return prev == GP_ACT_NONE ? GP_TR_PREPARE : 0;
    case GP_ACT_RECORD:
    case GP_ACT_RECORD_AND_SAVE:
        if (prev == GP_ACT_RECORD_AND_SAVE)
            return GP_TR_STOP | GP_TR_READY | GP_TR_PREPARE | GP_TR_START;
        if (prev == GP_ACT_RECORD)
            return 0;
        if (prev == GP_ACT_WARMUP)
            return GP_TR_START;
        return GP_TR_PREPARE | GP_TR_START;
    default:
        return 0;
    }
}
