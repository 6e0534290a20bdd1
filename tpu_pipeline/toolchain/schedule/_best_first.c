/* The exact best-first search over scheduled unit sets of dp.best_first, in C for speed (about
 * 100x the states per second). Compiled on first use by tpu_pipeline/toolchain/native.py; without a C compiler
 * dp.py runs its Python version of the same algorithm, which the tests use as the reference.
 *
 * A state is the set U of units run. S (the ops run) follows from U, R (bytes resident between
 * steps) is stored, g is the best peak known to reach U. States are expanded in increasing
 * (max(g, floor), -depth, g) order; newer entries first on ties, so under the floor it dives.
 * Moves are single units or, around a fork of lazy slices (forks.py), a slice with its
 * consumer's unit or the run of every slice not yet run. Free moves as in dp.py.
 *
 * Both searches take the problem as one struct (Problem) and their own limits and results as
 * another (Search, Beam), each passed by pointer. Every struct is declared from one list of its
 * fields (the X macros below), from which `struct_layout` also reports the names, offsets and
 * sizes: native_search.py's ctypes mirrors are tested against that report.
 *
 * best_first_search returns 1 (an order below ub was found: units in out_units), 0 (exhausted:
 * nothing below ub), -1 (stopped by the deadline, the state cap or the memory cap; out_f is the
 * proven key).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef long long i64;
typedef unsigned long long u64;

/* The memory model (shared by every piece of a model), the piece, and where it starts. */
#define PROBLEM_FIELDS(X, S) \
    X(S, int, W)                        /* 64-bit words of an op set */ \
    X(S, int, Wu)                       /* words of a unit set */ \
    X(S, int, m)                        /* units of the piece */ \
    X(S, const int *, unit_start)       /* unit k's ops: unit_ops[unit_start[k] .. unit_start[k+1]) */ \
    X(S, const int *, unit_ops) \
    X(S, const u64 *, unit_mask)        /* per unit: its ops, W words */ \
    X(S, const int *, touch_start)      /* op v touches tensors touch[touch_start[v] .. touch_start[v+1]) */ \
    X(S, const int *, touch) \
    X(S, const i64 *, size)             /* per tensor */ \
    X(S, const u64 *, mask)             /* per tensor: the ops touching it, W words */ \
    X(S, const unsigned char *, pin_start) /* per tensor: live from step 0 */ \
    X(S, const unsigned char *, pin_end)   /* per tensor: live to the last step */ \
    X(S, const i64 *, extra)            /* per op: scratch bytes */ \
    X(S, i64, const_all)                /* bytes live at every step */ \
    X(S, i64, final_only)               /* bytes live at the last step only */ \
    X(S, const u64 *, full)             /* every op, W words */ \
    X(S, const u64 *, S0)               /* the ops run before the piece, W words */ \
    X(S, i64, R0)                       /* bytes resident after S0 */ \
    X(S, i64, g0)                       /* the peak so far when the search starts */ \
    X(S, const u64 *, upred)            /* per unit: its predecessor units, Wu words */ \
    X(S, const int *, lazy_fork)        /* per unit: its fork's index if a lazy slice, else -1 */ \
    X(S, const int *, lazy_cons)        /* per unit: its consumer's unit if a lazy slice */ \
    X(S, const int *, group_start)      /* fork f's slices: group_units[group_start[f] .. group_start[f+1]) */ \
    X(S, const int *, group_units) \
    X(S, const int *, twin)             /* per unit: the twin unit that must run first, or -1 (twins.py) */

/* best_first_search's limits (in) and results (out). */
#define SEARCH_FIELDS(X, S) \
    X(S, i64, ub)                       /* in: only orders peaking below this */ \
    X(S, i64, floor)                    /* in: a proven bound; keys below it are equal */ \
    X(S, double, seconds)               /* in: time allowed */ \
    X(S, i64, max_states)               /* in: states plus heap entries allowed */ \
    X(S, i64, max_bytes)                /* in: memory allowed */ \
    X(S, int, free_moves)               /* in: expand only a free move when there is one */ \
    X(S, int *, out_units)              /* out: the order found, m + 1 ints allocated by the caller */ \
    X(S, int, out_n)                    /* out: units in out_units */ \
    X(S, i64, out_peak)                 /* out: the order's peak */ \
    X(S, i64, out_f)                    /* out: the last key expanded (a proven bound) */ \
    X(S, i64, out_states)               /* out: states kept */

