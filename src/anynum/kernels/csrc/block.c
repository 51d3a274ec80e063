/* The block-format entry point: anynum_round_blocks (the blocked axis last and contiguous) and its
 * helpers: each block's scale from its amax (blockscan.c), the chunks that the threshold path
 * (blockthr.c) or the element loops (loops.c) round, and NVFP4's tensor scale. Returns the number of exact-SR
 * elements left undecided, or -1 when the call names a loop this library does not have; calls with
 * undecided elements, or with results past the dtype's max, are redone by the router's next kernel.
 */

/* shared exponent of a block from its amax (kernels.block._pow2_exponents, exact floor(log2)),
   in float64 whatever the working type: amax converts exactly, and so does every constant. */
static int block_exponent(double amax, const any_block *b) {
    if (!(amax > 0.0)) return b->kmin; /* an all-zero block; NaN/inf blocks become NaN anyway */
    int tiny = amax < 0x1p-1022;
    uint64_t bits = f64_bits(tiny ? amax * 0x1p54 : amax);
    int e = (int)(bits >> 52) - 1023 - (tiny ? 54 : 0);
    double sig = f64_from((bits & 0x000FFFFFFFFFFFFFull) | (1023ull << 52)); /* amax / 2**e, in [1, 2) */
    int k = e - b->elem_emax;
    if (b->rule == R_CEIL) k += sig > b->ceil_sig;
    else if (b->rule == R_EVEN) k += sig * sig >= 2.0;
    k = k < b->kmin ? b->kmin : k;
    return k > b->kmax ? b->kmax : k;
}

/* smallest value of a FloatFormat at or above q (RU, saturating), float64: _round_up_quotient */
static double round_up_into(const any_float *fmt, double q, double smallest) {
    float_k_f64 k = float_consts_f64(fmt);
    int u = 0;
    double s = float_round_f64(q, &k, M_RU, 0, 0, 0, 0.0, &u);
    return q > 0.0 ? s : smallest;
}

/* the block's scale: 2**k (pow2) or `total` (a float64 scale, for the "amax" rule) */
static void block_scale(const any_call *c, double amax, int bad, double tscale, int *pow2, int *k,
                        double *total) {
    const any_block *b = &c->b;
    if (b->rule != R_AMAX) {
        *pow2 = 1;
        *k = block_exponent(amax, b);
        return;
    }
    double den = b->tensor_scale ? b->elem_max * tscale : b->elem_max;
    double sb = round_up_into(&b->scale_fmt, (bad ? 0.0 : amax) / den, b->scale_min);
    if (b->pow2) { /* a power-of-two scale format: sb = 2**k exactly */
        *pow2 = 1;
        *k = (int)((f64_bits(sb) >> 52) & 0x7FF) - 1023;
        return;
    }
    *pow2 = 0;
    *total = b->tensor_scale ? sb * tscale : sb;
}

typedef struct {
    const any_call *c;
    const char *x;
    char *y;
    int64_t rows, len, nblocks, bs, blocks;
    uint64_t base;
    double tscale;
    /* one long block at a time (few blocks): its range, scale, and what each part found */
    int64_t cur_off, cur_n;
    uint64_t cur_idx;
    int cur_bad, cur_use_inv, finite_only;
    double cur_sc, cur_iv;
    const float *tab; /* the threshold path's rows for every scale value (blockthr.c), or NULL */
    uint32_t *bam;    /* every block's amax bits (NVFP4 on 16- and 32-bit dtypes), or NULL */
    thr_keys km;
    uint64_t bits[POOL_MAX][8];
    int64_t und[POOL_MAX][8];
} block_job;

/* a block's scale as float64 values: sc (2**k, or the "amax" rule's scale) and, for powers of
   two whose reciprocal the working type holds (normal or subnormal), iv = 2**-k (exact); for other
   scales iv = fl(1 / sc) (for BK_RCP); else iv = 0 */
