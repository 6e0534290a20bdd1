/* Exact search over canonical arena placements: the same algorithm as `_Search` in planners.py
 * (itself in the style of MiniMalloc, Moffitt, ASPLOS 2023), in C for speed. Compiled on first
 * use by tpu_pipeline/toolchain/memory/native_search.py; when no C compiler is available the Python version runs.
 *
 * Buffers occupy section ranges [lo, hi) (sections = time cut at every start and end). A buffer is
 * placed only at its minimum offset (the top of the placed buffers it overlaps), buffers in
 * non-decreasing offset order (ties by a static preorder). Pruning: a section's floor (raised to
 * the lowest minimum offset of its unplaced buffers) plus its unplaced bytes must fit; no buffer
 * is placed at or above the lowest top any unplaced buffer could reach (dominance); the problem
 * splits in time where no unplaced buffer crosses.
 *
 * Returns 1 (found: offsets in out), 0 (proven infeasible), -1 (time limit).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef long long i64;

typedef struct {
    int n, n_sec;
    const int *lo, *hi;           /* section range of each buffer */
    const i64 *size, *width;
    const int *sec_start, *sec_members; /* CSR: buffers of each section */
    const int *ov_start, *ov_list;      /* CSR: overlapping buffers */
    i64 cap;
    i64 *offset, *min_off, *solution;
    i64 *floor_, *total;
    int *cuts;
    int *members;  /* per section, its unplaced buffers first: members[sec_start[k] .. + cnt[k]) */
    int *cnt;
    int *pos;      /* pos[k * n + b]: slot of buffer b within section k's segment */
    i64 nodes, nodes_left;
    double deadline;
    int aborted;
    const char *heuristic;
} S;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static i64 sec_total_max(S *s, int b) {
    i64 m = 0;
    for (int k = s->lo[b]; k < s->hi[b]; k++) if (s->total[k] > m) m = s->total[k];
    return m;
}

static i64 key_value(S *s, int b, char c) {
    switch (c) {
        case 'W': return s->width[b];
        case 'A': return s->width[b] * s->size[b];
        case 'T': return sec_total_max(s, b);
        case 'Z': return s->size[b];
    }
    return 0;
}

typedef struct { i64 k[3]; int b; } PreKey;

static int cmp_pre(const void *pa, const void *pb) {
    const PreKey *a = pa, *b = pb;
    for (int i = 0; i < 3; i++) {
        if (a->k[i] != b->k[i]) return a->k[i] > b->k[i] ? -1 : 1; /* descending */
    }
    return (a->b > b->b) - (a->b < b->b);
}

typedef struct { i64 off; int p; int b; } Ord;

static int cmp_ord(const void *pa, const void *pb) {
    const Ord *a = pa, *b = pb;
    if (a->off != b->off) return a->off < b->off ? -1 : 1;
    return (a->p > b->p) - (a->p < b->p);
}

static int search(S *s, const int *pre, int npre, int lo, int hi, i64 min_offset, int min_pre,
                  const void *parent, int nparent);

static int sub_solve(S *s, const int *bufs, int nb, int lo, int hi) {
    PreKey *keys = malloc(sizeof(PreKey) * (nb ? nb : 1));
    for (int i = 0; i < nb; i++) {
        keys[i].b = bufs[i];
        for (int j = 0; j < 3; j++) keys[i].k[j] = key_value(s, bufs[i], s->heuristic[j]);
    }
    qsort(keys, nb, sizeof(PreKey), cmp_pre);
    int *pre = malloc(sizeof(int) * (nb ? nb : 1));
    for (int i = 0; i < nb; i++) pre[i] = keys[i].b;
    free(keys);
    int r = search(s, pre, nb, lo, hi, 0, 0, NULL, 0);
    free(pre);
    return r;
}