/* beam_search's limits (in) and results (out). */
#define BEAM_FIELDS(X, S) \
    X(S, int, width)                    /* in: states kept per level */ \
    X(S, i64, ub)                       /* in: only orders peaking below this */ \
    X(S, double, seconds)               /* in: time allowed */ \
    X(S, i64, max_bytes)                /* in: memory allowed */ \
    X(S, int *, out_units)              /* out: the order found, m + 1 ints allocated by the caller */ \
    X(S, int, out_n)                    /* out: units in out_units */ \
    X(S, i64, out_peak)                 /* out: the order's peak */

#define DECLARE(S, type, name) type name;
typedef struct { PROBLEM_FIELDS(DECLARE, _) } Problem;
typedef struct { SEARCH_FIELDS(DECLARE, _) } Search;
typedef struct { BEAM_FIELDS(DECLARE, _) } Beam;

#define NAME(S, type, name) #name " "
#define OFFSET(S, type, name) (i64)offsetof(S, name),
#define WIDTH(S, type, name) (i64)sizeof(((S *)0)->name),
#define LAYOUT(S, FIELDS) \
    static const char S##_names[] = FIELDS(NAME, S); \
    static const i64 S##_offsets[] = {FIELDS(OFFSET, S)}; \
    static const i64 S##_widths[] = {FIELDS(WIDTH, S)};
LAYOUT(Problem, PROBLEM_FIELDS)
LAYOUT(Search, SEARCH_FIELDS)
LAYOUT(Beam, BEAM_FIELDS)

/* The layout of struct `which` (0 Problem, 1 Search, 2 Beam): its field names (space-separated,
 * in order), each field's offset and size, and the struct's size. Returns the number of fields,
 * -1 for an unknown struct. */