ANY_INLINE void block_values(const block_job *j, uint64_t bits, int *bad, double *sc, double *iv) {
    const any_call *c = j->c;
    *bad = bits >= any_inf_bits[c->tdt];
    int pow2 = 0, k = 0;
    double total = 1.0;
    block_scale(c, bits_value(bits, c->tdt), *bad, j->tscale, &pow2, &k, &total);
    int qmin = c->wdt ? -1074 : -149, emax = c->wdt ? 1023 : 127;
    /* 2**k from the exponent bits: k is within float64's normal range for every scale format */
    *sc = pow2 ? f64_from((uint64_t)(k + 1023) << 52) : total;
    *iv = (pow2 && -k >= qmin && -k <= emax) ? f64_from((uint64_t)(1023 - k) << 52) : 0.0;
    *iv = pow2 ? *iv : 1.0 / total;
}

/* block_values for the nb blocks of a chunk, in loops over the blocks (which vectorise) */
static void blocks_scales(const block_job *j, const uint64_t *bits, int64_t nb, double *sc, double *iv, int *bad,
                          int32_t *key) {
    const any_call *c = j->c;
    const any_block *b = &c->b;
    const int tdt = c->tdt;
    const uint64_t inf = any_inf_bits[tdt];
    double amax[BLOCK_CHUNK];
    int64_t k[BLOCK_CHUNK];
    if (tdt == T_F32) for (int64_t i = 0; i < nb; i++) amax[i] = (double)f32_from((uint32_t)bits[i]);
    else if (tdt == T_F64) for (int64_t i = 0; i < nb; i++) amax[i] = f64_from(bits[i]);
    else if (tdt == T_F16) for (int64_t i = 0; i < nb; i++) amax[i] = (double)half_to_float((uint16_t)bits[i]);
    else for (int64_t i = 0; i < nb; i++) amax[i] = (double)bf16_to_float((uint16_t)bits[i]);
    for (int64_t i = 0; i < nb; i++) bad[i] = bits[i] >= inf;
    if (b->rule != R_AMAX) { /* block_exponent, branch-free */
        const double ceil_sig = b->ceil_sig;
        const int64_t kmin = b->kmin, kmax = b->kmax, emax_e = b->elem_emax;
        const int64_t ceil = b->rule == R_CEIL, even = b->rule == R_EVEN;
        for (int64_t i = 0; i < nb; i++) {
            double a = amax[i];
            int64_t tiny = a < 0x1p-1022;
            uint64_t ab = f64_bits(tiny ? a * 0x1p54 : a);
            int64_t e = (int64_t)((ab >> 52) & 0x7FF) - 1023 - (tiny ? 54 : 0);
            double sig = f64_from((ab & 0x000FFFFFFFFFFFFFull) | (1023ull << 52));
            int64_t kk = e - emax_e + (ceil & (sig > ceil_sig)) + (even & (sig * sig >= 2.0));
            kk = kk < kmin ? kmin : kk;
            kk = kk > kmax ? kmax : kk;
            k[i] = a > 0.0 ? kk : kmin;
        }
    } else { /* round_up_into, branch-free */
        const float_k_f64 fk = float_consts_f64(&b->scale_fmt);
        const double den = b->tensor_scale ? b->elem_max * j->tscale : b->elem_max;
        const double smin = b->scale_min, tmul = b->tensor_scale ? j->tscale : 1.0;
        double q[BLOCK_CHUNK];
        /* fl(amax / den) from the reciprocal where rcp_div's conditions hold (amax of float32 or
           narrower inputs, den of at most 48 significant bits within 2**+-300), else divided */
        if (b->rcp && (f64_bits(den) & 0x1Full) == 0 && den >= 0x1p-300 && den <= 0x1p300) {
            const double iden = 1.0 / den;
            for (int64_t i = 0; i < nb; i++) q[i] = rcp_div_f64(bad[i] ? 0.0 : amax[i], den, iden);
        } else {
            for (int64_t i = 0; i < nb; i++) q[i] = (bad[i] ? 0.0 : amax[i]) / den;
        }
        /* each block's row of the threshold table (blockthr.c), NaN blocks the last: s is a value
           of the scale format in [scale_min, limit], so its key is in range (the test keeps a
           stray key inside the table) */
        const int shift = j->km.shift;
        const uint64_t key0 = j->km.key0, nk = (uint64_t)j->km.n;
        double rq[BLOCK_CHUNK];
        /* RU into the scale format multiplying by the step's exact reciprocal where the format has
           one (UE4M3 in float64): the divide's bits, and a vector divide was half of this loop */
        if (b->scale_fmt.recip) {
            for (int64_t i = 0; i < nb; i++) {
                int u = 0;
                rq[i] = float_round_f64(q[i], &fk, M_RU, 0, 1, 0, 0.0, &u);
            }
        } else {
            for (int64_t i = 0; i < nb; i++) {
                int u = 0;
                rq[i] = float_round_f64(q[i], &fk, M_RU, 0, 0, 0, 0.0, &u);
            }
        }
        for (int64_t i = 0; i < nb; i++) {
            double s = q[i] > 0.0 ? rq[i] : smin;
            sc[i] = s * tmul; /* exact: Block's width rule (docs/block.md) */
            k[i] = (int64_t)((f64_bits(s) >> 52) & 0x7FF) - 1023;
            const uint64_t kk = (f64_bits(s) >> shift) - key0;
            key[i] = (int32_t)(bad[i] || kk >= nk ? nk : kk);
        }
        if (!b->pow2) { /* fl(1 / s) for BK_RCP; the threshold path (float32) does without */
            if (!(b->nthr > 0 && !b->thr_lo && tdt == T_F32 && j->bs % BLOCK_G == 0)) /* see chunk() */
                for (int64_t i = 0; i < nb; i++) iv[i] = 1.0 / sc[i];
            return;
        }
    }
    const int64_t qmin = c->wdt ? -1074 : -149, emax = c->wdt ? 1023 : 127;
    const int shift = j->km.shift;
    const uint64_t key0 = j->km.key0, nk = (uint64_t)j->km.n;
    for (int64_t i = 0; i < nb; i++) {
        sc[i] = f64_from((uint64_t)(k[i] + 1023) << 52);
        iv[i] = (-k[i] >= qmin && -k[i] <= emax) ? f64_from((uint64_t)(1023 - k[i]) << 52) : 0.0;
        const uint64_t kk = (((uint64_t)(k[i] + 1023) << 52) >> shift) - key0; /* in range: see thr_key_map */
        key[i] = (int32_t)(bad[i] || kk >= nk ? nk : kk);
    }
}

