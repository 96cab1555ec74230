/* io_use.c - a plugin author's program against the installed file formats
 * (pipeline/safetensors.h, libpipeline_io, pipeline-io.pc), for
 * tests/sdk/test_sdk.sh. argv[1]: a file to write. Writes a 2x3 f32 tensor
 * and one metadata entry, reads both back and compares them; a truncated
 * copy must be refused naming the file. Prints what differs; exit 1 then. */
#include <pipeline/pipeline.h>
#include <pipeline/safetensors.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.safetensors\n", argv[0]);
        return 2;
    }
    const float v[6] = {1, -2, 3.5f, 0, 1e-3f, 42};
    int64_t shape[2] = {2, 3};
    pl_tensor *t = pl_tensor_from_data(PL_F32, 2, shape, v, PL_CPU);
    pl_st_writer *w = pl_st_writer_new(argv[1]);
    if (!t || !w || pl_st_writer_add(w, "w", t) || pl_st_writer_meta(w, "k", "v") ||
        pl_st_writer_commit(w)) {
        fprintf(stderr, "writing %s: %s\n", argv[1], pl_error_message());
        return 1;
    }
    pl_st_writer_free(w);
    pl_st_file *f = NULL;
    if (pl_st_open(argv[1], &f)) {
        fprintf(stderr, "reading %s: %s\n", argv[1], pl_error_message());
        return 1;
    }
    pl_tensor *r = pl_st_load(f, "w");
    const char *meta = pl_st_meta(f, "k");
    int bad = !r || r->ndim != 2 || r->shape[0] != 2 || r->shape[1] != 3 ||
              memcmp(pl_tensor_data(r), v, sizeof v) || !meta || strcmp(meta, "v");
    if (bad) fprintf(stderr, "%s read back differs from what was written\n", argv[1]);
    pl_tensor_release(r);
    pl_st_close(f);
    /* the first 8 bytes only: a header length past the end */
    char cut[4096];
    snprintf(cut, sizeof cut, "%s.cut", argv[1]);
    FILE *in = fopen(argv[1], "rb"), *out = fopen(cut, "wb");
    char head[8];
    if (!in || !out || fread(head, 1, 8, in) != 8 || fwrite(head, 1, 8, out) != 8) bad = 1;
    if (in) fclose(in);
    if (out) fclose(out);
    f = NULL;
    if (!pl_st_open(cut, &f) || !strstr(pl_error_message(), cut)) {
        fprintf(stderr, "truncated %s was not refused naming it (%s)\n", cut,
                f ? "accepted" : pl_error_message());
        bad = 1;
    }
    pl_st_close(f);
    pl_tensor_release(t);
    if (!bad) printf("installed io ok\n");
    return bad;
}
