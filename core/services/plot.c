/* plot.c - render runs' metrics.csv as an SVG grid of charts (see plot.h).
 *
 * Keys are grouped into panels by what they measure: `train_loss`,
 * `epoch_train_loss`, `val_loss` and `test_loss` share the panel "loss", so
 * overfitting shows at a glance; `val_mae` and `test_mae` share "mae"; keys
 * without a split prefix (lr, grad_norm, step_seconds, ...) have a panel each.
 * Within a panel the split is the line style (train solid, per-epoch train
 * thin, validation dashed, test a marked point: a single value is a point,
 * never an empty box) and, when several runs are compared, the run is the
 * colour. SVG is plain text, so no plotting library is needed. */
#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plot.h"
#include "pipeline/file.h"

#define MAX_SERIES 256
#define MAX_PANELS 48
#define MAX_RUNS 8

/* the split prefixes, in legend order; "" = a key without one */
static const char *const k_split[] = {"train_", "epoch_train_", "val_", "test_", ""};
#define N_SPLIT 5

typedef struct series {
    char panel[64]; /* key without its split prefix */
    int split;      /* index into k_split */
    int run;
    double *x, *y;
    int n, cap;
} series;

typedef struct plot {
    series s[MAX_SERIES];
    int ns;
    char panel[MAX_PANELS][64];
    int np;
} plot;

static void split_key(const char *key, char *panel, size_t n, int *split) {
    /* "epoch_train_loss" does not start with "train_", so the order is free */
    for (int k = 0; k < N_SPLIT - 1; k++) {
        size_t l = strlen(k_split[k]);
        if (!strncmp(key, k_split[k], l) && key[l]) {
            snprintf(panel, n, "%s", key + l);
            *split = k;
            return;
        }
    }
    snprintf(panel, n, "%s", key);
    *split = N_SPLIT - 1;
}

static series *find_series(plot *p, const char *key, int run) {
    char panel[64];
    int split;
    split_key(key, panel, sizeof panel, &split);
    for (int i = 0; i < p->ns; i++)
        if (p->s[i].run == run && p->s[i].split == split && !strcmp(p->s[i].panel, panel))
            return &p->s[i];
    if (p->ns == MAX_SERIES) return NULL;
    int pi = 0;
    while (pi < p->np && strcmp(p->panel[pi], panel)) pi++;
    if (pi == p->np) {
        if (p->np == MAX_PANELS) return NULL;
        snprintf(p->panel[p->np++], sizeof p->panel[0], "%s", panel);
    }
    series *r = &p->s[p->ns++];
    memset(r, 0, sizeof *r);
    snprintf(r->panel, sizeof r->panel, "%s", panel);
    r->split = split;
    r->run = run;
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

static pl_status read_run(plot *p, const char *run_dir, int run) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.csv", run_dir);
    FILE *f = pl_file_fopen_read(path, NULL);
    if (!f && !errno) return pl_error_status(); /* not a regular file: said which type */
    if (!f)
        return pl_error_set(PL_ERR_IO, "%s: %s (is %s a run directory?)", path, strerror(errno),
                            run_dir);
    char line[512];
    int lineno = 0, rows = 0;
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
        series *se = find_series(p, key, run);
        if (!se) {
            st = pl_error_set(PL_ERR_INVALID, "%s:%d: more than %d curves or %d panels to plot",
                              path, lineno, MAX_SERIES, MAX_PANELS);
            break;
        }
        if (push(se, step, v)) {
            st = pl_error_set(PL_ERR_NOMEM, "plot: out of memory");
            break;
        }
        rows++;
    }
    fclose(f);
    if (!st && rows == 0) st = pl_error_set(PL_ERR_IO, "%s: no metric rows to plot", path);
    return st;
}

/* colours per run (Tableau 10), per split when one run */
static const char *const k_run_colour[MAX_RUNS] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                   "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
static const char *const k_split_colour[N_SPLIT] = {"#1f77b4", "#9ecae1", "#ff7f0e", "#d62728",
                                                    "#1f77b4"};
static const char *const k_split_name[N_SPLIT] = {"train", "train (epoch mean)", "val", "test",
                                                  ""};

static const char *colour(const series *s, int nruns) {
    return nruns > 1 ? k_run_colour[s->run % MAX_RUNS] : k_split_colour[s->split];
}

