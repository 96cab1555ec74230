/* param_groups.c - see param_groups.h. */
#include "param_groups.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct group_spec {
    char name[64];
    const char *match; /* borrowed from the config, NULL if unset */
    unsigned tags;
    char roles[PL_OPTIM_MAX_ROLES][PL_ROLE_MAX];
    int n_roles;
    bool has_tags;
    double lr_scale;     /* NAN: unset */
    double weight_decay; /* NAN: unset */
} group_spec;

static const struct {
    const char *name;
    unsigned bit;
} tag_names[] = {{"base", PL_TAG_BASE}, {"no_decay", PL_TAG_NO_DECAY}, {"buffer", PL_TAG_BUFFER}};

pl_status pl_optim_parse_tags(const char *s, unsigned *mask, char roles[][PL_ROLE_MAX],
                              int *n_roles) {
    *mask = 0;
    *n_roles = 0;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '|') p++;
        if (!*p) break;
        const char *e = p;
        while (*e && *e != ',' && *e != '|' && *e != ' ') e++;
        size_t len = (size_t)(e - p);
        bool found = false;
        for (size_t i = 0; i < sizeof tag_names / sizeof tag_names[0]; i++) {
            if (strlen(tag_names[i].name) == len && !strncmp(tag_names[i].name, p, len)) {
                *mask |= tag_names[i].bit;
                found = true;
            }
        }
        if (!found) { /* a role the model gives its parameters */
            if (*n_roles == PL_OPTIM_MAX_ROLES || len >= PL_ROLE_MAX)
                return pl_error_set(PL_ERR_CONFIG, "'%s': more than %d roles, or role '%.*s' longer "
                                    "than %d characters", s, PL_OPTIM_MAX_ROLES, (int)len, p,
                                    PL_ROLE_MAX - 1);
            memcpy(roles[*n_roles], p, len);
            roles[(*n_roles)++][len] = '\0';
        }
        p = e;
    }
    return PL_OK;
}

static double parse_double(const char *who, const char *key, const char *v, pl_status *st) {
    char *end = NULL;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end != '\0' || errno || !isfinite(d)) {
        *st = pl_error_set(PL_ERR_CONFIG, "%s: %s = '%s': expected a finite number", who, key, v);
        return NAN;
    }
    *st = PL_OK;
    return d;
}

/* Index of group `name` in specs, adding it if new; -1 on overflow. */
static int spec_index(group_spec *specs, int *n, int cap, const char *name, size_t len) {
    for (int i = 0; i < *n; i++)
        if (strlen(specs[i].name) == len && !strncmp(specs[i].name, name, len)) return i;
    if (*n >= cap) return -1;
    group_spec *s = &specs[(*n)++];
    memset(s, 0, sizeof *s);
    memcpy(s->name, name, len);
    s->name[len] = '\0';
    s->lr_scale = NAN;
    s->weight_decay = NAN;
    return *n - 1;
}

static pl_status parse_specs(const pl_config_section *cfg, const char *who, group_spec *specs,
                             int *n) {
    *n = 0;
    int nk = cfg ? pl_cfg_count(cfg) : 0;
    for (int k = 0; k < nk; k++) {
        const char *key = pl_cfg_key_at(cfg, k);
        const char *val = pl_cfg_value_at(cfg, k);
        if (!key || strncmp(key, "group.", 6) != 0) continue;
        const char *name = key + 6;
        const char *dot = strchr(name, '.');
        if (!dot || dot == name || (size_t)(dot - name) >= sizeof specs[0].name)
            return pl_error_set(PL_ERR_CONFIG,
                                "%s: key '%s': expected group.<name>.<match|tags|lr_scale|"
                                "weight_decay> with a name of 1-63 characters",
                                who, key);
        const char *field = dot + 1;
        if (!val) val = "";
        /* Pattern options may come back with their schema default for
         * groups that were never configured; only user-set keys count. */
        if (!pl_cfg_is_set(cfg, key)) continue;
        int gi = spec_index(specs, n, PL_OPTIM_MAX_GROUPS, name, (size_t)(dot - name));
        if (gi < 0)
            return pl_error_set(PL_ERR_CONFIG, "%s: key '%s': more than %d parameter groups", who,
                                key, PL_OPTIM_MAX_GROUPS);
        group_spec *s = &specs[gi];
        pl_status st = PL_OK;
        if (!strcmp(field, "match")) {
            s->match = val;
        } else if (!strcmp(field, "tags")) {
            if ((st = pl_optim_parse_tags(val, &s->tags, s->roles, &s->n_roles)))
                return pl_error_prefix(st, "%s: key '%s'", who, key);
            s->has_tags = true;
        } else if (!strcmp(field, "lr_scale")) {
            s->lr_scale = parse_double(who, key, val, &st);
            if (!st && s->lr_scale < 0)
                st = pl_error_set(PL_ERR_CONFIG, "%s: %s = %s: expected >= 0", who, key, val);
        } else if (!strcmp(field, "weight_decay")) {
            s->weight_decay = parse_double(who, key, val, &st);
            if (!st && s->weight_decay < 0)
                st = pl_error_set(PL_ERR_CONFIG, "%s: %s = %s: expected >= 0", who, key, val);
        } else {
            st = pl_error_set(PL_ERR_CONFIG,
                              "%s: unknown key '%s' (expected group.%s.match, .tags, .lr_scale or "
                              ".weight_decay)",
                              who, key, s->name);
        }
        if (st) return st;
    }
    for (int i = 0; i < *n; i++) {
        bool empty_match = !specs[i].match || !specs[i].match[0];
        if (strcmp(specs[i].name, "default") != 0 && empty_match && !specs[i].has_tags)
            return pl_error_set(PL_ERR_CONFIG,
                                "%s: group '%s' selects nothing: set group.%s.match (globs) or "
                                "group.%s.tags",
                                who, specs[i].name, specs[i].name, specs[i].name);
    }
    return PL_OK;
}