int struct_layout(int which, const char **names, const i64 **offsets, const i64 **widths, i64 *total) {
#define REPORT(S) \
    do { *names = S##_names; *offsets = S##_offsets; *widths = S##_widths; *total = (i64)sizeof(S); \
         return (int)(sizeof(S##_offsets) / sizeof(i64)); } while (0)
    if (which == 0) REPORT(Problem);
    if (which == 1) REPORT(Search);
    if (which == 2) REPORT(Beam);
    return -1;
#undef REPORT
}

enum { SINGLE = 0, PAIR = 1, RUN = 2 };

typedef struct { i64 f, g, R; int negd, idx; } Entry;

typedef struct {
    PROBLEM_FIELDS(DECLARE, _) /* a copy of the problem, read as c->W, c->size, ... */
    /* states */
    u64 *U;
    i64 *R, *g;
    int *parent, *mv;
    unsigned char *kind;
    int n_states, cap_states;
    int *table;
    size_t table_size;
    Entry *heap;
    size_t heap_n, heap_cap;
    size_t max_bytes; /* no growth past this: the search stops instead */
} Ctx;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Run op v after the ops in S (updated) with R resident (updated); returns its live bytes. */
static i64 step(const Ctx *c, int v, u64 *S, i64 *R) {
    i64 fresh = 0, died = 0;
    int wv = v >> 6;
    u64 bv = 1ULL << (v & 63);
    for (int i = c->touch_start[v]; i < c->touch_start[v + 1]; i++) {
        int t = c->touch[i];
        const u64 *mk = c->mask + (size_t)t * c->W;
        if (!c->pin_start[t]) {
            int touched = 0;
            for (int w = 0; w < c->W && !touched; w++) touched = (mk[w] & S[w]) != 0;
            if (!touched) fresh += c->size[t];
        }
        if (!c->pin_end[t]) {
            int pending = 0;
            for (int w = 0; w < c->W && !pending; w++)
                pending = (mk[w] & ~(S[w] | (w == wv ? bv : 0))) != 0;
            if (!pending) died += c->size[t];
        }
    }
    S[wv] |= bv;
    i64 live = c->const_all + *R + fresh + c->extra[v];
    if (memcmp(S, c->full, sizeof(u64) * c->W) == 0) live += c->final_only;
    *R += fresh - died;
    return live;
}

static i64 apply_unit(const Ctx *c, int k, u64 *S, i64 *R) {
    i64 peak = 0;
    for (int i = c->unit_start[k]; i < c->unit_start[k + 1]; i++) {
        i64 live = step(c, c->unit_ops[i], S, R);
        if (live > peak) peak = live;
    }
    return peak;
}

static int has(const u64 *set, int k) { return (set[k >> 6] >> (k & 63)) & 1; }

/* The units of a move from unit set U, in the order they run. */
static int move_units(const Ctx *c, int k, int kind, const u64 *U, int *out) {
    if (kind == SINGLE) { out[0] = k; return 1; }
    if (kind == PAIR) { out[0] = k; out[1] = c->lazy_cons[k]; return 2; }
    int f = c->lazy_fork[k], n = 0;
    for (int i = c->group_start[f]; i < c->group_start[f + 1]; i++)
        if (!has(U, c->group_units[i])) out[n++] = c->group_units[i];
    return n;
}

/* The moves from unit set U, in forks.moves' order: each ready unit on its own or, for a lazy
 * slice, paired with its consumer's unit (which waits for nothing but the slice, so it is ready
 * now), plus once per fork the run of its remaining slices. Returns their number (at most 2m). */
static int list_moves(const Ctx *c, const u64 *U, int *ready, unsigned char *offered, int *mk,
                      unsigned char *mkind) {
    int nready = 0, n = 0;
    for (int k = 0; k < c->m; k++) {
        if (has(U, k)) continue;
        const u64 *pk = c->upred + (size_t)k * c->Wu;
        int waiting = 0;
        for (int w = 0; w < c->Wu && !waiting; w++) waiting = (pk[w] & ~U[w]) != 0;
        if (!waiting) ready[nready++] = k;
    }
    memset(offered, 0, c->m + 1);
    for (int i = 0; i < nready; i++) {
        int k = ready[i];
        /* a twin's unit waits for its elder's (twins.py; the eldest slice not run offers the run) */
        if (c->twin && c->twin[k] >= 0 && !has(U, c->twin[k])) continue;
        if (c->lazy_fork[k] < 0) { mk[n] = k; mkind[n++] = SINGLE; continue; }
        mk[n] = k; mkind[n++] = PAIR; /* (its consumer is in its chain: the elder's pair has run) */
        if (!offered[c->lazy_fork[k]]) {
            offered[c->lazy_fork[k]] = 1;
            mk[n] = k; mkind[n++] = RUN;
        }
    }
    return n;
}

/* Grows *p to `bytes` (realloc); 0 when out of memory, *p then unchanged. */
static int grow_array(void **p, size_t bytes) {
    void *q = realloc(*p, bytes);
    if (!q) return 0;
    *p = q;
    return 1;
}

static u64 hash_set(const u64 *U, int Wu) {
    u64 h = 0x9E3779B97F4A7C15ULL;
    for (int w = 0; w < Wu; w++) {
        h ^= U[w] + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ULL;
    }
    return h ^ (h >> 31);
}

/* Open addressing over unit sets (both searches): `table` (a power of 2 in size) holds indices
 * into `sets`, -1 for free. Returns the index of U, or -1 with *slot where it would go. */
static int probe(const int *table, size_t size, const u64 *sets, int Wu, const u64 *U, size_t *slot) {
    size_t mask = size - 1, i = hash_set(U, Wu) & mask;
    while (table[i] >= 0) {
        if (memcmp(sets + (size_t)table[i] * Wu, U, sizeof(u64) * Wu) == 0) {
            *slot = i;
            return table[i];
        }
        i = (i + 1) & mask;
    }
    *slot = i;
    return -1;
}

/* Fills `table` with the first n of `sets`. */
static void fill_table(int *table, size_t size, const u64 *sets, size_t n, int Wu) {
    memset(table, 0xff, sizeof(int) * size);
    for (size_t s = 0; s < n; s++) {
        size_t i = hash_set(sets + s * Wu, Wu) & (size - 1);
        while (table[i] >= 0) i = (i + 1) & (size - 1);
        table[i] = (int)s;
    }
}

static int find_state(const Ctx *c, const u64 *U, size_t *slot) {
    return probe(c->table, c->table_size, c->U, c->Wu, U, slot);
}

static size_t bytes_used(const Ctx *c);

/* Whether growing by `more` bytes stays within the cap. */
static int may_grow(const Ctx *c, size_t more) { return bytes_used(c) + more <= c->max_bytes; }

static int grow_table(Ctx *c) {
    size_t size = c->table_size * 2;
    if (!may_grow(c, sizeof(int) * c->table_size)) return 0;
    int *t = malloc(sizeof(int) * size);
    if (!t) return 0;
    fill_table(t, size, c->U, (size_t)c->n_states, c->Wu);
    free(c->table);
    c->table = t;
    c->table_size = size;
    return 1;
}

static size_t state_bytes(const Ctx *c) { return sizeof(u64) * c->Wu + 2 * sizeof(i64) + 2 * sizeof(int) + 1; }

static int grow_states(Ctx *c) {
    if (c->cap_states >= 1 << 29) return 0; /* state indices are ints (the table's too) */
    int cap = c->cap_states ? c->cap_states * 2 : 1024;
    if (!may_grow(c, state_bytes(c) * (size_t)(cap - c->cap_states))) return 0;
    if (!grow_array((void **)&c->U, sizeof(u64) * c->Wu * (size_t)cap)
        || !grow_array((void **)&c->R, sizeof(i64) * cap) || !grow_array((void **)&c->g, sizeof(i64) * cap)
        || !grow_array((void **)&c->parent, sizeof(int) * cap) || !grow_array((void **)&c->mv, sizeof(int) * cap)
        || !grow_array((void **)&c->kind, cap))
        return 0;
    c->cap_states = cap;
    return 1;
}

/* A new state, or -1 when out of memory. */
static int add_state(Ctx *c, const u64 *U, size_t slot) {
    if (c->n_states == c->cap_states && !grow_states(c)) return -1;
    int s = c->n_states++;
    memcpy(c->U + (size_t)s * c->Wu, U, sizeof(u64) * c->Wu);
    c->table[slot] = s;
    if ((size_t)c->n_states * 2 > c->table_size && !grow_table(c)) return -1;
    return s;
}

static int before(const Entry *a, const Entry *b) {
    if (a->f != b->f) return a->f < b->f;
    if (a->negd != b->negd) return a->negd < b->negd;
    if (a->g != b->g) return a->g < b->g;
    if (a->R != b->R) return a->R < b->R;
    return a->idx > b->idx;
}

static int push(Ctx *c, Entry e) {
    if (c->heap_n == c->heap_cap) {
        size_t cap = c->heap_cap ? c->heap_cap * 2 : 1024;
        if (!may_grow(c, sizeof(Entry) * (cap - c->heap_cap)) || !grow_array((void **)&c->heap, sizeof(Entry) * cap))
            return 0;
        c->heap_cap = cap;
    }
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&e, &c->heap[p])) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = e;
    return 1;
}

static Entry pop(Ctx *c) {
    Entry top = c->heap[0], last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, b = i;
        const Entry *best = &last;
        if (l < n && before(&c->heap[l], best)) { b = l; best = &c->heap[l]; }
        if (r < n && before(&c->heap[r], best)) { b = r; best = &c->heap[r]; }
        if (b == i) break;
        c->heap[i] = c->heap[b];
        i = b;
    }
    if (n) c->heap[i] = last;
    return top;
}

