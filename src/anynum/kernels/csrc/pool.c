/* A small persistent thread pool (pthreads, no OpenMP: torch has its own runtime in this
 * process, and a second one would oversubscribe the cores).
 *
 * The calling thread runs part 0 of a job; part w (w >= 1) goes to worker w through its own
 * mailbox (a ticket counter), so a worker that is not needed never sees the job. A worker spins
 * for up to 50 us after a job only while jobs come that close together (a loop of calls: a
 * sleeping thread takes tens of microseconds to wake), and otherwise sleeps on a condition
 * variable at once: between calls that are far apart, torch's own threads run (a training step's
 * convolutions), and on a machine with as many cores as threads a spinning worker takes a core
 * from them (a QAT step on 2 cores measured 1.30x the fp32 step with every worker spinning
 * after each job and 1.25x with none).
 * Results never depend on the number of parts: every element's value is a function of the
 * element and its index only. After fork() the child starts a pool of its own.
 */
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAX 64
#define POOL_SPIN_NS 50000 /* how long a worker spins, and the gap between jobs that makes it spin */

typedef void (*pool_task)(void *ctx, int part, int parts);

typedef struct {
    uint64_t ticket; /* bumped by the caller: a new job for this worker */
    uint64_t done;   /* set to ticket by the worker when its part is finished */
    int sleeping;
    pthread_cond_t cv;
    char pad[64];
} pool_slot;

static struct {
    pthread_mutex_t mu;
    pid_t pid;
    int workers; /* started so far */
    pool_task task;
    void *ctx;
    int parts;
    pool_slot slot[POOL_MAX];
} pool = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, 0, {{0}}};

static pthread_mutex_t pool_start_mu = PTHREAD_MUTEX_INITIALIZER;

