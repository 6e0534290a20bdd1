/* The saturated FIFO-link pipeline's period: pipeline.py's `_fifo_period` and `_fifo_step` in C.

   The same event loop, statement for statement: the same comparisons and the same double
   additions and subtractions in the same order (there is no multiplication to fuse), so the
   period is the same double as the Python loop's (tests/test_pipeline_sim.py compares them on
   many pipelines). The partition's refinement simulates tens of thousands of candidates, and
   this loop is nearly all of its time.

   n stages; stage k has nph[k] phases, phase j's work (tpu, link, host) in seconds at
   work[3 * (first[k] + j) + 0..2], first[k] = nph[0] + ... + nph[k-1]. Returns the period, or
   -1.0 where the Python loop would not end normally (a stage without phases, nothing left to
   move): the caller then runs the Python loop, which raises as it always did. */

#include <math.h>
#include <stdlib.h>

#define EPS 1e-15

typedef struct {
    int n, F, queue_size, fed, n_done;
    long long counter;
    const int *nph, *first;
    const double *work;
    int *held, *phase, *queue;
    long long *tick;
    double *lt, *ll, *lh, *done;
} Sim;

static void load_phase(Sim *s, int k) {
    const double *w = s->work + 3 * (s->first[k] + s->phase[k]);
    s->lt[k] = w[0];
    s->ll[k] = w[1];
    s->lh[k] = w[2];
}

static int start(Sim *s, int k) {
    if (k == 0) {
        if (s->fed >= s->F && s->n_done >= s->F)
            return 0;
        s->fed += 1;
    } else if (s->queue[k]) {
        s->queue[k] -= 1;
    } else {
        return 0;
    }
    s->held[k] = 1;
    s->phase[k] = 0;
    s->counter += 1;
    s->tick[k] = s->counter;
    load_phase(s, k);
    return 1;
}

/* _Engine.settle: finishes and starts until nothing changes, the last stage first.
   Returns 0 when the done list would overflow (cannot happen: one completion per settle). */
static int settle(Sim *s, double now, int cap) {
    int changed = 1;
    while (changed) {
        changed = 0;
        for (int k = s->n - 1; k >= 0; k--) {
            if (s->held[k]) {
                if (s->phase[k] < s->nph[k] && s->lt[k] == 0.0 && s->ll[k] == 0.0 && s->lh[k] == 0.0) {
                    s->phase[k] += 1;
                    s->counter += 1;
                    s->tick[k] = s->counter;
                    if (s->phase[k] < s->nph[k])
                        load_phase(s, k);
                    changed = 1;
                }
                if (s->phase[k] >= s->nph[k]) {
                    int moved = 1;
                    if (k == s->n - 1) {
                        if (s->n_done >= cap)
                            return 0;
                        s->done[s->n_done++] = now;
                    } else if (s->queue[k + 1] < s->queue_size) {
                        s->queue[k + 1] += 1;
                    } else {
                        moved = 0;
                    }
                    if (!moved)
                        continue;  /* as the Python loop's `continue`: no start for this stage */
                    s->held[k] = 0;
                    s->phase[k] = -1;
                    changed = 1;
                }
            }
            if (!s->held[k] && (k == 0 || s->queue[k]) && start(s, k))
                changed = 1;
        }
    }
    return 1;
}

/* _fifo_step: the time to the next event, every demand served for it; 0 when nothing is active. */
static int step(Sim *s, double *dt_out) {
    int head = -1, active = 0;
    double dt = INFINITY;
    for (int k = 0; k < s->n; k++) {
        if (s->held[k] && s->phase[k] < s->nph[k]) {
            active = 1;
            if (s->ll[k] > 0.0 && (head < 0 || s->tick[k] < s->tick[head]))
                head = k;
            if (0.0 < s->lt[k] && s->lt[k] < dt)
                dt = s->lt[k];
            if (0.0 < s->lh[k] && s->lh[k] < dt)
                dt = s->lh[k];
        }
    }
    if (!active)
        return 0;
    if (head >= 0 && s->ll[head] < dt)
        dt = s->ll[head];
    for (int k = 0; k < s->n; k++) {
        if (s->held[k] && s->phase[k] < s->nph[k]) {
            if (s->lt[k] > 0.0) {
                s->lt[k] -= dt;
                if (s->lt[k] <= EPS)
                    s->lt[k] = 0.0;
            }
            if (s->lh[k] > 0.0) {
                s->lh[k] -= dt;
                if (s->lh[k] <= EPS)
                    s->lh[k] = 0.0;
            }
            if (s->ll[k] > 0.0) {
                if (k == head)
                    s->ll[k] -= dt;
                if (s->ll[k] <= EPS)
                    s->ll[k] = 0.0;
            }
        }
    }
    *dt_out = dt;
    return 1;
}

double fifo_period(int n, const int *nph, const double *work, int F, int queue_size) {
    if (n < 1 || F < 2)
        return -1.0;
    for (int k = 0; k < n; k++)
        if (nph[k] < 1)
            return -1.0;
    int cap = F + 1;
    int *ints = calloc((size_t)(5 * n + 2), sizeof(int));
    long long *tick = calloc((size_t)n, sizeof(long long));
    double *dbl = calloc((size_t)(3 * n + cap), sizeof(double));
    double result = -1.0;
    if (!ints || !tick || !dbl)
        goto out;
    Sim s = {0};
    s.n = n;
    s.F = F;
    s.queue_size = queue_size;
    s.nph = nph;
    s.work = work;
    s.held = ints;
    s.phase = ints + n;
    s.queue = ints + 2 * n;              /* n + 1 entries */
    int *first = ints + 3 * n + 1;       /* n entries */
    s.first = first;
    s.tick = tick;
    s.lt = dbl;
    s.ll = dbl + n;
    s.lh = dbl + 2 * n;
    s.done = dbl + 3 * n;
    for (int k = 0, at = 0; k < n; k++) {
        first[k] = at;
        at += nph[k];
        s.phase[k] = -1;
    }
    for (int k = 0; k < n; k++)
        start(&s, k);
    double now = 0.0;
    while (s.n_done < F) {
        if (!settle(&s, now, cap))
            goto out;
        double dt;
        if (!step(&s, &dt))
            break;
        now += dt;
    }
    if (s.n_done >= F) {
        int half = F / 2;
        result = (s.done[F - 1] - s.done[half - 1]) / (double)(F - half);
    }
out:
    free(ints);
    free(tick);
    free(dbl);
    return result;
}
