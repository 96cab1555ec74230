#!/usr/bin/env python3
"""MovieLens ratings CSV -> HDF5 for sequential recommendation.

usage: movielens_to_h5.py [--max-len 50] [--early-quantile 0.7] ratings.csv out.h5

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
  * /early (the drift setting of issue 15: a backbone pretrained on an
    earlier period, adapted on the whole training split): cutoff = the
    --early-quantile quantile of the timestamps of every training-split
    interaction (numpy method "lower": an observed timestamp). A user's
    early sequence e = its training-split interactions with timestamp <
    cutoff (a prefix of its training sequence). A user with len(e) >= 3 gets
    an early validation row: target e[-1], input e[:-1] (left-padded like
    /val), history = distinct items of e[:-1]; its early training sequence
    is e[:-1] (the target is held out, as /train holds out the val target).
    Any other user trains on all of e. Early training rows are windowed as
    /train. Nothing at or after the cutoff enters /early.
"""
import argparse
import csv
import sys
import time

import h5py
import numpy as np

from convert_out import atomic_output, check_names, refuse_input_as_output


def read_ratings(path):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            sys.exit(f"movielens_to_h5: {path}: empty file")
        check_names("movielens_to_h5", f"{path}:1", header)
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


def early_split(seq_items, seq_stamps, offsets, L, q):
    """The /early group's contents (see the module docstring).

    seq_items / seq_stamps: every rating per user in time order (CSR by
    offsets). Returns a dict of arrays plus the cutoff timestamp."""
    U = len(offsets) - 1
    train_ts = np.concatenate([seq_stamps[offsets[u]:offsets[u + 1] - 2] for u in range(U)])
    cutoff = int(np.quantile(train_ts, q, method="lower"))
    tr_in, tr_lab, tr_user = [], [], []
    v_in, v_t, v_user, v_hist = [], [], [], []
    for u in range(U):
        s = seq_items[offsets[u]:offsets[u + 1] - 2]        # training sequence
        ts = seq_stamps[offsets[u]:offsets[u + 1] - 2]
        e = s[ts < cutoff]                                  # a prefix: ts is sorted
        if len(e) >= 3:
            v_in.append(left_pad(e[:-1], L))
            v_t.append(e[-1])
            v_user.append(u)
            v_hist.append(unique_keep_first(e[:-1]))
            e = e[:-1]
        for inp, lab in train_windows(e, L):
            tr_in.append(inp)
            tr_lab.append(lab)
            tr_user.append(u)
    stack = lambda rows: np.stack(rows) if rows else np.zeros((0, L), np.int32)
    return {"cutoff": cutoff, "num_train_interactions": len(train_ts),
            "num_before_cutoff": int((train_ts < cutoff).sum()),
            "train_input_ids": stack(tr_in), "train_labels": stack(tr_lab),
            "train_user_index": np.array(tr_user, np.int32),
            "val_input_ids": stack(v_in), "val_target": np.array(v_t, np.int32),
            "val_user_index": np.array(v_user, np.int32), "val_history": v_hist}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("out")
    ap.add_argument("--max-len", type=int, default=50,
                    help="L, the fixed sequence length of the precomputed rows (default 50)")
    ap.add_argument("--early-quantile", type=float, default=0.7,
                    help="q: /early holds the training-split interactions before the q quantile "
                         "of their timestamps (default 0.7)")
    args = ap.parse_args()
    refuse_input_as_output("movielens_to_h5", args.out, [args.csv])
    L = args.max_len
    if L < 1:
        sys.exit("movielens_to_h5: --max-len must be >= 1")
    if not 0 < args.early_quantile <= 1:
        sys.exit(f"movielens_to_h5: --early-quantile must be in (0, 1], got {args.early_quantile}")

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

    early = early_split(seq_items, stamps[order], offsets, L, args.early_quantile)

    str_t = h5py.string_dtype("utf-8")
    with atomic_output(args.out) as tmp, h5py.File(tmp, "w") as f:
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

        eg = f.create_group("early")
        eg.attrs["cutoff_timestamp"] = np.int64(early["cutoff"])
        eg.attrs["cutoff_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(early["cutoff"]))
        eg.attrs["quantile"] = np.float64(args.early_quantile)
        eg.attrs["split_rule"] = (
            "cutoff = quantile (numpy method lower) of the training-split timestamps; per user "
            "e = training-split interactions with timestamp < cutoff; len(e) >= 3: val target "
            "e[-1], val input / history e[:-1], train on e[:-1]; else train on e")
        eg.attrs["num_train_interactions"] = np.int64(early["num_train_interactions"])
        eg.attrs["num_before_cutoff"] = np.int64(early["num_before_cutoff"])
        et = eg.create_group("train")
        et.create_dataset("input_ids", data=early["train_input_ids"])
        et.create_dataset("labels", data=early["train_labels"])
        et.create_dataset("user_index", data=early["train_user_index"])
        ev = eg.create_group("val")
        ev.create_dataset("input_ids", data=early["val_input_ids"])
        ev.create_dataset("target", data=early["val_target"])
        ev.create_dataset("user_index", data=early["val_user_index"])
        write_csr(ev, "history", early["val_history"])

    print(f"movielens_to_h5: {args.out}: {U} users, {num_items} items, {n} ratings, "
          f"{len(tr_in)} train rows (L={L}); /early: cutoff {early['cutoff']} "
          f"(q={args.early_quantile}), {len(early['train_input_ids'])} train rows, "
          f"{len(early['val_target'])} val users", file=sys.stderr)


if __name__ == "__main__":
    main()