static size_t bytes_used(const Ctx *c) {
    return (size_t)c->cap_states * state_bytes(c) + c->table_size * sizeof(int) + c->heap_cap * sizeof(Entry);
}

static int reconstruct(const Ctx *c, int s, int *out) {
    int n = 0, *buf = malloc(sizeof(int) * (c->m + 1));
    if (!buf) return -1;
    /* moves back to front, then reversed */
    while (c->parent[s] >= 0) {
        int p = c->parent[s];
        int k = move_units(c, c->mv[s], c->kind[s], c->U + (size_t)p * c->Wu, buf);
        for (int i = k - 1; i >= 0; i--) out[n++] = buf[i];
        s = p;
    }
    free(buf);
    for (int i = 0; i < n / 2; i++) { int t = out[i]; out[i] = out[n - 1 - i]; out[n - 1 - i] = t; }
    return n;
}

static void release(Ctx *c) {
    free(c->U); free(c->R); free(c->g); free(c->parent); free(c->mv); free(c->kind);
    free(c->table); free(c->heap);
}

#define COPY(S, type, name) c.name = p->name;

int best_first_search(const Problem *p, Search *q) {
    Ctx c;
    memset(&c, 0, sizeof c);
    PROBLEM_FIELDS(COPY, _)
    c.max_bytes = (size_t)q->max_bytes;
    const int W = p->W, Wu = p->Wu, m = p->m, free_moves = q->free_moves;
    const u64 *S0 = p->S0, *unit_mask = p->unit_mask;
    const i64 R0 = p->R0, g0 = p->g0, ub = q->ub, floor_ = q->floor, max_states = q->max_states;
    const double seconds = q->seconds;
    int *out_units = q->out_units, *out_n = &q->out_n;
    i64 *out_peak = &q->out_peak, *out_f = &q->out_f, *out_states = &q->out_states;
    double deadline = now() + seconds;
    int status = -1;
    *out_f = floor_;
    *out_states = 0;

    u64 *U = calloc(Wu, sizeof(u64)), *U2 = calloc(Wu, sizeof(u64)), *full_u = calloc(Wu, sizeof(u64));
    u64 *S = calloc(W, sizeof(u64)), *S2 = calloc(W, sizeof(u64));
    int *ready = malloc(sizeof(int) * (m + 1)), *units = malloc(sizeof(int) * (m + 1));
    /* children of one state: (first unit, kind, peak, R after) */
    int *ck = malloc(sizeof(int) * (2 * m + 1)), *mk = malloc(sizeof(int) * (2 * m + 1));
    unsigned char *ckind = malloc(2 * m + 1), *mkind = malloc(2 * m + 1), *offered = calloc(m + 1, 1);
    i64 *cpeak = malloc(sizeof(i64) * (2 * m + 1)), *cR = malloc(sizeof(i64) * (2 * m + 1));
    c.table_size = 1024;
    c.table = malloc(sizeof(int) * c.table_size);
    if (!U || !U2 || !full_u || !S || !S2 || !ready || !units || !ck || !mk || !ckind || !mkind || !offered
        || !cpeak || !cR || !c.table)
        goto done;
    memset(c.table, 0xff, sizeof(int) * c.table_size);
    for (int k = 0; k < m; k++) full_u[k >> 6] |= 1ULL << (k & 63);

    size_t slot;
    find_state(&c, U, &slot);
    int s0 = add_state(&c, U, slot);
    if (s0 < 0) goto done;
    c.R[s0] = R0; c.g[s0] = g0; c.parent[s0] = -1; c.mv[s0] = -1; c.kind[s0] = 0;
    if (!push(&c, (Entry){g0 > floor_ ? g0 : floor_, g0, R0, 0, s0})) goto done;

    i64 pops = 0;
    while (c.heap_n) {
        Entry e = pop(&c);
        int st = e.idx;
        if (e.g > c.g[st]) continue; /* stale: a better path reached this set */
        *out_f = e.f;
        memcpy(U, c.U + (size_t)st * Wu, sizeof(u64) * Wu);
        if (memcmp(U, full_u, sizeof(u64) * Wu) == 0) {
            *out_n = reconstruct(&c, st, out_units);
            *out_peak = e.g;
            status = *out_n < 0 ? -1 : 1;
            goto done;
        }
        if ((++pops & 511) == 0) {
            if (now() > deadline) goto done;
            if ((i64)c.n_states + (i64)c.heap_n > max_states) goto done;
        }
        i64 g = e.g, R = c.R[st], cap = g > floor_ ? g : floor_;
        memcpy(S, S0, sizeof(u64) * W);
        for (int k = 0; k < m; k++)
            if (has(U, k))
                for (int w = 0; w < W; w++) S[w] |= unit_mask[(size_t)k * W + w];
        int nmoves = list_moves(&c, U, ready, offered, mk, mkind), nch = 0;
        for (int j = 0; j < nmoves; j++) {
            int n = move_units(&c, mk[j], mkind[j], U, units);
            memcpy(S2, S, sizeof(u64) * W);
            i64 R2 = R, peak = 0;
            for (int q = 0; q < n; q++) {
                i64 p = apply_unit(&c, units[q], S2, &R2);
                if (p > peak) peak = p;
            }
            int free_move = free_moves && peak <= cap && R2 <= R;
            if (free_move) nch = 0; /* the only child expanded */
            ck[nch] = mk[j]; ckind[nch] = mkind[j]; cpeak[nch] = peak; cR[nch] = R2; nch++;
            if (free_move) break;
        }
        for (int j = 0; j < nch; j++) {
            i64 g2 = cpeak[j] > g ? cpeak[j] : g;
            if (g2 >= ub) continue;
            int n = move_units(&c, ck[j], ckind[j], U, units);
            memcpy(U2, U, sizeof(u64) * Wu);
            for (int q = 0; q < n; q++) U2[units[q] >> 6] |= 1ULL << (units[q] & 63);
            int s2 = find_state(&c, U2, &slot);
            if (s2 >= 0 && c.g[s2] <= g2) continue;
            if (s2 < 0 && (s2 = add_state(&c, U2, slot)) < 0) goto done;
            c.g[s2] = g2; c.R[s2] = cR[j]; c.parent[s2] = st; c.mv[s2] = ck[j]; c.kind[s2] = ckind[j];
            if (!push(&c, (Entry){g2 > floor_ ? g2 : floor_, g2, cR[j], e.negd - 1, s2})) goto done;
        }
    }
    status = 0; /* exhausted below ub */
done:
    *out_states = c.n_states;
    free(U); free(U2); free(full_u); free(S); free(S2); free(ready); free(units);
    free(ck); free(mk); free(ckind); free(mkind); free(offered); free(cpeak); free(cR);
    release(&c);
    return status;
}

