/* chunk_test_files.h - synthetic HDF5 files and checks shared by the tests
 * of hdf5_rows, hdf5_series and the hdf5_chunk alias (Check assertions:
 * call from a test). Files are written once per test binary under
 * pl_test_tmp_path(lf_suite, ...). */
#ifndef CHUNK_TEST_FILES_H
#define CHUNK_TEST_FILES_H

#include <stdbool.h>
#include <stddef.h>

#include "loader_test_util.h"
#include "pl_test.h"

#define NTR 100 /* train rows of the rows file */
#define NV 10   /* val / test rows */

/* The test binary's scratch folder name (each test file defines it). */
extern const char *const lf_suite;

const char *lf_tmp_path(const char *name, char *buf, size_t n);
/* /train/x f32 [100, 3] = row*10 + col, /train/y i64 [100] = row,
 * /val/x [10, 3] = 1000 + row*10 + col, /val/y = 1000 + row,
 * /val/hist CSR: row r has r % 4 items: 7, 8, 9 (first r%4 of them),
 * /test the same as val plus 2000. Root attribute num_items = 42. */
const char *lf_make_rows_file(char *buf, size_t n);
/* Series: T = 30 days from 1970-01-01, F = 3 columns c0 = t, c1 = t^2/10,
 * c2 = 5 - t; /columns = level, sq, down. */
const char *lf_make_series_file(char *buf, size_t n);
/* /columns = level, sq, down (variable-length strings) into file p. */
void lf_write_series_columns(const char *p);
/* A [data] body for the rows file (or the series file: window 3, horizon 1,
 * split_fractions 0.6,0.2,0.2) plus `extra`. */
void lf_make_body(char *body, size_t n, const char *extra, bool series);
/* For every k, a fresh `plugin` loader's epoch_begin(train, E, k) serves
 * exactly batches k.. of the whole epoch E (rows file, or the series file
 * when `series`), reading only the chunks from the one holding batch k
 * (chunk_rows > 0); after val in between too; out of range refused naming
 * plugin, split, value and count. */
void lf_check_start(const char *plugin, const char *body_extra, bool series, int chunk_rows);
/* batch_fields(cfg) of the loader in L, then every batch of every split
 * checked against it; each declared field is carried by some batch. */
void lf_check_fields_against_batches(lt_loader *L, const char *what);
const pl_field_spec *lf_find_field(const pl_field_list *fl, const char *name);
void lf_expect_in_message(const char *m, const char *a, const char *b, const char *c);
/* python3 tools/TOOL ARGS OUT; false when it failed (no python3 + h5py). */
bool lf_convert(const char *tool, const char *args, const char *out);

#endif