/* how the element loop forms x / scale (BK_*, loops.c); use_inv: every power-of-two scale of the
   chunk has its exact reciprocal */
static int block_kind(const any_call *c, int use_inv) {
    if (c->b.pow2) return use_inv ? (c->b.fix_tiny ? BK_INV_FIX : BK_INV) : BK_DIV;
    return c->b.rcp && c->wdt ? BK_RCP : BK_DIV;
}

/* Whether the element loop of a chunk takes each block's least nonzero magnitude (blocks_amax's
   least) for its test of a chunk whose quotients are all normal, instead of a pass over the
   elements: float elements rounded on the bits, with power-of-two scales, in whole groups, where
   chunk() does not take the threshold paths. */
static int block_wants_least(const any_call *c, int64_t bs) {
    const any_block *b = &c->b;
    return b->elem_family == F_FLOAT && b->ef.on_bits && b->pow2 && bs % BLOCK_G == 0 &&
           !(b->nthr > 0 && c->tdt == T_F32);
}

static void chunk(const block_job *j, int64_t off, int64_t n, int64_t bs, const double *sc, const double *iv,
                  const int *bad, const int32_t *key, int use_inv, uint64_t idx0, const uint64_t *least,
                  int64_t *und) {
    size_t ts = any_tsize[j->c->tdt];
    const char *x = j->x + off * (int64_t)ts;
    char *y = j->y + off * (int64_t)ts;
    int kind = block_kind(j->c, use_inv);
    if (j->c->b.nthr > 0 && j->c->tdt == T_F32 && (bs % BLOCK_G == 0 || n <= bs) && j->c->b.thr_lo)
        thrq_chunk(j->c, (const float *)x, (float *)y, n, bs, sc, iv, bad, key ? j->tab : NULL, key, j->base, idx0,
                   und);
    else if (j->c->b.nthr > 0 && j->c->tdt == T_F32 && (bs % BLOCK_G == 0 || n <= bs))
        thresh_chunk(j->c, (const float *)x, (float *)y, n, bs, sc, bad, key ? j->tab : NULL, key);
    else if (j->c->wdt) block_chunk_f64(j->c, x, y, n, bs, sc, iv, bad, kind, j->base, idx0, least, und);
    else block_chunk_f32(j->c, x, y, n, bs, sc, iv, bad, kind, j->base, idx0, least, und);
    if (j->c->b.sat_dtype && x != y && !below_dtype_max(j->c, n, bs, sc, bad))
        *und += count_overflow(x, y, j->c->tdt, n);
}