/* ---- beam search (beam.py): orders only, level by level ---------------------------------------
 * Every state of the beam is extended by each move; a set of units reached twice keeps the
 * smaller (peak, R); the `width` candidates with the smallest (peak, R, unit set) survive: the
 * same sets as beam.py's at every level, so the two give the same peaks. Returns 1 (a complete
 * order below ub: out_units, out_peak), 0 (the beam died: every extension reached ub), -1
 * (deadline or memory), -2 (a beam this wide does not fit max_bytes at all: wider ones neither).
 */
typedef struct { i64 peak, R; int parent, k; unsigned char kind; } Cand;

typedef struct { const Cand *cand; const u64 *U; int Wu; } Pool;

/* (peak, R, unit set as a number): the order beam.py keeps, so both keep the same sets. */
static int cand_before(const Pool *pool, int a, int b) {
    const Cand *x = &pool->cand[a], *y = &pool->cand[b];
    if (x->peak != y->peak) return x->peak < y->peak;
    if (x->R != y->R) return x->R < y->R;
    const u64 *ua = pool->U + (size_t)a * pool->Wu, *ub = pool->U + (size_t)b * pool->Wu;
    for (int w = pool->Wu - 1; w >= 0; w--)
        if (ua[w] != ub[w]) return ua[w] < ub[w];
    return 0;
}