static bool spec_selects(const group_spec *s, const pl_param *p) {
    if (s->match && s->match[0] && pl_name_matches(p->name, s->match)) return true;
    if (!s->has_tags) return false;
    if (p->tags & s->tags) return true;
    for (int i = 0; i < s->n_roles; i++)
        if (!strcmp(p->role, s->roles[i])) return true;
    return false;
}

void pl_optim_groups_free(pl_optim_groups *gs) {
    if (!gs) return;
    for (int i = 0; i < gs->n; i++) {
        free(gs->g[i].param_index);
        gs->g[i].param_index = NULL;
    }
    gs->n = 0;
}

pl_status pl_optim_groups_build(const pl_config_section *cfg, pl_params *ps, const char *who,
                                const pl_optim_group_defaults *d, pl_optim_groups *out) {
    memset(out, 0, sizeof *out);
    group_spec specs[PL_OPTIM_MAX_GROUPS + 1];
    int ns = 0;
    pl_status st = parse_specs(cfg, who, specs, &ns);
    if (st) return st;
    /* The default group: configured (group.default.*) or appended. */
    int def = -1;
    bool def_configured = false;
    for (int i = 0; i < ns; i++)
        if (!strcmp(specs[i].name, "default")) def = i, def_configured = true;
    if (def < 0) def = spec_index(specs, &ns, PL_OPTIM_MAX_GROUPS + 1, "default", 7);

    int np = ps ? pl_params_count(ps) : 0;
    /* a role no parameter has is a typo (tags name generic tags or roles) */
    for (int k = 0; k < ns; k++)
        for (int r = 0; r < specs[k].n_roles; r++) {
            bool seen = false;
            char known[256] = "";
            for (int i = 0; i < np; i++) {
                const char *role = pl_params_at(ps, i)->role;
                seen |= !strcmp(role, specs[k].roles[r]);
                if (role[0] && !strstr(known, role) && strlen(known) + strlen(role) + 3 < sizeof known)
                    strcat(strcat(known, known[0] ? ", " : ""), role);
            }
            /* a typo, or a role this model variant does not have (the router of
             * moe_lora in a plain-LoRA ablation): say so, and train on */
            if (!seen)
                pl_message("warning: %s: group.%s.tags: no parameter has the tag '%s' (tags: base, "
                           "no_decay, buffer; roles of this model's parameters: %s)",
                           who, specs[k].name, specs[k].roles[r], known[0] ? known : "none");
        }
    int *owner = malloc(sizeof(int) * (size_t)(np > 0 ? np : 1));
    int count[PL_OPTIM_MAX_GROUPS + 1] = {0};
    if (!owner) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory building groups", who);
    for (int i = 0; i < np; i++) {
        pl_param *p = pl_params_at(ps, i);
        owner[i] = -1;
        if (!p || !p->t || !p->t->requires_grad) continue;
        int gi = def;
        for (int k = 0; k < ns; k++)
            if (k != def && spec_selects(&specs[k], p)) {
                gi = k;
                break;
            }
        owner[i] = gi;
        count[gi]++;
    }
    /* a named group that selects no trainable parameter is most often a typo in
     * its match glob or tags: the run goes on (its parameters train in the default
     * group), but say so, naming the group and what it asked for */
    char example[192] = "";
    for (int i = 0, shown = 0; i < np && shown < 2; i++)
        if (owner[i] >= 0 && strlen(example) + strlen(pl_params_at(ps, i)->name) + 4 < sizeof example) {
            strcat(strcat(example, shown ? ", " : ""), pl_params_at(ps, i)->name);
            shown++;
        }
    for (int k = 0; k < ns; k++)
        if (k != def && count[k] == 0)
            pl_message("warning: %s: group '%s' selects no trainable parameter (match '%s'%s); "
                       "its settings apply to nothing. Trainable parameters are named like: %s",
                       who, specs[k].name, specs[k].match ? specs[k].match : "",
                       specs[k].has_tags ? ", tags set" : "", example[0] ? example : "(none)");
    if (ns > PL_OPTIM_MAX_GROUPS && count[def] > 0) {
        free(owner);
        return pl_error_set(PL_ERR_CONFIG, "%s: more than %d parameter groups", who,
                            PL_OPTIM_MAX_GROUPS);
    }
    /* Output order: the default group first (the trainer reads the base lr
     * from group 0), then the named groups in config order. */
    for (int kk = -1; kk < ns; kk++) {
        int k = kk < 0 ? def : kk;
        if (kk >= 0 && k == def) continue;
        if (k == def && !def_configured && count[k] == 0) continue;
        const group_spec *s = &specs[k];
        pl_param_group *g = &out->g[out->n++];
        memset(g, 0, sizeof *g);
        memcpy(g->name, s->name, sizeof g->name); /* both [64], NUL-terminated */
        g->lr_scale = isnan(s->lr_scale) ? 1.0 : s->lr_scale;
        bool no_decay = !strcmp(s->name, "no_decay") || (s->has_tags && (s->tags & PL_TAG_NO_DECAY));
        g->weight_decay = !isnan(s->weight_decay) ? s->weight_decay
                          : no_decay              ? 0.0
                                                  : d->weight_decay;
        g->initial_lr = d->lr * g->lr_scale;
        g->lr = g->initial_lr;
        for (int h = 0; h < d->n_hparams; h++)
            if (pl_group_hparam_set(g, d->hparam_name[h], d->hparam_value[h])) {
                free(owner);
                pl_optim_groups_free(out);
                return pl_error_prefix(pl_error_status(), "%s", who);
            }
        g->param_index = malloc(sizeof(int) * (size_t)(count[k] > 0 ? count[k] : 1));
        if (!g->param_index) {
            free(owner);
            pl_optim_groups_free(out);
            return pl_error_set(PL_ERR_NOMEM, "%s: out of memory building groups", who);
        }
        for (int i = 0; i < np; i++)
            if (owner[i] == k) g->param_index[g->n_params++] = i;
    }
    free(owner);
    return PL_OK;
}

