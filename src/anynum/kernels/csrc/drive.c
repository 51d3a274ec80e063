/* The entry points: split a call into parts for the pool, walk the layout, stage dtypes.
 *
 * anynum_round        elementwise families (float, uniform, posit, table)
 * anynum_round_each   the same over a list of contiguous tensors, as if concatenated
 * (anynum_round_blocks, for block formats, is in block.c.)
 * It returns the number of exact-SR elements left undecided (see loops.c), or -1 when the call
 * names a loop this library does not have.
 */

static any_loop select_loop(const any_call *c) {
    if (c->mode < 0 || c->mode >= M_COUNT || c->wdt < 0 || c->wdt > 1 || c->tdt < 0 || c->tdt > 3) return 0;
    const any_loop (*tab)[M_COUNT] = c->wdt ? elem_loops_f64 : elem_loops_f32;
    switch (c->family) {
    case F_FLOAT:
        if (c->f.on_bits) return (c->wdt ? bits_loops_f64 : bits_loops_f32)[c->mode];
        return tab[c->f.common ? (c->f.recip ? 2 : 1) : 0][c->mode];
    case F_UNIFORM: return tab[3 + (c->u.wrap != 0)][c->mode];
    case F_POSIT:
        if (c->p.fast && c->mode == M_SR) return c->wdt ? positfast_sr_f64 : positfast_sr_f32;
        return tab[c->p.fast && !(c->mode == M_SRT && c->p.underflow_zero) ? 6 : 5][c->mode];
    case F_TABLE: /* stochastic modes choose behind the lookup, which all tables but one-value ones have */
        if (!c->t.lut && c->t.size > 1 && c->mode >= M_SR) return 0;
        return c->wdt ? table_loops_f64[c->mode] : (c->t.lut ? table_loops_f32[c->mode] : 0);
    default: return 0;
    }
}

#define STAGE 1024

/* n elements of dtype c->tdt at x -> y, logical indices idx0 + i * ls */
static void run_segment(const any_call *c, any_loop loop, const char *x, char *y, int64_t n,
                        uint64_t base, uint64_t idx0, int64_t ls, int64_t *und) {
    any_pos at = {base, idx0, ls};
    int tdt = c->tdt;
    if ((c->wdt == 0 && tdt == T_F32) || (c->wdt == 1 && tdt == T_F64)) {
        loop(x, y, n, c, &at, und);
        return;
    }
    size_t ts = any_tsize[tdt];
    for (int64_t off = 0; off < n; off += STAGE) {
        int64_t m = n - off < STAGE ? n - off : STAGE;
        at.idx0 = idx0 + (uint64_t)(off * ls);
        if (c->wdt == 0) {
            float buf[STAGE];
            load_f32(x + off * ts, tdt, buf, m);
            loop(buf, buf, m, c, &at, und);
            store_f32(buf, y + off * ts, tdt, m);
        } else {
            double buf[STAGE];
            load_f64(x + off * ts, tdt, buf, m);
            loop(buf, buf, m, c, &at, und);
            store_f64(buf, y + off * ts, tdt, m);
        }
    }
}

typedef struct {
    const any_call *c;
    any_loop loop;
    const char *x;
    char *y;
    int64_t n;
    uint64_t base;
    const int64_t *layout; /* NULL: memory order is the logical order; else see anynum_round */
    int64_t und[POOL_MAX][8];
} elem_job;

static void elem_task(void *ctx, int part, int parts) {
    elem_job *j = (elem_job *)ctx;
    int64_t b, e;
    pool_range(j->n, part, parts, &b, &e);
    int64_t *und = &j->und[part][0];
    size_t ts = any_tsize[j->c->tdt];
    if (!j->layout) {
        if (e > b) run_segment(j->c, j->loop, j->x + b * ts, j->y + b * ts, e - b, j->base, (uint64_t)b, 1, und);
        return;
    }
    int d = (int)j->layout[0];
    const int64_t *sizes = j->layout + 1, *lstrides = j->layout + 1 + d;
    for (int64_t p = b; p < e;) { /* one run of the innermost memory dimension at a time */
        int64_t q = p, idx = 0, inner = 0;
        for (int k = d - 1; k >= 0; k--) {
            int64_t digit = q % sizes[k];
            q /= sizes[k];
            idx += digit * lstrides[k];
            if (k == d - 1) inner = digit;
        }
        int64_t len = sizes[d - 1] - inner;
        len = len < e - p ? len : e - p;
        run_segment(j->c, j->loop, j->x + p * ts, j->y + p * ts, len, j->base, (uint64_t)idx, lstrides[d - 1], und);
        p += len;
    }
}