/* one long block (more than BLOCK_CHUNK elements) of a row, scale known: chunk by chunk */
static void long_block(const block_job *j, int64_t off, int64_t n, uint64_t idx0, int bad, double sc,
                       double iv, int64_t *und) {
    for (int64_t o = 0; o < n; o += BLOCK_CHUNK) {
        int64_t m = n - o < BLOCK_CHUNK ? n - o : BLOCK_CHUNK;
        chunk(j, off + o, m, m, &sc, &iv, &bad, NULL, iv != 0.0, idx0 + (uint64_t)o, NULL, und);
    }
}

/* many blocks: each part takes whole blocks, a chunk of them at a time (amax, scales, elements) */
static void blocks_task(void *ctx, int part, int parts) {
    block_job *j = (block_job *)ctx;
    const int tdt = j->c->tdt;
    const size_t ts = any_tsize[tdt];
    const int64_t bs = j->bs;
    int64_t *und = &j->und[part][0];
    int64_t g = j->blocks * part / parts, g1 = j->blocks * (part + 1) / parts;
    double sc[BLOCK_CHUNK], iv[BLOCK_CHUNK];
    int bad[BLOCK_CHUNK];
    const int want_least = block_wants_least(j->c, bs);
    while (g < g1) {
        int64_t row = g / j->nblocks, blk = g % j->nblocks, start = blk * bs;
        int64_t off = row * j->len + start;
        uint64_t idx0 = (uint64_t)(row * j->nblocks * bs + start); /* padded row-major index */
        if (bs > BLOCK_CHUNK) {
            int64_t n = j->len - start < bs ? j->len - start : bs;
            int b;
            double s, v;
            block_values(j, amax_bits(j->x + off * (int64_t)ts, tdt, n, 0), &b, &s, &v);
            long_block(j, off, n, idx0, b, s, v, und);
            g++;
            continue;
        }
        int64_t nb = BLOCK_CHUNK / bs;
        nb = nb < j->nblocks - blk ? nb : j->nblocks - blk;
        nb = nb < g1 - g ? nb : g1 - g;
        int64_t n = nb * bs < j->len - start ? nb * bs : j->len - start;
        int use_inv = 1;
        uint64_t bits[BLOCK_CHUNK], least_bits[BLOCK_CHUNK];
        int32_t key[BLOCK_CHUNK];
        uint64_t *least = want_least && !j->bam ? least_bits : NULL;
        if (j->bam)
            for (int64_t b = 0; b < nb; b++) bits[b] = j->bam[g + b];
        else
            blocks_amax(j->x + off * (int64_t)ts, tdt, n, bs, bits, least);
        blocks_scales(j, bits, nb, sc, iv, bad, key);
        if (j->c->b.pow2)
            for (int64_t b = 0; b < nb; b++) use_inv &= iv[b] != 0.0;
        chunk(j, off, n, bs, sc, iv, bad, j->tab ? key : NULL, use_inv, idx0, least, und);
        g += nb;
    }
}

