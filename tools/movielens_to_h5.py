#!/usr/bin/env python3
"""MovieLens ratings CSV -> HDF5 for sequential recommendation.

usage: movielens_to_h5.py [--max-len 50] ratings.csv out.h5

Input: a CSV with a header holding at least userId, movieId, timestamp
(title, year, genres, rating are kept when present). Both the dslabs export
(tools/fetch_movielens.sh) and GroupLens' own ratings.csv work.

Rules (see tools/README.md for the full layout):
  * order: each user's ratings sorted by timestamp; equal timestamps keep the
    order of the rows in the CSV (stable sort on (timestamp, row number)).
  * item ids: movieIds sorted ascending are mapped to 1..num_items; 0 is the
    padding id. /items/movie_id[k] is the movieId of item k (movie_id[0] = 0).
  * users: sorted ascending by userId; user index u is the row in
    /users/user_id.
  * leave-one-out: last item = test target, second-to-last = validation
    target, everything before = training sequence.
  * training rows (teacher forcing): with the training sequence t (length m),
    the m-1 pairs (t[j] -> t[j+1]) are cut into windows of at most L pairs,
    anchored at the END of the sequence with stride L (no overlap), so every
    training pair is a label exactly once and nothing is dropped. Each window
    is left-padded with 0 (input and label). Rows are ordered by user, then
    chronologically. A user with m < 2 has no training row.
"""
import argparse
import csv
import sys

import h5py
import numpy as np


def read_ratings(path):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            sys.exit(f"movielens_to_h5: {path}: empty file")
        col = {name: i for i, name in enumerate(header)}
        for need in ("userId", "movieId", "timestamp"):
            if need not in col:
                sys.exit(f"movielens_to_h5: {path}: column '{need}' missing "
                         f"(header: {','.join(header)})")
        users, movies, stamps, ratings = [], [], [], []
        titles, years, genres = {}, {}, {}
        ci_u, ci_m, ci_t = col["userId"], col["movieId"], col["timestamp"]
        ci_r = col.get("rating")
        ci_title, ci_year, ci_gen = col.get("title"), col.get("year"), col.get("genres")
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                sys.exit(f"movielens_to_h5: {path}:{lineno}: {len(row)} fields, "
                         f"header has {len(header)}")
            try:
                u = int(row[ci_u])
                m = int(row[ci_m])
                t = int(float(row[ci_t]))
                r = float(row[ci_r]) if ci_r is not None else float("nan")
            except ValueError as e:
                sys.exit(f"movielens_to_h5: {path}:{lineno}: {e}")
            users.append(u)
            movies.append(m)
            stamps.append(t)
            ratings.append(r)
            if ci_title is not None:
                titles.setdefault(m, row[ci_title])
            if ci_year is not None:
                years.setdefault(m, row[ci_year])
            if ci_gen is not None:
                genres.setdefault(m, row[ci_gen])
    if not users:
        sys.exit(f"movielens_to_h5: {path}: no ratings")
    return (np.array(users, np.int64), np.array(movies, np.int64),
            np.array(stamps, np.int64), np.array(ratings, np.float32),
            titles, years, genres)


def left_pad(seq, L):
    """Last L entries of seq, left-padded with 0 to length L."""
    out = np.zeros(L, np.int32)
    tail = seq[-L:] if len(seq) > 0 else seq
    if len(tail):
        out[L - len(tail):] = tail
    return out


def unique_keep_first(seq):
    _, first = np.unique(seq, return_index=True)
    return seq[np.sort(first)]


def train_windows(t, L):
    """Teacher-forcing windows over training sequence t, anchored at the end.

    Returns a list of (inputs, labels) of length L each, chronological."""
    npairs = len(t) - 1
    rows = []
    end = npairs
    while end > 0:
        start = max(0, end - L)
        inp = t[start:end]          # t[j] for j in [start, end)
        lab = t[start + 1:end + 1]  # t[j + 1]
        rows.append((left_pad(inp, L), left_pad(lab, L)))
        end = start
    rows.reverse()
    return rows


