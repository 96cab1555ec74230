/* png.c - `pipeline plot ... OUT.png`: the plot's SVG rendered to PNG.
 *
 * The curves are drawn once, as SVG (core/services/plot.c); a PNG is that SVG
 * rendered by librsvg onto a cairo image surface, so the two formats never
 * disagree. librsvg is optional at build time (pkg-config librsvg-2.0): a
 * build without it says so when asked for a PNG. */
#include "png.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pipeline/status.h"

bool pl_png_wanted(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return n >= 4 && strcasecmp(path + n - 4, ".png") == 0;
}

#ifdef PL_HAVE_RSVG
#include <cairo.h>
#include <dlfcn.h>
#include <librsvg/rsvg.h>

/* librsvg (and through it cairo, GLib) is loaded when a PNG is asked for, not
 * linked: linked, its ~80 libraries were mapped into every `pipeline run`,
 * whose thread-local storage then tripped GCC 12's LeakSanitizer at exit
 * (docs/security.md). The headers give the prototypes; dlsym on the librsvg
 * handle finds cairo's and GLib's functions among its dependencies. */
#define PL_RSVG_FNS(X)                                                                            \
    X(rsvg_handle_new_from_file)                                                                   \
    X(rsvg_handle_get_intrinsic_size_in_pixels)                                                    \
    X(rsvg_handle_render_document)                                                                 \
    X(g_error_free)                                                                                \
    X(g_object_unref)                                                                              \
    X(cairo_image_surface_create)                                                                  \
    X(cairo_create)                                                                                \
    X(cairo_scale)                                                                                 \
    X(cairo_destroy)                                                                               \
    X(cairo_surface_write_to_png)                                                                  \
    X(cairo_status_to_string)                                                                      \
    X(cairo_surface_destroy)
static struct {
#define PL_RSVG_FIELD(f) __typeof__(&f) f;
    PL_RSVG_FNS(PL_RSVG_FIELD)
#undef PL_RSVG_FIELD
} R;

static pl_status load_rsvg(void) {
    static void *lib;
    if (lib) return PL_OK;
    void *h = dlopen("librsvg-2.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return pl_error_set(PL_ERR_UNSUPPORTED, "PNG output needs librsvg-2.so.2, which cannot be "
                            "loaded (%s): install librsvg2-2, or write an .svg", dlerror());
#define PL_RSVG_LOAD(f)                                                                            \
    if (!(*(void **)&R.f = dlsym(h, #f))) {                                                        \
        dlclose(h);                                                                                \
        return pl_error_set(PL_ERR_UNSUPPORTED, "librsvg-2.so.2 has no %s: a librsvg older than "  \
                            "2.52 (write an .svg)", #f);                                           \
    }
    PL_RSVG_FNS(PL_RSVG_LOAD)
#undef PL_RSVG_LOAD
    lib = h;
    return PL_OK;
}

/* Render `svg_path` at `scale` device pixels per SVG pixel into `png_path`
 * through `png_path`.tmp. */
static pl_status render(const char *svg_path, const char *png_path, double scale) {
    pl_status st = load_rsvg();
    if (st) return st;
    GError *err = NULL;
    RsvgHandle *h = R.rsvg_handle_new_from_file(svg_path, &err);
    if (!h) {
        st = pl_error_set(PL_ERR_IO, "%s: librsvg cannot read the plot's SVG: %s", svg_path,
                          err ? err->message : "unknown error");
        if (err) R.g_error_free(err);
        return st;
    }
    double w = 0, hgt = 0;
    if (!R.rsvg_handle_get_intrinsic_size_in_pixels(h, &w, &hgt) || w < 1 || hgt < 1 ||
        w * scale > 16384 || hgt * scale > 16384) {
        R.g_object_unref(h);
        return pl_error_set(PL_ERR_INVALID, "%s: the plot's SVG has no usable size (%gx%g px)",
                            svg_path, w, hgt);
    }
    cairo_surface_t *s = R.cairo_image_surface_create(CAIRO_FORMAT_ARGB32,
                                                      (int)(w * scale + 0.5),
                                                      (int)(hgt * scale + 0.5));
    cairo_t *cr = R.cairo_create(s);
    R.cairo_scale(cr, scale, scale);
    RsvgRectangle vp = {0, 0, w, hgt};
    if (!R.rsvg_handle_render_document(h, cr, &vp, &err)) {
        st = pl_error_set(PL_ERR_IO, "%s: librsvg cannot render the plot: %s", svg_path,
                          err ? err->message : "unknown error");
        if (err) R.g_error_free(err);
    }
    R.cairo_destroy(cr);
    R.g_object_unref(h);
    if (!st) {
        /* temporary name, then rename: a half-written picture never replaces a good one */
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", png_path);
        cairo_status_t cs = R.cairo_surface_write_to_png(s, tmp);
        if (cs != CAIRO_STATUS_SUCCESS) {
            st = pl_error_set(PL_ERR_IO, "%s: cannot write the PNG: %s", tmp,
                              R.cairo_status_to_string(cs));
            remove(tmp);
        } else if (rename(tmp, png_path)) {
            st = pl_error_set(PL_ERR_IO, "%s: cannot rename %s to it: %s", png_path, tmp,
                              strerror(errno));
            remove(tmp);
        }
    }
    R.cairo_surface_destroy(s);
    return st;
}
#endif

pl_status pl_png_plot(const char *const *run_dirs, int n, const char *png_path, char *written,
                      size_t wn) {
#ifndef PL_HAVE_RSVG
    (void)run_dirs;
    (void)n;
    (void)written;
    (void)wn;
    return pl_error_set(PL_ERR_UNSUPPORTED,
                        "%s: PNG output needs librsvg, and this pipeline was built without it "
                        "(install librsvg2-dev and rebuild, or write an .svg)",
                        png_path);
#else
    char svg[4200], dummy[4200];
    snprintf(svg, sizeof svg, "%s.%ld.svg", png_path, (long)getpid());
    /* the PNG's directory must take files: say so naming the PNG, not the intermediate */
    FILE *probe = fopen(svg, "w");
    if (!probe) return pl_error_set(PL_ERR_IO, "%s: cannot write here: %s", png_path, strerror(errno));
    fclose(probe);
    pl_status st = pl_plot_runs(run_dirs, n, svg, dummy, sizeof dummy);
    if (!st) st = render(svg, png_path, 2.0);
    remove(svg);
    if (!st) snprintf(written, wn, "%s", png_path);
    return st;
#endif
}