/* NVFP4's first pass: every block's amax bits into j->bam, and the finite amax of the part (blocks
   holding inf or NaN are read again without those), for the tensor scale; the second pass
   (blocks_task) then reads x once more instead of twice */
static void bamax_task(void *ctx, int part, int parts) {
    block_job *j = (block_job *)ctx;
    const int tdt = j->c->tdt;
    const size_t ts = any_tsize[tdt];
    const int64_t bs = j->bs;
    const uint64_t inf = any_inf_bits[tdt];
    int64_t g = j->blocks * part / parts, g1 = j->blocks * (part + 1) / parts;
    uint64_t top = 0;
    while (g < g1) {
        int64_t row = g / j->nblocks, blk = g % j->nblocks, start = blk * bs;
        int64_t off = row * j->len + start;
        int64_t nb = BLOCK_CHUNK / bs;
        nb = nb < j->nblocks - blk ? nb : j->nblocks - blk;
        nb = nb < g1 - g ? nb : g1 - g;
        int64_t n = nb * bs < j->len - start ? nb * bs : j->len - start;
        uint64_t bits[BLOCK_CHUNK];
        int any_bad = 0;
        blocks_amax(j->x + off * (int64_t)ts, tdt, n, bs, bits, NULL);
        for (int64_t b = 0; b < nb; b++) { /* the arithmetic mask of amax_bits: this vectorises */
            const uint64_t u = bits[b], ok = (uint64_t)0 - (uint64_t)(u < inf);
            j->bam[g + b] = (uint32_t)u;
            any_bad |= u >= inf;
            top = (u & ok) > top ? (u & ok) : top;
        }
        for (int64_t b = 0; any_bad && b < nb; b++) {
            if (bits[b] < inf) continue;
            const int64_t s = b * bs, m = n - s < bs ? n - s : bs;
            const uint64_t u = amax_bits(j->x + (off + s) * (int64_t)ts, tdt, m, 1);
            top = u > top ? u : top;
        }
        g += nb;
    }
    j->bits[part][0] = top;
}

/* a range of a large extent [cur_off, cur_off + cur_n): its amax bits, or its elements */
static void amax_task(void *ctx, int part, int parts) {
    block_job *j = (block_job *)ctx;
    int64_t b, e;
    pool_range(j->cur_n, part, parts, &b, &e);
    size_t ts = any_tsize[j->c->tdt];
    j->bits[part][0] = e > b ? amax_bits(j->x + (j->cur_off + b) * (int64_t)ts, j->c->tdt, e - b, j->finite_only) : 0;
}

static void elements_task(void *ctx, int part, int parts) {
    block_job *j = (block_job *)ctx;
    int64_t b, e;
    pool_range(j->cur_n, part, parts, &b, &e);
    if (e > b)
        long_block(j, j->cur_off + b, e - b, j->cur_idx + (uint64_t)b, j->cur_bad, j->cur_sc, j->cur_iv,
                   &j->und[part][0]);
}

static uint64_t parallel_amax(block_job *j, int64_t off, int64_t n, int finite_only, int parts) {
    j->cur_off = off;
    j->cur_n = n;
    j->finite_only = finite_only;
    pool_run(amax_task, j, parts);
    uint64_t m = 0;
    for (int p = 0; p < parts; p++) m = j->bits[p][0] > m ? j->bits[p][0] : m;
    return m;
}

/* Round a block format: rows of `len` elements (the blocked axis, contiguous), blocks of
 * c->b.block_size along each row, the last one short (its padding is never read). */