/* Puts the `want` best of idx[0..n) first (in any order): quickselect. */
static void select_best(const Pool *pool, int *idx, int n, int want) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, a = idx[lo], b = idx[mid], c = idx[hi], p;
        if (cand_before(pool, a, b)) p = cand_before(pool, b, c) ? b : (cand_before(pool, a, c) ? c : a);
        else p = cand_before(pool, a, c) ? a : (cand_before(pool, b, c) ? c : b);
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_before(pool, idx[i], p)) i++;
            while (cand_before(pool, p, idx[j])) j--;
            if (i <= j) { int t = idx[i]; idx[i] = idx[j]; idx[j] = t; i++; j--; }
        }
        if (want - 1 <= j) hi = j;
        else if (want - 1 >= i) lo = i;
        else break;
    }
}

/* The beam's memory: two levels of `width` states, the candidates with their hash table, the trail. */
static size_t beam_bytes(int width, int W, int Wu, size_t cand_cap, size_t tsize, size_t trail_cap) {
    return (size_t)width * (2 * sizeof(u64) * (W + Wu) + 4 * sizeof(i64) + 2 * sizeof(int))
           + cand_cap * (sizeof(Cand) + sizeof(u64) * Wu + sizeof(int)) + tsize * sizeof(int)
           + trail_cap * (2 * sizeof(int) + 1);
}