def write_csr(g, name, seqs):
    sub = g.create_group(name)
    offsets = np.zeros(len(seqs) + 1, np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    sub.create_dataset("offsets", data=offsets)
    items = np.concatenate(seqs).astype(np.int32) if seqs else np.zeros(0, np.int32)
    sub.create_dataset("items", data=items)
    return offsets, items


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("out")
    ap.add_argument("--max-len", type=int, default=50,
                    help="L, the fixed sequence length of the precomputed rows (default 50)")
    args = ap.parse_args()
    L = args.max_len
    if L < 1:
        sys.exit("movielens_to_h5: --max-len must be >= 1")

    users, movies, stamps, ratings, titles, years, genres = read_ratings(args.csv)
    n = len(users)

    movie_ids = np.unique(movies)                       # ascending
    item_of = np.searchsorted(movie_ids, movies) + 1    # 1..num_items
    num_items = len(movie_ids)
    user_ids = np.unique(users)
    uidx = np.searchsorted(user_ids, users)
    U = len(user_ids)

    # stable order: user, then timestamp, then CSV row (lexsort is stable and
    # the row number makes the tie rule explicit)
    order = np.lexsort((np.arange(n), stamps, uidx))
    counts = np.bincount(uidx, minlength=U)
    offsets = np.zeros(U + 1, np.int64)
    offsets[1:] = np.cumsum(counts)
    seq_items = item_of[order].astype(np.int32)
    too_short = user_ids[counts < 3]
    if len(too_short):
        sys.exit(f"movielens_to_h5: {args.csv}: {len(too_short)} users have fewer than 3 "
                 f"ratings (e.g. userId {too_short[0]}); leave-one-out needs >= 3")

    tr_in, tr_lab, tr_user = [], [], []
    val_in = np.zeros((U, L), np.int32)
    test_in = np.zeros((U, L), np.int32)
    val_t = np.zeros(U, np.int32)
    test_t = np.zeros(U, np.int32)
    val_hist, test_hist = [], []
    for u in range(U):
        s = seq_items[offsets[u]:offsets[u + 1]]
        train = s[:-2]
        for inp, lab in train_windows(train, L):
            tr_in.append(inp)
            tr_lab.append(lab)
            tr_user.append(u)
        val_in[u] = left_pad(s[:-2], L)
        val_t[u] = s[-2]
        test_in[u] = left_pad(s[:-1], L)
        test_t[u] = s[-1]
        val_hist.append(unique_keep_first(s[:-2]))
        test_hist.append(unique_keep_first(s[:-1]))

    str_t = h5py.string_dtype("utf-8")
    with h5py.File(args.out, "w") as f:
        f.attrs["num_items"] = np.int64(num_items)
        f.attrs["num_users"] = np.int64(U)
        f.attrs["num_ratings"] = np.int64(n)
        f.attrs["max_len"] = np.int64(L)
        f.attrs["padding_id"] = np.int64(0)
        f.attrs["source"] = f"movielens_to_h5.py from {args.csv}"
        f.attrs["order_rule"] = "per user by timestamp, ties by CSV row order"
        f.attrs["split_rule"] = "leave-one-out: last=test, second-to-last=val, rest=train"

        it = f.create_group("items")
        it.create_dataset("movie_id", data=np.concatenate([[0], movie_ids]).astype(np.int64))
        if titles:
            it.create_dataset("title", data=[""] + [titles[m] for m in movie_ids], dtype=str_t)
        if years:
            yr = np.zeros(num_items + 1, np.int32)
            for k, m in enumerate(movie_ids, start=1):
                try:
                    yr[k] = int(years[m])
                except ValueError:
                    yr[k] = 0
            it.create_dataset("year", data=yr)
        if genres:
            it.create_dataset("genres", data=[""] + [genres[m] for m in movie_ids], dtype=str_t)

        f.create_group("users").create_dataset("user_id", data=user_ids.astype(np.int64))

        sq = f.create_group("seq")
        sq.create_dataset("offsets", data=offsets)
        sq.create_dataset("items", data=seq_items)
        sq.create_dataset("timestamps", data=stamps[order])
        sq.create_dataset("ratings", data=ratings[order])

        tr = f.create_group("train")
        if tr_in:
            tr.create_dataset("input_ids", data=np.stack(tr_in))
            tr.create_dataset("labels", data=np.stack(tr_lab))
        else:
            tr.create_dataset("input_ids", shape=(0, L), dtype=np.int32)
            tr.create_dataset("labels", shape=(0, L), dtype=np.int32)
        tr.create_dataset("user_index", data=np.array(tr_user, np.int32))

        for name, inp, tgt, hist in (("val", val_in, val_t, val_hist),
                                     ("test", test_in, test_t, test_hist)):
            g = f.create_group(name)
            g.create_dataset("input_ids", data=inp)
            g.create_dataset("target", data=tgt)
            g.create_dataset("user_index", data=np.arange(U, dtype=np.int32))
            write_csr(g, "history", hist)

    print(f"movielens_to_h5: {args.out}: {U} users, {num_items} items, {n} ratings, "
          f"{len(tr_in)} train rows (L={L})", file=sys.stderr)


if __name__ == "__main__":
    main()