static int decompose(S *s, const int *pre, int npre, int lo, int hi, i64 o, int p, int b,
                     const void *ord, int nord) {
    s->solution[b] = o;
    int *points = malloc(sizeof(int) * (s->hi[b] - s->lo[b] + 3));
    int np = 0;
    points[np++] = lo;
    for (int k = s->lo[b]; k < s->hi[b] - 1; k++) {
        if (--s->cuts[k] == 0) points[np++] = k + 1;
    }
    int r;
    if (np == 1) {
        r = search(s, pre, npre, lo, hi, o, p, ord, nord);
    } else {
        points[np++] = hi;
        r = 1;
        int *bufs = malloc(sizeof(int) * (npre ? npre : 1));
        for (int c = 1; c < np && r == 1; c++) {
            int a = points[c - 1], z = points[c], nb = 0;
            for (int i = 0; i < npre; i++) {
                int x = pre[i];
                if (s->offset[x] < 0 && s->lo[x] < z && a < s->hi[x]) bufs[nb++] = x;
            }
            if (nb) r = sub_solve(s, bufs, nb, a, z);
        }
        free(bufs);
    }
    for (int k = s->lo[b]; k < s->hi[b] - 1; k++) s->cuts[k]++;
    free(points);
    return r;
}

static int search(S *s, const int *pre, int npre, int lo, int hi, i64 min_offset, int min_pre,
                  const void *parent_, int nparent) {
    s->nodes++;
    if (--s->nodes_left < 0) return -2; /* node budget spent */
    if ((s->nodes & 15) == 0 && now() > s->deadline) return -1;
    const Ord *parent = parent_;
    Ord *ord = malloc(sizeof(Ord) * (npre ? npre : 1));
    int no = 0;
    if (parent) { /* the parent's sorted order, minus placed buffers, offsets refreshed */
        for (int i = 0; i < nparent; i++) {
            int b = parent[i].b;
            if (s->offset[b] < 0) { ord[no] = parent[i]; ord[no].off = s->min_off[b]; no++; }
        }
    } else {
        for (int p = 0; p < npre; p++) {
            int b = pre[p];
            if (s->offset[b] < 0) { ord[no].off = s->min_off[b]; ord[no].p = p; ord[no].b = b; no++; }
        }
    }
    if (no == 0) {
        for (int p = 0; p < npre; p++) s->solution[pre[p]] = s->offset[pre[p]];
        free(ord);
        return 1;
    }
    /* insertion sort: offsets only grow, so the parent's order is nearly sorted */
    for (int i = 1; i < no; i++) {
        Ord x = ord[i];
        int j = i - 1;
        while (j >= 0 && cmp_ord(&ord[j], &x) > 0) { ord[j + 1] = ord[j]; j--; }
        ord[j + 1] = x;
    }
    i64 min_height = ord[0].off + s->size[ord[0].b];
    for (int i = 1; i < no; i++) {
        i64 h = ord[i].off + s->size[ord[i].b];
        if (h < min_height) min_height = h;
    }
    int result = 0;
    /* scratch for undo records */
    int maxdeg = 0;
    for (int i = 0; i < no; i++) {
        int d = s->ov_start[ord[i].b + 1] - s->ov_start[ord[i].b];
        if (d > maxdeg) maxdeg = d;
    }
    int *ch_b = malloc(sizeof(int) * (maxdeg + 1));
    i64 *ch_v = malloc(sizeof(i64) * (maxdeg + 1));
    int *fl_s = malloc(sizeof(int) * (2 * s->n_sec + 1));
    i64 *fl_v = malloc(sizeof(i64) * (2 * s->n_sec + 1));
    for (int i = 0; i < no; i++) {
        i64 o = ord[i].off;
        int p = ord[i].p, b = ord[i].b;
        if (o >= min_height) break;
        if (o < min_offset || (o == min_offset && p < min_pre)) continue;
        i64 height = o + s->size[b];
        if (height > s->cap) continue;
        s->offset[b] = o;
        int nch = 0;
        for (int k = s->ov_start[b]; k < s->ov_start[b + 1]; k++) {
            int c = s->ov_list[k];
            if (s->offset[c] < 0 && s->min_off[c] < height) {
                ch_b[nch] = c; ch_v[nch] = s->min_off[c]; nch++;
                s->min_off[c] = height;
            }
        }
        int nfl = 0;
        for (int k = s->lo[b]; k < s->hi[b]; k++) {
            fl_s[nfl] = k; fl_v[nfl] = s->floor_[k]; nfl++;
            s->floor_[k] = height;
            s->total[k] -= s->size[b];
            /* swap b out of the section's unplaced segment (undone by cnt[k]++, LIFO) */
            int base = s->sec_start[k], last = --s->cnt[k];
            int i = s->pos[(i64)k * s->n + b];
            int y = s->members[base + last];
            s->members[base + i] = y; s->pos[(i64)k * s->n + y] = i;
            s->members[base + last] = b; s->pos[(i64)k * s->n + b] = last;
        }
        /* unallocated floor: a section's floor is at least its unplaced buffers' lowest offset */
        /* every changed buffer overlaps b, so their sections form one contiguous range */
        int alo = s->n_sec, ahi = 0;
        for (int j = 0; j < nch; j++) {
            int c = ch_b[j];
            if (s->lo[c] < alo) alo = s->lo[c];
            if (s->hi[c] > ahi) ahi = s->hi[c];
        }
        {
            for (int k = alo; k < ahi; k++) {
                i64 m = -1;
                i64 fk = s->floor_[k];
                for (int q = s->sec_start[k], qe = s->sec_start[k] + s->cnt[k]; q < qe; q++) {
                    i64 v = s->min_off[s->members[q]];
                    if (v <= fk) { m = -1; break; } /* no raise possible: stop early */
                    if (m < 0 || v < m) m = v;
                }
                if (m > s->floor_[k]) {
                    fl_s[nfl] = k; fl_v[nfl] = s->floor_[k]; nfl++;
                    s->floor_[k] = m;
                }
            }
        }
        int ok = 1;
        for (int k = lo; k < hi; k++) {
            i64 f = s->floor_[k];
            if (f < o) f = o;
            if (f + s->total[k] > s->cap) { ok = 0; break; }
        }
        int r = 0;
        if (ok) r = decompose(s, pre, npre, lo, hi, o, p, b, ord, no);
        for (int j = nfl - 1; j >= 0; j--) s->floor_[fl_s[j]] = fl_v[j];
        for (int k = s->hi[b] - 1; k >= s->lo[b]; k--) { s->total[k] += s->size[b]; s->cnt[k]++; }
        for (int j = nch - 1; j >= 0; j--) s->min_off[ch_b[j]] = ch_v[j];
        s->offset[b] = -1;
        if (r != 0) { result = r; break; }
    }
    free(ch_b); free(ch_v); free(fl_s); free(fl_v); free(ord);
    return result;
}