pl_status pl_optim_counts_read(pl_tensor *const *counts, int n, double **out) {
    *out = NULL;
    int k = 0;
    for (int i = 0; i < n; i++) k += counts[i] != NULL;
    if (k == 0) return PL_OK;
    pl_tensor **list = malloc((size_t)k * sizeof *list);
    double *v = malloc((size_t)n * sizeof *v);
    if (!list || !v) {
        free(list);
        free(v);
        return pl_error_set(PL_ERR_NOMEM, "optimizer: out of memory for %d step counts", n);
    }
    k = 0;
    for (int i = 0; i < n; i++)
        if (counts[i]) list[k++] = counts[i];
    pl_frame_begin();
    pl_tensor *all = pl_concat(list, k, 0);
    pl_tensor *h = all ? pl_tensor_to(all, PL_F32, PL_CPU) : NULL;
    pl_status s = h ? PL_OK : pl_error_prefix(pl_error_status() ? pl_error_status() : PL_ERR_DEVICE,
                                             "optimizer: reading %d step counts from the device", k);
    if (!s) {
        const float *f = pl_tensor_f32(h);
        for (int i = 0, j = 0; i < n; i++) v[i] = counts[i] ? (double)f[j++] : NAN;
    }
    pl_frame_end();
    free(list);
    if (s) {
        free(v);
        return s;
    }
    *out = v;
    return PL_OK;
}

pl_status pl_optim_count_visit(const pl_state_visitor *v, const char *name, pl_tensor *count,
                               int64_t *host, const char *who, const double *known) {
    double step = count ? (known ? *known : pl_tensor_item(count)) : (double)*host;
    if (isnan(step))
        return pl_error_prefix(pl_error_status() ? pl_error_status() : PL_ERR_DEVICE,
                               "%s: reading state '%s' from the device", who, name);
    const double before = step;
    pl_status s = v->scalar ? v->scalar(v->ctx, name, &step) : PL_OK;
    if (s) return s;
    if (!(step >= 0) || step != floor(step))
        return pl_error_set(PL_ERR_INVALID, "%s: state '%s' = %g: expected a count", who, name,
                            step);
    if (count && step > PL_OPTIM_COUNT_MAX)
        return pl_error_set(PL_ERR_INVALID, "%s: state '%s' = %.0f: the step count on the device "
                            "is an f32 (as torch's fused step), exact up to %.0f", who, name,
                            step, PL_OPTIM_COUNT_MAX);
    if (!count) {
        *host = (int64_t)step;
        return PL_OK;
    }
    if (step == before) return PL_OK;
    s = pl_tensor_fill_(count, step);
    return s ? pl_error_prefix(s, "%s: writing state '%s' to the device", who, name) : PL_OK;
}
