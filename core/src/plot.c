/* plot.c - render a run's metrics.csv as an SVG grid of line charts: one
 * panel per metric key, x = optimizer step, linear y axis with min/max
 * labels. SVG is plain text, so no plotting library is needed. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plot.h"

#define MAX_SERIES 48

typedef struct series {
    char key[64];
    double *x, *y;
    int n, cap;
} series;

static series *find_series(series *s, int *ns, const char *key) {
    for (int i = 0; i < *ns; i++)
        if (!strcmp(s[i].key, key)) return &s[i];
    if (*ns == MAX_SERIES) return NULL;
    series *r = &s[(*ns)++];
    memset(r, 0, sizeof *r);
    snprintf(r->key, sizeof r->key, "%s", key);
    return r;
}

static int push(series *s, double x, double y) {
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 64;
        double *nx = realloc(s->x, sizeof(double) * (size_t)nc);
        if (!nx) return -1;
        s->x = nx;
        double *ny = realloc(s->y, sizeof(double) * (size_t)nc);
        if (!ny) return -1;
        s->y = ny;
        s->cap = nc;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return 0;
}

pl_status pl_plot_run(const char *run_dir, const char *out, char *written, size_t wn) {
    char path[4096], outp[4096];
    snprintf(path, sizeof path, "%s/metrics.csv", run_dir);
    FILE *f = fopen(path, "r");
    if (!f) return pl_error_set(PL_ERR_IO, "%s: %s (is %s a run directory?)", path,
                                strerror(errno), run_dir);
    series s[MAX_SERIES];
    int ns = 0;
    char line[512];
    int lineno = 0;
    pl_status st = PL_OK;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (lineno == 1) {
            if (strncmp(line, "step,epoch,key,value", 20)) {
                st = pl_error_set(PL_ERR_IO, "%s:1: header is not 'step,epoch,key,value'", path);
                break;
            }
            continue;
        }
        char key[64];
        double step, epoch, v;
        if (sscanf(line, "%lf,%lf,%63[^,],%lf", &step, &epoch, key, &v) != 4) {
            st = pl_error_set(PL_ERR_IO, "%s:%d: expected step,epoch,key,value", path, lineno);
            break;
        }
        if (!isfinite(v)) continue;
        series *se = find_series(s, &ns, key);
        if (se && push(se, step, v)) {
            st = pl_error_set(PL_ERR_NOMEM, "plot: out of memory");
            break;
        }
    }
    fclose(f);
    if (!st && ns == 0) st = pl_error_set(PL_ERR_IO, "%s: no metric rows to plot", path);
    if (!st) {
        snprintf(outp, sizeof outp, "%s", out ? out : "");
        if (!out) snprintf(outp, sizeof outp, "%s/plot.svg", run_dir);
        FILE *o = fopen(outp, "w");
        if (!o) {
            st = pl_error_set(PL_ERR_IO, "%s: %s", outp, strerror(errno));
        } else {
            const int cols = 3, pw = 360, ph = 220, m = 40;
            int rows = (ns + cols - 1) / cols;
            fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                       "font-family=\"sans-serif\" font-size=\"11\">\n"
                       "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                    cols * pw, rows * ph);
            for (int k = 0; k < ns; k++) {
                series *se = &s[k];
                int ox = (k % cols) * pw, oy = (k / cols) * ph;
                double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
                for (int i = 0; i < se->n; i++) {
                    x0 = fmin(x0, se->x[i]);
                    x1 = fmax(x1, se->x[i]);
                    y0 = fmin(y0, se->y[i]);
                    y1 = fmax(y1, se->y[i]);
                }
                if (x1 <= x0) x1 = x0 + 1;
                if (y1 <= y0) y1 = y0 + (y0 ? fabs(y0) * 0.1 : 1);
                int w = pw - 2 * m, h = ph - 2 * m;
                fprintf(o, "<g transform=\"translate(%d,%d)\">\n", ox, oy);
                fprintf(o, "<text x=\"%d\" y=\"18\" font-weight=\"bold\">%s</text>\n", m, se->key);
                fprintf(o, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
                           "stroke=\"#999\"/>\n", m, m - 10, w, h);
                fprintf(o, "<text x=\"2\" y=\"%d\">%.3g</text>\n", m - 6, y1);
                fprintf(o, "<text x=\"2\" y=\"%d\">%.3g</text>\n", m - 10 + h, y0);
                fprintf(o, "<text x=\"%d\" y=\"%d\">step %.0f</text>\n", m, ph - 12, x0);
                fprintf(o, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.0f</text>\n", m + w,
                        ph - 12, x1);
                fprintf(o, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" "
                           "points=\"");
                for (int i = 0; i < se->n; i++)
                    fprintf(o, "%.1f,%.1f ", m + (se->x[i] - x0) / (x1 - x0) * w,
                            m - 10 + h - (se->y[i] - y0) / (y1 - y0) * h);
                fprintf(o, "\"/>\n</g>\n");
            }
            fprintf(o, "</svg>\n");
            if (fclose(o)) st = pl_error_set(PL_ERR_IO, "%s: %s", outp, strerror(errno));
            if (written) snprintf(written, wn, "%s", outp);
        }
    }
    for (int k = 0; k < ns; k++) {
        free(s[k].x);
        free(s[k].y);
    }
    return st;
}
