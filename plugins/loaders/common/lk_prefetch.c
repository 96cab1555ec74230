/* lk_prefetch.c - the loaders' prefetch engine (loader_kit.h): one
 * background thread that runs the loader's fill callback for one request at
 * a time (double buffering: the caller serves batches from one buffer while
 * the thread fills the other). The fill runs on the thread; its error
 * message is carried back to the caller's thread by lk_prefetch_wait. */
#include <stdio.h>
#include <string.h>

#include "loader_kit.h"

void lk_prefetch_init(lk_prefetch *p, lk_fill_fn fill, void *user) {
    memset(p, 0, sizeof *p);
    p->fill = fill;
    p->user = user;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
}

static void *prefetch_main(void *arg) {
    lk_prefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->pending && !p->quit)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit) break;
        int buf = p->buf, split = p->split;
        int64_t chunk = p->chunk;
        p->pending = false;
        p->busy = true;
        pthread_mutex_unlock(&p->mu);
        pl_status st = p->fill(p->user, buf, split, chunk);
        pthread_mutex_lock(&p->mu);
        p->status = st;
        if (st) snprintf(p->err, sizeof p->err, "%s", pl_error_message());
        p->busy = false;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

pl_status lk_prefetch_start(lk_prefetch *p, const char *plugin) {
    if (pthread_create(&p->th, NULL, prefetch_main, p) != 0)
        return pl_error_set(PL_ERR_INTERNAL, "%s: cannot start the prefetch thread", plugin);
    p->started = true;
    return PL_OK;
}

bool lk_prefetch_running(const lk_prefetch *p) {
    return p->started;
}

pl_status lk_prefetch_wait(lk_prefetch *p, double *wait_seconds) {
    if (!p->started) return PL_OK;
    double t0 = lk_now();
    pthread_mutex_lock(&p->mu);
    while (p->pending || p->busy)
        pthread_cond_wait(&p->cv, &p->mu);
    pl_status st = p->status;
    p->status = PL_OK;
    pthread_mutex_unlock(&p->mu);
    if (wait_seconds) *wait_seconds += lk_now() - t0;
    if (st) return pl_error_set(st, "%s", p->err);
    return PL_OK;
}

void lk_prefetch_request(lk_prefetch *p, int buf, int split, int64_t chunk) {
    if (!p->started) return;
    pthread_mutex_lock(&p->mu);
    p->buf = buf;
    p->split = split;
    p->chunk = chunk;
    p->pending = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void lk_prefetch_free(lk_prefetch *p) {
    if (p->started) {
        pthread_mutex_lock(&p->mu);
        p->quit = true;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->th, NULL);
        p->started = false;
    }
    if (p->fill) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        p->fill = NULL;
    }
}