static void write_svg(FILE *o, const plot *p, const char *const *names, int nruns) {
    const int cols = 3, pw = 380, ph = 240, m = 44, legend = 16 * (nruns > 1 ? nruns : 0) + 8;
    int rows = (p->np + cols - 1) / cols;
    fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            cols * pw, rows * ph + legend);
    /* runs legend (compare mode): colour = run */
    for (int r = 0; r < nruns && nruns > 1; r++)
        fprintf(o, "<g class=\"run\"><line x1=\"10\" y1=\"%d\" x2=\"34\" y2=\"%d\" stroke=\"%s\" "
                   "stroke-width=\"2\"/><text x=\"40\" y=\"%d\">%s</text></g>\n",
                12 + 16 * r, 12 + 16 * r, k_run_colour[r % MAX_RUNS], 16 + 16 * r, names[r]);
    for (int k = 0; k < p->np; k++) {
        int ox = (k % cols) * pw, oy = legend + (k / cols) * ph;
        double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
        for (int i = 0; i < p->ns; i++) {
            const series *se = &p->s[i];
            if (strcmp(se->panel, p->panel[k])) continue;
            for (int j = 0; j < se->n; j++) {
                x0 = fmin(x0, se->x[j]);
                x1 = fmax(x1, se->x[j]);
                y0 = fmin(y0, se->y[j]);
                y1 = fmax(y1, se->y[j]);
            }
        }
        if (x1 <= x0) x1 = x0 + 1;
        if (y1 <= y0) y1 = y0 + (y0 ? fabs(y0) * 0.1 : 1);
        int w = pw - 2 * m, h = ph - 2 * m - 12;
        fprintf(o, "<g class=\"panel\" transform=\"translate(%d,%d)\">\n", ox, oy);
        fprintf(o, "<text x=\"%d\" y=\"18\" font-weight=\"bold\">%s</text>\n", m, p->panel[k]);
        fprintf(o, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
                   "stroke=\"#999\"/>\n", m, m - 10, w, h);
        fprintf(o, "<text x=\"2\" y=\"%d\">%.4g</text>\n", m - 6, y1);
        fprintf(o, "<text x=\"2\" y=\"%d\">%.4g</text>\n", m - 10 + h, y0);
        fprintf(o, "<text x=\"%d\" y=\"%d\">step %.0f</text>\n", m, m + h + 4, x0);
        fprintf(o, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.0f</text>\n", m + w, m + h + 4,
                x1);
        /* split legend of this panel, under the axis */
        int lx = m;
        for (int sp = 0; sp < N_SPLIT; sp++) {
            bool has = false;
            for (int i = 0; i < p->ns && !has; i++)
                has = p->s[i].split == sp && !strcmp(p->s[i].panel, p->panel[k]);
            if (!has || !k_split_name[sp][0]) continue;
            const char *dash = sp == 2 ? " stroke-dasharray=\"5,3\"" : "";
            const char *c = nruns > 1 ? "#444" : k_split_colour[sp];
            if (sp == 3)
                fprintf(o, "<circle cx=\"%d\" cy=\"%d\" r=\"3.5\" fill=\"%s\"/>", lx + 8,
                        ph - 14, c);
            else
                fprintf(o, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                           "stroke-width=\"%s\"%s/>", lx, ph - 14, lx + 18, ph - 14, c,
                        sp == 1 ? "1" : "1.5", dash);
            fprintf(o, "<text x=\"%d\" y=\"%d\">%s</text>\n", lx + 22, ph - 10, k_split_name[sp]);
            lx += 30 + 6 * (int)strlen(k_split_name[sp]);
        }
        for (int i = 0; i < p->ns; i++) {
            const series *se = &p->s[i];
            if (strcmp(se->panel, p->panel[k])) continue;
            const char *c = colour(se, nruns);
#define PX(j) (m + (se->x[j] - x0) / (x1 - x0) * w)
#define PY(j) (m - 10 + h - (se->y[j] - y0) / (y1 - y0) * h)
            if (se->split == 3 || se->n == 1) {
                /* test values and single points: marked points, value written beside */
                for (int j = 0; j < se->n; j++)
                    fprintf(o, "<circle class=\"point\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" "
                               "fill=\"%s\"><title>%s%s = %.6g</title></circle>"
                               "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" text-anchor=\"end\">"
                               "%.4g</text>\n",
                            PX(j), PY(j), c, k_split[se->split], se->panel, se->y[j], PX(j) - 5,
                            PY(j) - 5, c, se->y[j]);
                continue;
            }
            fprintf(o, "<polyline class=\"curve\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s "
                       "points=\"",
                    c, se->split == 1 ? "1" : "1.5",
                    se->split == 2 ? " stroke-dasharray=\"5,3\"" : "");
            for (int j = 0; j < se->n; j++) fprintf(o, "%.1f,%.1f ", PX(j), PY(j));
            fprintf(o, "\"><title>%s%s</title></polyline>\n", k_split[se->split], se->panel);
#undef PX
#undef PY
        }
        fprintf(o, "</g>\n");
    }
    fprintf(o, "</svg>\n");
}

pl_status pl_plot_runs(const char *const *run_dirs, int n, const char *out, char *written,
                       size_t wn) {
    if (n < 1 || n > MAX_RUNS)
        return pl_error_set(PL_ERR_INVALID, "plot: %d runs given, expected 1 to %d", n, MAX_RUNS);
    plot *p = calloc(1, sizeof *p);
    if (!p) return pl_error_set(PL_ERR_NOMEM, "plot: out of memory");
    pl_status st = PL_OK;
    for (int r = 0; r < n && !st; r++) st = read_run(p, run_dirs[r], r);
    char outp[4096];
    if (!st) {
        if (out)
            snprintf(outp, sizeof outp, "%s", out);
        else
            snprintf(outp, sizeof outp, "%s/%s", run_dirs[0], n > 1 ? "compare.svg" : "plot.svg");
        /* temporary name, then rename: a half-written picture never replaces a good one */
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", outp);
        FILE *o = fopen(tmp, "w");
        if (!o) {
            st = pl_error_set(PL_ERR_IO, "%s: %s", tmp, strerror(errno));
        } else {
            write_svg(o, p, run_dirs, n);
            if (fclose(o) || rename(tmp, outp)) {
                st = pl_error_set(PL_ERR_IO, "%s: %s", outp, strerror(errno));
                remove(tmp);
            }
            if (!st && written) snprintf(written, wn, "%s", outp);
        }
    }
    for (int k = 0; k < p->ns; k++) {
        free(p->s[k].x);
        free(p->s[k].y);
    }
    free(p);
    return st;
}

pl_status pl_plot_run(const char *run_dir, const char *out, char *written, size_t wn) {
    return pl_plot_runs(&run_dir, 1, out, written, wn);
}