/* Entry point. Returns 1 found, 0 infeasible, -1 time limit. */
int canonical_search(int n, int n_sec, const int *lo, const int *hi, const i64 *size, const i64 *width,
                     const int *sec_start, const int *sec_members, const int *ov_start, const int *ov_list,
                     i64 cap, double time_limit, i64 *out, i64 *nodes_out) {
    S s;
    memset(&s, 0, sizeof s);
    s.n = n; s.n_sec = n_sec; s.lo = lo; s.hi = hi; s.size = size; s.width = width;
    s.sec_start = sec_start; s.sec_members = sec_members; s.ov_start = ov_start; s.ov_list = ov_list;
    s.cap = cap;
    s.deadline = now() + time_limit;
    s.offset = malloc(sizeof(i64) * (n + 1));
    s.min_off = calloc(n + 1, sizeof(i64));
    s.solution = malloc(sizeof(i64) * (n + 1));
    s.floor_ = calloc(n_sec + 1, sizeof(i64));
    s.total = calloc(n_sec + 1, sizeof(i64));
    s.cuts = calloc(n_sec + 1, sizeof(int));
    s.members = malloc(sizeof(int) * (sec_start[n_sec] + 1));
    s.cnt = calloc(n_sec + 1, sizeof(int));
    s.pos = malloc(sizeof(int) * ((size_t)n_sec * n + 1));
    for (int k = 0; k < n_sec; k++) {
        s.cnt[k] = sec_start[k + 1] - sec_start[k];
        for (int q = sec_start[k]; q < sec_start[k + 1]; q++) {
            s.members[q] = sec_members[q];
            s.pos[(i64)k * n + sec_members[q]] = q - sec_start[k];
        }
    }
    for (int i = 0; i < n; i++) { s.offset[i] = -1; s.solution[i] = -1; }
    for (int k = 0; k < n_sec; k++)
        for (int q = sec_start[k]; q < sec_start[k + 1]; q++) s.total[k] += size[sec_members[q]];
    for (int b = 0; b < n; b++)
        for (int k = lo[b]; k < hi[b] - 1; k++) s.cuts[k]++;
    int status = 0, trivially_infeasible = 0;
    for (int b = 0; b < n; b++) if (size[b] > cap) trivially_infeasible = 1;
    for (int k = 0; k < n_sec; k++) if (s.total[k] > cap) trivially_infeasible = 1;
    /* initial partitions: split wherever no buffer crosses a section boundary */
    int *bufs = malloc(sizeof(int) * (n + 1));
    static const char *heuristics[] = {"WAT", "TAW", "TWA"};
    i64 node_limit = n > 0 ? n : 1;
    if (trivially_infeasible) status = 0;
    else while (1) {
        node_limit *= 2;
        int any_finished = 0;
        status = -2;
        for (int h = 0; h < 3; h++) {
            s.heuristic = heuristics[h];
            s.nodes_left = node_limit;
            int r = 1, start = 0;
            for (int k = 0; k < n_sec && r == 1; k++) {
                if (k == n_sec - 1 || s.cuts[k] == 0) {
                    int nb = 0;
                    for (int x = 0; x < n; x++)
                        if (lo[x] < k + 1 && start < hi[x]) bufs[nb++] = x;
                    if (nb) r = sub_solve(&s, bufs, nb, start, k + 1);
                    start = k + 1;
                }
            }
            if (r == 1 || r == 0 || r == -1) { status = r; any_finished = 1; break; }
        }
        if (any_finished) break;
        if (now() > s.deadline) { status = -1; break; }
    }
    if (status == 1) for (int i = 0; i < n; i++) out[i] = s.solution[i];
    *nodes_out = s.nodes;
    free(bufs);
    free(s.offset); free(s.min_off); free(s.solution); free(s.floor_); free(s.total); free(s.cuts); free(s.members); free(s.cnt); free(s.pos);
    return status;
}