int64_t anynum_round_blocks(const void *x, void *y, int64_t rows, int64_t len, const any_call *c,
                            uint64_t base, int32_t threads) {
    if (c->mode < 0 || c->mode >= M_COUNT || c->wdt < 0 || c->wdt > 1 || c->tdt < 0 || c->tdt > 3) return -1;
    if (c->b.elem_family != F_FLOAT && c->b.elem_family != F_UNIFORM) return -1;
    if (c->wdt == 0 && (c->b.rule == R_AMAX && !c->b.pow2)) return -1; /* float64 only */
    if (rows <= 0 || len <= 0) return 0;
    block_job j;
    memset(&j, 0, sizeof j);
    j.c = c;
    j.x = (const char *)x;
    j.y = (char *)y;
    j.rows = rows;
    j.len = len;
    j.bs = c->b.block_size > 0 ? c->b.block_size : len;
    j.nblocks = (len + j.bs - 1) / j.bs;
    j.blocks = rows * j.nblocks;
    j.base = base;
    j.tscale = 1.0;
    int64_t total = rows * len;
    int parts = pool_parts(total, c->grain, threads);
    if (c->b.tensor_scale && c->tdt != T_F64 && j.blocks >= parts && j.bs <= BLOCK_CHUNK)
        j.bam = (uint32_t *)malloc((size_t)j.blocks * sizeof(uint32_t)); /* NULL: two amax passes */
    if (c->b.tensor_scale) { /* NVFP4: the per-tensor scale from the finite amax of everything */
        uint64_t top = 0;
        if (j.bam) {
            pool_run(bamax_task, &j, parts);
            for (int p = 0; p < parts; p++) top = j.bits[p][0] > top ? j.bits[p][0] : top;
        } else {
            top = parallel_amax(&j, 0, total, 1, parts);
        }
        double amax_t = bits_value(top, c->tdt);
        double ts = round_up_into(&c->b.tensor_fmt, amax_t / c->b.tensor_den, c->b.tensor_min);
        j.tscale = amax_t > 0.0 ? ts : 1.0;
    }
    float tab[16 * (THR_KEYS + 1)];
    if (c->b.nthr > 0 && c->tdt == T_F32 && j.bs % BLOCK_G == 0 && j.bs <= BLOCK_CHUNK &&
        thr_key_map(&c->b, &j.km) && j.blocks >= 4 * j.km.n) {
        thr_table(&c->b, &j.km, j.tscale, tab); /* pays for itself over this many blocks */
        j.tab = tab;
    }
    if (j.blocks >= parts) {
        pool_run(blocks_task, &j, parts);
    } else { /* few, long blocks: each one's amax, then its elements, across all parts */
        for (int64_t g = 0; g < j.blocks; g++) {
            int64_t row = g / j.nblocks, blk = g % j.nblocks, start = blk * j.bs;
            int64_t n = len - start < j.bs ? len - start : j.bs;
            uint64_t bits = parallel_amax(&j, row * len + start, n, 0, parts);
            block_values(&j, bits, &j.cur_bad, &j.cur_sc, &j.cur_iv);
            j.cur_idx = (uint64_t)(row * j.nblocks * j.bs + start);
            pool_run(elements_task, &j, parts);
        }
    }
    free(j.bam);
    int64_t und = 0;
    for (int p = 0; p < parts; p++) und += j.und[p][0];
    return und;
}

/* The tensor scale NVFP4 would use for x (tests compare it with the eager kernel's). */
double anynum_block_tensor_scale(const void *x, int64_t n, const any_call *c, int32_t threads) {
    block_job j;
    memset(&j, 0, sizeof j);
    j.c = c;
    j.x = (const char *)x;
    double amax_t = bits_value(parallel_amax(&j, 0, n, 1, pool_parts(n, c->grain, threads)), c->tdt);
    double ts = round_up_into(&c->b.tensor_fmt, amax_t / c->b.tensor_den, c->b.tensor_min);
    return amax_t > 0.0 ? ts : 1.0;
}

/* The block quotients BK_RCP forms, q[i] = fl(x[i] / s[i]) from fl(1 / s[i]) (tests compare them
   with float64 division). */
void anynum_block_quotients(const float *x, const double *s, int64_t n, double *q) {
    for (int64_t i = 0; i < n; i++) q[i] = rcp_div_f64((double)x[i], s[i], 1.0 / s[i]);
}