int beam_search(const Problem *p, Beam *q) {
    Ctx c;
    memset(&c, 0, sizeof c);
    PROBLEM_FIELDS(COPY, _)
    c.twin = NULL; /* the beams offer every move (twins are for the exact search) */
    const int W = p->W, Wu = p->Wu, m = p->m, width = q->width;
    const u64 *S0 = p->S0, *unit_mask = p->unit_mask;
    const i64 R0 = p->R0, g0 = p->g0, ub = q->ub, max_bytes = q->max_bytes;
    const double seconds = q->seconds;
    int *out_units = q->out_units, *out_n = &q->out_n;
    i64 *out_peak = &q->out_peak;
    double deadline = now() + seconds;
    int status = -1;
    if (width < 1 || beam_bytes(width, W, Wu, (size_t)width * 8, (size_t)width * 16, (size_t)width * 4)
                         > (size_t)max_bytes)
        return -2; /* the first allocations alone would pass the cap */
    /* the beam: U, S, R, g and a trail entry per state; the trail links each state to its parent */
    u64 *bU = malloc(sizeof(u64) * Wu * (size_t)width), *bS = malloc(sizeof(u64) * W * (size_t)width);
    u64 *nU = malloc(sizeof(u64) * Wu * (size_t)width), *nS = malloc(sizeof(u64) * W * (size_t)width);
    i64 *bR = malloc(sizeof(i64) * width), *bg = malloc(sizeof(i64) * width);
    i64 *nR = malloc(sizeof(i64) * width), *ng = malloc(sizeof(i64) * width);
    int *btrail = malloc(sizeof(int) * width), *ntrail = malloc(sizeof(int) * width);
    size_t trail_cap = (size_t)width * 4, trail_n = 0;
    int *tparent = malloc(sizeof(int) * trail_cap), *tk = malloc(sizeof(int) * trail_cap);
    unsigned char *tkind = malloc(trail_cap);
    size_t cand_cap = (size_t)width * 8, ncand = 0;
    Cand *cand = malloc(sizeof(Cand) * cand_cap);
    u64 *cU = malloc(sizeof(u64) * Wu * cand_cap);
    int *order = malloc(sizeof(int) * cand_cap);
    size_t tsize = 1;
    while (tsize < cand_cap * 2) tsize <<= 1;
    int *table = malloc(sizeof(int) * tsize);
    int *ready = malloc(sizeof(int) * (m + 1)), *units = malloc(sizeof(int) * (m + 1));
    int *chain = malloc(sizeof(int) * (m + 1)), *mk = malloc(sizeof(int) * (2 * m + 1));
    unsigned char *offered = calloc(m + 1, 1), *mkind = malloc(2 * m + 1);
    u64 *S2 = malloc(sizeof(u64) * W), *full_u = calloc(Wu, sizeof(u64)), *U = calloc(Wu, sizeof(u64));
    if (!bU || !bS || !nU || !nS || !bR || !bg || !nR || !ng || !btrail || !ntrail || !tparent || !tk
        || !tkind || !cand || !cU || !order || !table || !ready || !units || !chain || !mk || !offered
        || !mkind || !S2 || !full_u || !U)
        goto done;
    for (int k = 0; k < m; k++) full_u[k >> 6] |= 1ULL << (k & 63);
    int n = 1;
    memset(bU, 0, sizeof(u64) * Wu);
    memcpy(bS, S0, sizeof(u64) * W);
    bR[0] = R0; bg[0] = g0; btrail[0] = -1;
    if (g0 >= ub) { status = 0; goto done; }
    while (n > 0) {
        for (int i = 0; i < n; i++) {
            if (memcmp(bU + (size_t)i * Wu, full_u, sizeof(u64) * Wu) != 0) continue;
            /* the complete state: replay its moves from the front */
            int len = 0, nout = 0;
            for (int t = btrail[i]; t >= 0; t = tparent[t]) chain[len++] = t;
            memset(U, 0, sizeof(u64) * Wu);
            for (int q = len - 1; q >= 0; q--) {
                int cnt = move_units(&c, tk[chain[q]], tkind[chain[q]], U, units);
                for (int r = 0; r < cnt; r++) {
                    out_units[nout++] = units[r];
                    U[units[r] >> 6] |= 1ULL << (units[r] & 63);
                }
            }
            *out_n = nout;
            *out_peak = bg[i];
            status = 1;
            goto done;
        }
        /* candidates of the next level */
        ncand = 0;
        memset(table, 0xff, sizeof(int) * tsize);
        for (int i = 0; i < n; i++) {
            if (now() > deadline) goto done;
            const u64 *Ui = bU + (size_t)i * Wu, *Si = bS + (size_t)i * W;
            int nmoves = list_moves(&c, Ui, ready, offered, mk, mkind);
            for (int j = 0; j < nmoves; j++) {
                int cnt = move_units(&c, mk[j], mkind[j], Ui, units);
                memcpy(S2, Si, sizeof(u64) * W);
                i64 R2 = bR[i], peak = bg[i];
                for (int q = 0; q < cnt; q++) {
                    i64 p = apply_unit(&c, units[q], S2, &R2);
                    if (p > peak) peak = p;
                }
                if (peak >= ub) continue;
                if (ncand == cand_cap) {
                    size_t cap2 = cand_cap * 2;
                    if (beam_bytes(width, W, Wu, cap2, tsize * 2, trail_cap) > (size_t)max_bytes) goto done;
                    if (!grow_array((void **)&cand, sizeof(Cand) * cap2) || !grow_array((void **)&cU, sizeof(u64) * Wu * cap2)
                        || !grow_array((void **)&order, sizeof(int) * cap2))
                        goto done;
                    cand_cap = cap2;
                    /* rehash into a table twice the size */
                    size_t ts2 = tsize * 2;
                    int *t2 = malloc(sizeof(int) * ts2);
                    if (!t2) goto done;
                    fill_table(t2, ts2, cU, ncand, Wu);
                    free(table);
                    table = t2;
                    tsize = ts2;
                }
                u64 *Uc = cU + ncand * Wu;
                memcpy(Uc, Ui, sizeof(u64) * Wu);
                for (int q = 0; q < cnt; q++) Uc[units[q] >> 6] |= 1ULL << (units[q] & 63);
                size_t h;
                int dup = probe(table, tsize, cU, Wu, Uc, &h);
                Cand nc_ = {peak, R2, i, mk[j], mkind[j]};
                if (dup >= 0) {
                    if (peak < cand[dup].peak || (peak == cand[dup].peak && R2 < cand[dup].R)) cand[dup] = nc_;
                    continue;
                }
                table[h] = (int)ncand;
                cand[ncand++] = nc_;
            }
        }
        int keep = ncand < (size_t)width ? (int)ncand : width;
        for (size_t q = 0; q < ncand; q++) order[q] = (int)q;
        Pool pool = {cand, cU, Wu};
        if ((size_t)keep < ncand) select_best(&pool, order, (int)ncand, keep);
        if (trail_n + keep > trail_cap) {
            size_t cap2 = (trail_cap + keep) * 2;
            if (beam_bytes(width, W, Wu, cand_cap, tsize, cap2) > (size_t)max_bytes) goto done;
            if (!grow_array((void **)&tparent, sizeof(int) * cap2) || !grow_array((void **)&tk, sizeof(int) * cap2)
                || !grow_array((void **)&tkind, cap2))
                goto done;
            trail_cap = cap2;
        }
        for (int q = 0; q < keep; q++) {
            const Cand *x = &cand[order[q]];
            const u64 *Ui = bU + (size_t)x->parent * Wu;
            int cnt = move_units(&c, x->k, x->kind, Ui, units);
            u64 *Sn = nS + (size_t)q * W;
            memcpy(Sn, bS + (size_t)x->parent * W, sizeof(u64) * W);
            for (int r = 0; r < cnt; r++)
                for (int w = 0; w < W; w++) Sn[w] |= unit_mask[(size_t)units[r] * W + w];
            memcpy(nU + (size_t)q * Wu, cU + (size_t)order[q] * Wu, sizeof(u64) * Wu);
            nR[q] = x->R; ng[q] = x->peak;
            tparent[trail_n] = btrail[x->parent]; tk[trail_n] = x->k; tkind[trail_n] = x->kind;
            ntrail[q] = (int)trail_n++;
        }
        /* swap the levels */
        u64 *t64; i64 *ti; int *tn;
        t64 = bU; bU = nU; nU = t64;
        t64 = bS; bS = nS; nS = t64;
        ti = bR; bR = nR; nR = ti;
        ti = bg; bg = ng; ng = ti;
        tn = btrail; btrail = ntrail; ntrail = tn;
        n = keep;
    }
    status = 0; /* died: every extension reached ub */
done:
    free(bU); free(bS); free(nU); free(nS); free(bR); free(bg); free(nR); free(ng); free(btrail);
    free(ntrail); free(tparent); free(tk); free(tkind); free(cand); free(cU); free(order); free(table);
    free(ready); free(units); free(chain); free(mk); free(offered); free(mkind); free(S2); free(full_u); free(U);
    return status;
}