/* Sweep first fit (planners.sweep_first_fit in C): buffers in `order` (by first step), each at the
 * lowest gap among the buffers still live, kept sorted by offset. O(n k) for k live at once, O(n)
 * memory. Returns how many buffers of `order` were placed before the time limit (all: n); the
 * caller stacks the rest. */
int sweep_first_fit(int n, const int *order, const i64 *first, const i64 *last, const i64 *size,
                    double time_limit, i64 *out) {
    double deadline = now() + time_limit;
    i64 *off = malloc(sizeof(i64) * (n + 1)), *end = malloc(sizeof(i64) * (n + 1));
    i64 *lst = malloc(sizeof(i64) * (n + 1));
    int k = 0, placed = 0;
    if (!off || !end || !lst) {
        free(off); free(end); free(lst);
        return 0;
    }
    for (int q = 0; q < n; q++) {
        if ((q & 1023) == 0 && now() > deadline) break;
        int i = order[q];
        int m = 0;
        for (int j = 0; j < k; j++) {  /* drop the buffers that ended before this one starts */
            if (lst[j] >= first[i]) {
                off[m] = off[j]; end[m] = end[j]; lst[m] = lst[j]; m++;
            }
        }
        k = m;
        i64 cursor = 0;
        int p = 0;
        for (; p < k; p++) {
            if (off[p] - cursor >= size[i]) break;
            if (end[p] > cursor) cursor = end[p];
        }
        out[i] = cursor;
        placed = q + 1;
        if (size[i] == 0) continue;
        /* insert at its place in offset order: every live buffer before p ends at or below cursor */
        memmove(off + p + 1, off + p, sizeof(i64) * (k - p));
        memmove(end + p + 1, end + p, sizeof(i64) * (k - p));
        memmove(lst + p + 1, lst + p, sizeof(i64) * (k - p));
        off[p] = cursor; end[p] = cursor + size[i]; lst[p] = last[i];
        k++;
    }
    free(off); free(end); free(lst);
    return placed;
}