/* The counter base of `stream` under `seed` (anynum.rounding._counter_stream_base), for callers
 * that draw a seed where no Python runs (the autograd node of anynum/kernels/pairop.py). */
uint64_t anynum_stream_base(uint64_t seed, uint64_t stream) { return mix64(mix64(seed) + stream); }

/* Round n elements of x (dtype c->tdt) into y (same dtype and layout; y may be x).
 * layout: NULL when the memory order is the row-major logical order (or the mode draws no
 * random bits), else {d, sizes[d], logical strides[d]}: the dimensions in memory order,
 * outermost first, the last one contiguous. */
int64_t anynum_round(const void *x, void *y, int64_t n, const any_call *c, uint64_t base, int32_t threads,
                     const int64_t *layout) {
    any_loop loop = select_loop(c);
    if (!loop) return -1;
    if (n <= 0) return 0;
    elem_job j;
    j.c = c;
    j.loop = loop;
    j.x = (const char *)x;
    j.y = (char *)y;
    j.n = n;
    j.base = base;
    j.layout = layout;
    int parts = pool_parts(n, c->grain, threads);
    for (int p = 0; p < parts; p++) j.und[p][0] = 0;
    pool_run(elem_task, &j, parts);
    int64_t und = 0;
    for (int p = 0; p < parts; p++) und += j.und[p][0];
    return und;
}

typedef struct {
    const any_call *c;
    any_loop loop;
    const char *const *xs;
    char *const *ys;
    const int64_t *offs; /* offs[k]: the first logical index of tensor k; offs[count]: the total */
    int32_t count;
    uint64_t base;
    int64_t und[POOL_MAX][8];
} each_job;

static void each_task(void *ctx, int part, int parts) {
    each_job *j = (each_job *)ctx;
    int64_t b, e;
    pool_range(j->offs[j->count], part, parts, &b, &e);
    int64_t *und = &j->und[part][0];
    size_t ts = any_tsize[j->c->tdt];
    for (int32_t k = 0; k < j->count && b < e; k++) {
        int64_t lo = j->offs[k], hi = j->offs[k + 1];
        if (hi <= b) continue;
        int64_t s = b > lo ? b : lo, t = e < hi ? e : hi;
        run_segment(j->c, j->loop, j->xs[k] + (s - lo) * ts, j->ys[k] + (s - lo) * ts, t - s, j->base,
                    (uint64_t)s, 1, und);
        b = t;
    }
}

/* Round `count` contiguous tensors xs[k] of offs[k + 1] - offs[k] elements (dtype c->tdt) into
 * ys[k] (each ys[k] the same size; it may be xs[k]), exactly as anynum_round rounds their
 * concatenation: element i of tensor k has the logical index offs[k] + i. One call instead of a
 * copy in, a call and a copy out (an optimizer's many small tensors). Returns as anynum_round. */
int64_t anynum_round_each(const void *const *xs, void *const *ys, const int64_t *offs, int32_t count,
                          const any_call *c, uint64_t base, int32_t threads) {
    any_loop loop = select_loop(c);
    if (!loop) return -1;
    if (count <= 0 || offs[count] <= 0) return 0;
    each_job j;
    j.c = c;
    j.loop = loop;
    j.xs = (const char *const *)xs;
    j.ys = (char *const *)ys;
    j.offs = offs;
    j.count = count;
    j.base = base;
    int parts = pool_parts(offs[count], c->grain, threads);
    for (int p = 0; p < parts; p++) j.und[p][0] = 0;
    pool_run(each_task, &j, parts);
    int64_t und = 0;
    for (int p = 0; p < parts; p++) und += j.und[p][0];
    return und;
}

/* the pool's size, for tests: workers started in this process */
int32_t anynum_pool_workers(void) { return __atomic_load_n(&pool.pid, __ATOMIC_ACQUIRE) == getpid() ? pool.workers : 0; }

/* sizeof(any_call), so that Python can check its structure matches this one */
int64_t anynum_call_size(void) { return (int64_t)sizeof(any_call); }