ANY_INLINE void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t pool_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *pool_worker(void *arg) {
    int w = (int)(intptr_t)arg;
    pool_slot *s = &pool.slot[w];
    /* 0, not the ticket's current value: the caller may post this worker's first job before the
       thread gets to run, and that job must not be taken for an old one */
    uint64_t seen = 0;
    int spin = 0;         /* whether the last job came within POOL_SPIN_NS of the one before */
    int64_t finished = 0; /* when the last job was done */
    for (;;) {
        uint64_t t = seen;
        if (spin) {
            int64_t until = finished + POOL_SPIN_NS;
            for (int i = 1; t == seen; i++) {
                cpu_relax();
                t = __atomic_load_n(&s->ticket, __ATOMIC_ACQUIRE);
                if (!(i & 63) && pool_now_ns() > until) break;
            }
        }
        if (t == seen) {
            pthread_mutex_lock(&pool.mu);
            __atomic_store_n(&s->sleeping, 1, __ATOMIC_SEQ_CST);
            while ((t = __atomic_load_n(&s->ticket, __ATOMIC_SEQ_CST)) == seen)
                pthread_cond_wait(&s->cv, &pool.mu);
            __atomic_store_n(&s->sleeping, 0, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = t;
        spin = pool_now_ns() - finished < POOL_SPIN_NS;
        pool.task(pool.ctx, w, pool.parts);
        __atomic_store_n(&s->done, t, __ATOMIC_RELEASE);
        finished = pool_now_ns();
    }
    return 0;
}

/* Make sure workers 1 .. parts-1 exist (in this process); returns how many parts can run. */
static int pool_ensure(int parts) {
    if (parts > POOL_MAX) parts = POOL_MAX;
    pid_t pid = getpid();
    if (__atomic_load_n(&pool.pid, __ATOMIC_ACQUIRE) == pid && pool.workers >= parts - 1) return parts;
    pthread_mutex_lock(&pool_start_mu);
    if (pool.pid != pid) { /* first use, or a forked child: the parent's workers are not here */
        pthread_mutex_init(&pool.mu, 0);
        memset(pool.slot, 0, sizeof pool.slot);
        pool.workers = 0;
        __atomic_store_n(&pool.pid, pid, __ATOMIC_RELEASE);
    }
    while (pool.workers < parts - 1) {
        int w = pool.workers + 1;
        pthread_cond_init(&pool.slot[w].cv, 0);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_t th;
        int err = pthread_create(&th, &attr, pool_worker, (void *)(intptr_t)w);
        pthread_attr_destroy(&attr);
        if (err) break;
        pool.workers = w;
    }
    int can = pool.workers + 1;
    pthread_mutex_unlock(&pool_start_mu);
    return parts < can ? parts : can;
}

/* One caller at a time runs jobs (Python threads may call concurrently: they queue here). */
static pthread_mutex_t pool_job_mu = PTHREAD_MUTEX_INITIALIZER;

/* torch's own OpenMP team, through the entry points `#pragma omp parallel` compiles to (libgomp's
 * ABI, which Intel's and LLVM's runtimes also export): weak references, which resolve to the
 * runtime torch loaded into the process's global scope, and are null where there is none (then
 * anynum_use_torch_team declines). Not through -fopenmp: that needs OpenMP's development files,
 * which a machine with a C compiler may lack, and would link a runtime of its own. ELF only:
 * elsewhere a weak reference to a symbol no library names does not link. */
#if defined(__linux__)
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) __attribute__((weak));
int omp_get_thread_num(void) __attribute__((weak));
int omp_get_num_threads(void) __attribute__((weak));
#define POOL_HAS_TEAM() (GOMP_parallel != 0 && omp_get_thread_num != 0 && omp_get_num_threads != 0)
#else
#define POOL_HAS_TEAM() 0
#endif

/* Whether jobs run on torch's team, and the process that said so: in a child forked after an
 * OpenMP region the team stayed behind in the parent and never assembles (any parallel region
 * hangs, torch's own too), so a child uses this pool. Set where torch's threads spin between
 * its regions, which a worker of this pool would compete with for the cores
 * (anynum.kernels.clib.torch_threads_spin has the rule and its measurements). */
static int pool_team = 0;
static pid_t pool_team_pid = 0;

int anynum_use_torch_team(int on) {
    on = on && POOL_HAS_TEAM();
    __atomic_store_n(&pool_team_pid, getpid(), __ATOMIC_RELAXED);
    __atomic_store_n(&pool_team, on, __ATOMIC_RELEASE);
    return on;
}

int anynum_torch_team(void) {
    return __atomic_load_n(&pool_team, __ATOMIC_ACQUIRE) && __atomic_load_n(&pool_team_pid, __ATOMIC_RELAXED) == getpid();
}

typedef struct {
    pool_task task;
    void *ctx;
    int parts;
} team_job;

#if defined(__linux__)
/* One thread of the team: the parts its number selects, striding by the team's size (a team of
 * one, inside another parallel region, runs them all). */
static void team_member(void *data) {
    const team_job *job = (const team_job *)data;
    const int team = omp_get_num_threads();
    for (int p = omp_get_thread_num(); p < job->parts; p += team) job->task(job->ctx, p, job->parts);
}
#endif

static void pool_run(pool_task task, void *ctx, int parts) {
#if defined(__linux__)
    if (parts > 1 && anynum_torch_team()) {
        /* OpenMP's default team: the thread count torch sets (as at::parallel_for leaves it; a
           num_threads clause makes libgomp rebuild its pool, pytorch#32008) */
        team_job job = {task, ctx, parts};
        GOMP_parallel(team_member, &job, 0, 0);
        return;
    }
#endif
    if (parts > 1) parts = pool_ensure(parts);
    if (parts <= 1) {
        task(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool_job_mu);
    pool.task = task;
    pool.ctx = ctx;
    pool.parts = parts;
    uint64_t tickets[POOL_MAX];
    for (int w = 1; w < parts; w++) {
        pool_slot *s = &pool.slot[w];
        tickets[w] = __atomic_add_fetch(&s->ticket, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&s->sleeping, __ATOMIC_SEQ_CST)) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&s->cv);
            pthread_mutex_unlock(&pool.mu);
        }
    }
    task(ctx, 0, parts);
    for (int w = 1; w < parts; w++) {
        pool_slot *s = &pool.slot[w];
        int spins = 0;
        while (__atomic_load_n(&s->done, __ATOMIC_ACQUIRE) != tickets[w]) {
            if (++spins < 1 << 16) cpu_relax();
            else sched_yield(); /* the worker lost its core: give it ours */
        }
    }
    pthread_mutex_unlock(&pool_job_mu);
}

/* pool_run for tests: parts 0 .. parts-1 of `task`, each once, on the threads the library uses. */
void anynum_run_parts(pool_task task, void *ctx, int parts) { pool_run(task, ctx, parts < 1 ? 1 : parts); }

/* Even split of [0, n) into `parts` ranges, boundaries on multiples of 64 elements. */
ANY_INLINE void pool_range(int64_t n, int part, int parts, int64_t *begin, int64_t *end) {
    int64_t chunks = (n + 63) / 64;
    int64_t b = chunks * part / parts * 64, e = chunks * (part + 1) / parts * 64;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}

/* Parts for n elements: at most `threads` and POOL_MAX (the callers keep a slot of results per
 * part), each of at least `grain` elements. */
ANY_INLINE int pool_parts(int64_t n, int64_t grain, int threads) {
    int64_t parts = grain > 0 ? n / grain : n;
    if (parts > threads) parts = threads;
    if (parts > POOL_MAX) parts = POOL_MAX;
    return parts < 1 ? 1 : (int)parts;
}
