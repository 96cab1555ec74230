#!/usr/bin/env python3
"""test_predict_gat_mlp.py - `pipeline predict` for the gat and mlp models.

Trains tiny runs (seconds each) on synthetic files and checks that predict
reproduces what the run's own test evaluation computed, recomputed from
OUT.h5 alone:
  - gat node mode (hdf5_graph, one graph): accuracy of `pred` on the test
    mask == summary.json test accuracy; `node` lists the test-mask nodes;
    the same graph without labels and masks predicts every node, with the
    same probabilities for the test nodes;
  - gat graph mode (hdf5_graph mode = graphs, standardized targets): MAE of
    `prediction` vs `target` == test mae; a new file of the test graphs only,
    without masks (its target statistics differ from the run's), gives the
    same predictions: the run's standardization.json is the one used;
  - mlp regression (hdf5_rows): MAE of `output` vs `target` == test
    mae; mlp classification: accuracy of `pred` == test accuracy; a file
    without targets gives the same outputs;
  - errors: an input without edge_index, with masks but not the predicted
    split's, and without the mlp's input dataset, name the file and the
    dataset; a model plugin without predict is refused, naming it.
usage: test_predict_gat_mlp.py BUILD_DIR   (ctest runs it; needs numpy and h5py)
"""
import json
import os
import sys
import tempfile

import h5py
import numpy as np

from cli_util import fail, run, summary, write_ini








def test_metrics(run_dir):
    return summary(run_dir)["test_metrics"]


def read(path, *names):
    with h5py.File(path) as f:
        return [f[n][:] if n in f else None for n in names]


# ---- gat, node mode ----------------------------------------------------------------------

def make_graph(path, labels=True, masks=True):
    """300 nodes, 16 features, 3 classes (features carry the class); edges
    mostly within a class; train 0..119, val 120..179, test 180..299; a few
    test nodes unlabeled (-1)."""
    rng = np.random.default_rng(0)
    N, F, C = 300, 16, 3
    y = rng.integers(0, C, N)
    x = rng.normal(0, 1, (N, F)).astype(np.float32)
    x[np.arange(N), y] += 1.0
    src = rng.integers(0, N, 1500)
    dst = np.array([rng.choice(np.flatnonzero(y == y[s])) if rng.random() < 0.8
                    else rng.integers(0, N) for s in src])
    y[[185, 250]] = -1
    with h5py.File(path, "w") as f:
        f["features"] = x
        f["edge_index"] = np.stack([src, dst]).astype(np.int64)
        if labels:
            f["labels"] = y.astype(np.int64)
            f.attrs["num_classes"] = np.int64(C)
        if masks:
            idx = np.arange(N)
            f["train_mask"] = (idx < 120).astype(np.uint8)
            f["val_mask"] = ((idx >= 120) & (idx < 180)).astype(np.uint8)
            f["test_mask"] = (idx >= 180).astype(np.uint8)
    return y


def test_gat_node(exe, tmp):
    h5 = os.path.join(tmp, "g.h5")
    y = make_graph(h5)
    ini = os.path.join(tmp, "gn.ini")
    write_ini(ini, f"""[pipeline]
name = gn
run_dir = {tmp}/runs
seed = 3
[data]
plugin = hdf5_graph
path = {h5}
[model]
plugin = gat
hidden = 4
heads = 2
dropout = 0.1
attn_dropout = 0.1
[optimizer]
plugin = adamw
lr = 0.01
[trainer]
max_epochs = 6
monitor = val_loss
""")
    run([exe, "run", ini])
    rd = os.path.join(tmp, "runs", "gn", "latest")
    if not os.path.isfile(os.path.join(rd, "graph_meta.json")):
        fail("gat node: the run wrote no graph_meta.json")
    want = test_metrics(rd)["accuracy"]
    out = os.path.join(tmp, "gn_pred.h5")
    run([exe, "predict", rd, h5, out])
    node, probs, pred, label = read(out, "node", "probs", "pred", "label")
    if not np.array_equal(node, np.arange(180, 300)) or probs.shape != (120, 3):
        fail("gat node: node %s.., probs %s" % (node[:5], probs.shape))
    if not np.array_equal(label, y[180:]) or not np.array_equal(pred, probs.argmax(1)):
        fail("gat node: label or pred do not match the file / probs")
    if np.abs(probs.sum(1) - 1).max() > 1e-5:
        fail("gat node: probs rows do not sum to 1")
    on = label >= 0
    acc = float(np.mean(pred[on] == label[on]))
    if abs(acc - want) > 1e-12:
        fail("gat node: accuracy from OUT.h5 %.6f != the run's test accuracy %.6f" % (acc, want))
    print("gat node: accuracy recomputed from OUT.h5 = %.6f = test accuracy" % acc)

    # the same graph, no labels and no masks: every node, same probabilities
    h5n = os.path.join(tmp, "g_new.h5")
    make_graph(h5n, labels=False, masks=False)
    outn = os.path.join(tmp, "gn_new.h5")
    run([exe, "predict", rd, h5n, outn])
    node2, probs2, label2 = read(outn, "node", "probs", "label")
    if label2 is not None or not np.array_equal(node2, np.arange(300)):
        fail("gat node: a file without labels/masks: label %s, node %s" % (label2, node2[:5]))
    d = float(np.abs(probs2[180:] - probs).max())
    if d > 1e-6:
        fail("gat node: the unlabeled file's test-node probabilities differ by %g" % d)
    print("gat node: a file without labels and masks predicts all 300 nodes (max diff %g)" % d)

    # errors: no edge_index; masks present but not the predicted split's
    bad = os.path.join(tmp, "g_noedges.h5")
    with h5py.File(h5) as f, h5py.File(bad, "w") as g:
        g["features"] = f["features"][:]
    p = run([exe, "predict", rd, bad, os.path.join(tmp, "x.h5")], expect=1)
    if bad not in p.stderr or "edge_index" not in p.stderr:
        fail("gat node: input without edge_index: message names neither:\n" + p.stderr)
    part = os.path.join(tmp, "g_trainmask.h5")
    with h5py.File(h5) as f, h5py.File(part, "w") as g:
        for k in ("features", "edge_index", "train_mask"):
            g[k] = f[k][:]
    p = run([exe, "predict", rd, part, os.path.join(tmp, "x.h5")], expect=1)
    if part not in p.stderr or "test_mask" not in p.stderr:
        fail("gat node: input without test_mask: message names neither:\n" + p.stderr)
    if os.path.exists(os.path.join(tmp, "x.h5")):
        fail("a failed predict left OUT.h5")
    print("gat node: errors name the file and the missing dataset")


# ---- gat, graph mode ---------------------------------------------------------------------

def make_molecules(path, keep=None, targets=True, masks=True):
    """160 graphs of 3..8 nodes, 5 features; target = 3 * sum of feature 0
    over the graph + 10 (K = 1); masks 100 / 30 / 30. keep: the graphs to
    write (a subset, in order)."""
    rng = np.random.default_rng(1)
    G = 160
    xs, es, ys = [], [], []
    for g in range(G):
        n = int(rng.integers(3, 9))
        x = rng.uniform(0, 1, (n, 5)).astype(np.float32)
        e = np.array([[i, i + 1] for i in range(n - 1)] + [[i + 1, i] for i in range(n - 1)]).T
        xs.append(x)
        es.append(e)
        ys.append(3 * x[:, 0].sum() + 10)
    split = np.zeros(G, int)
    split[100:130], split[130:] = 1, 2
    keep = np.arange(G) if keep is None else np.asarray(keep)
    with h5py.File(path, "w") as f:
        f["x"] = np.concatenate([xs[g] for g in keep])
        f["edge_index"] = np.concatenate([es[g] for g in keep], 1).astype(np.int64)
        f["node_ptr"] = np.concatenate([[0], np.cumsum([len(xs[g]) for g in keep])]).astype(np.int64)
        f["edge_ptr"] = np.concatenate([[0], np.cumsum([es[g].shape[1] for g in keep])]).astype(np.int64)
        if targets:
            f["y"] = np.array([ys[g] for g in keep], np.float32)
        if masks:
            for s, name in enumerate(("train_mask", "val_mask", "test_mask")):
                f[name] = (split[keep] == s).astype(np.uint8)


def test_gat_graphs(exe, tmp):
    h5 = os.path.join(tmp, "m.h5")
    make_molecules(h5)
    ini = os.path.join(tmp, "gg.ini")
    write_ini(ini, f"""[pipeline]
name = gg
run_dir = {tmp}/runs
seed = 2
[data]
plugin = hdf5_graph
mode = graphs
path = {h5}
batch_size = 16
add_self_loops = true
[model]
plugin = gat
task = graph_regression
layers = 2
hidden = 8
heads = 2
dropout = 0.0
attn_dropout = 0.0
add_self_loops = false
readout = sum
[optimizer]
plugin = adamw
lr = 0.01
[trainer]
max_epochs = 4
monitor = val_mae
""")
    run([exe, "run", ini])
    rd = os.path.join(tmp, "runs", "gg", "latest")
    with open(os.path.join(rd, "standardization.json")) as f:
        sj = json.load(f)
    if sj["columns"] != ["y[0]"] or not sj["std"][0] > 0:
        fail("gat graphs: standardization.json %r" % sj)
    want = test_metrics(rd)["mae"]
    out = os.path.join(tmp, "gg_pred.h5")
    run([exe, "predict", rd, h5, out])
    graph, pr, tg = read(out, "graph", "prediction", "target")
    if not np.array_equal(graph, np.arange(130, 160)) or pr.shape != (30, 1) or tg.shape != (30, 1):
        fail("gat graphs: graph %s, prediction %s, target %s" % (graph[:5], pr.shape, tg.shape))
    with h5py.File(h5) as f:
        ty = f["y"][130:]
    if np.abs(tg[:, 0] - ty).max() > 1e-4:
        fail("gat graphs: target is not the file's targets in original units")
    mae = float(np.abs(pr.astype(np.float64) - tg).mean())
    if abs(mae - want) > 1e-5 * max(1.0, abs(want)):
        fail("gat graphs: MAE from OUT.h5 %.6f != the run's test mae %.6f" % (mae, want))
    print("gat graphs: MAE recomputed from OUT.h5 = %.6f (test mae %.6f)" % (mae, want))

    # the test graphs alone, no masks: their own statistics differ from the run's
    h5t = os.path.join(tmp, "m_test.h5")
    make_molecules(h5t, keep=np.arange(130, 160), masks=False)
    outt = os.path.join(tmp, "gg_test.h5")
    run([exe, "predict", rd, h5t, outt])
    graph2, pr2 = read(outt, "graph", "prediction")
    d = float(np.abs(pr2 - pr).max())
    if not np.array_equal(graph2, np.arange(30)) or d > 1e-4:
        fail("gat graphs: the test graphs alone: graph %s.., predictions differ by %g" % (graph2[:3], d))
    # and without targets
    h5u = os.path.join(tmp, "m_untargeted.h5")
    make_molecules(h5u, keep=np.arange(130, 160), targets=False, masks=False)
    outu = os.path.join(tmp, "gg_untargeted.h5")
    run([exe, "predict", rd, h5u, outu])
    pr3, tg3 = read(outu, "prediction", "target")
    if tg3 is not None or float(np.abs(pr3 - pr).max()) > 1e-4:
        fail("gat graphs: a file without targets: target %s, predictions differ" % tg3)
    print("gat graphs: the test graphs alone, with and without targets, predict the same (max diff %g)"
          % d)


# ---- mlp -----------------------------------------------------------------------------

def make_rows(path, classes=False, targets=True):
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        for split, n in (("train", 64), ("val", 16), ("test", 20)):
            x = rng.uniform(-1, 1, (n, 4)).astype(np.float32)
            f[split + "/x"] = x
            if not targets and split == "test":
                continue
            if classes:
                f[split + "/y"] = (x[:, 0] > x[:, 1]).astype(np.int64) + (x[:, 2] > 0.5)
            else:
                f[split + "/y"] = x.sum(axis=1, keepdims=True).astype(np.float32) * 10 + 3


def mlp_ini(tmp, name, h5, extra):
    ini = os.path.join(tmp, name + ".ini")
    write_ini(ini, f"""[pipeline]
name = {name}
run_dir = {tmp}/runs
[data]
plugin = hdf5_rows
path = {h5}
datasets = x,y
batch_size = 8
eval_batch_size = 6
[model]
plugin = mlp
hidden = 8
in_features = 4
{extra}
[optimizer]
plugin = adamw
lr = 0.01
[trainer]
max_epochs = 3
""")
    return ini


def test_mlp(exe, tmp):
    h5 = os.path.join(tmp, "r.h5")
    make_rows(h5)
    run([exe, "run", mlp_ini(tmp, "mr", h5, "out_features = 1")])
    rd = os.path.join(tmp, "runs", "mr", "latest")
    want = test_metrics(rd)["mae"]
    out = os.path.join(tmp, "mr_pred.h5")
    run([exe, "predict", rd, h5, out])
    o, tg, row = read(out, "output", "target", "row")
    if o.shape != (20, 1) or tg.shape != (20, 1) or not np.array_equal(row, np.arange(20)):
        fail("mlp: output %s target %s row %s" % (o.shape, tg.shape, row))
    mae = float(np.abs(o.astype(np.float64) - tg).mean())
    if abs(mae - want) > 1e-5 * max(1.0, abs(want)):
        fail("mlp: MAE from OUT.h5 %.6f != the run's test mae %.6f" % (mae, want))
    print("mlp: MAE recomputed from OUT.h5 = %.6f (test mae %.6f)" % (mae, want))
    h5n = os.path.join(tmp, "r_new.h5")
    make_rows(h5n, targets=False)
    outn = os.path.join(tmp, "mr_new.h5")
    run([exe, "predict", rd, h5n, outn])
    o2, tg2 = read(outn, "output", "target")
    if tg2 is not None or not np.array_equal(o2, o):
        fail("mlp: a file without targets: target %s, outputs differ" % tg2)
    print("mlp: a file without targets gives the same outputs")

    # classification
    h5c = os.path.join(tmp, "rc.h5")
    make_rows(h5c, classes=True)
    run([exe, "run", mlp_ini(tmp, "mc", h5c, "loss = cross_entropy\nout_features = 3")])
    rd = os.path.join(tmp, "runs", "mc", "latest")
    want = test_metrics(rd)["accuracy"]
    outc = os.path.join(tmp, "mc_pred.h5")
    run([exe, "predict", rd, h5c, outc])
    probs, pred, tg = read(outc, "probs", "pred", "target")
    if probs.shape != (20, 3) or not np.array_equal(pred, probs.argmax(1)):
        fail("mlp classification: probs %s, pred %s" % (probs.shape, pred))
    acc = float(np.mean(pred == tg))
    if abs(acc - want) > 1e-12:
        fail("mlp classification: accuracy from OUT.h5 %.6f != test accuracy %.6f" % (acc, want))
    print("mlp classification: accuracy recomputed from OUT.h5 = %.6f = test accuracy" % acc)

    # errors: no input dataset
    bad = os.path.join(tmp, "r_nox.h5")
    with h5py.File(bad, "w") as f:
        f["test/y"] = np.zeros((4, 1), np.float32)
    p = run([exe, "predict", os.path.join(tmp, "runs", "mr", "latest"), bad,
             os.path.join(tmp, "x.h5")], expect=1)
    if bad not in p.stderr or "'x'" not in p.stderr:
        fail("mlp: input without x: message names neither file nor field:\n" + p.stderr)
    print("mlp: an input without x is refused naming the file and the field")


def test_no_predict(exe, build, tmp):
    """A model plugin without the ABI 2.4 predict members (the fixture model)."""
    rd = os.path.join(tmp, "fx_run")
    os.makedirs(rd)
    write_ini(os.path.join(rd, "config.ini"), f"""[pipeline]
name = fx
[data]
plugin = hdf5_rows
path = {tmp}/r.h5
datasets = x,y
[model]
plugin = fx_model
[optimizer]
plugin = adamw
""")
    env = dict(os.environ, PIPELINE_PLUGIN_PATH=os.path.join(build, "tests", "fixtures", "plugins",
                                                             "good"))
    p = run([exe, "predict", rd, os.path.join(tmp, "r.h5"), os.path.join(tmp, "x.h5")], expect=2,
            env=env)
    if "'fx_model'" not in p.stderr or "predict" not in p.stderr:
        fail("a model without predict: message does not name it:\n" + p.stderr)
    print("fx_model: refused with: " + p.stderr.splitlines()[0])


def h5_tree(path):
    """{dataset name: (dtype, shape)} and the root attributes of an HDF5 file."""
    names = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: names.__setitem__(n, (o.dtype.str, o.shape))
                     if isinstance(o, h5py.Dataset) else None)
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    return names, attrs


def no_temporaries(d, what):
    left = [n for n in os.listdir(d) if ".tmp." in n]
    if left:
        fail("%s: temporary files left: %s" % (what, left))


def fixture_run(exe, build, tmp, name, plugin):
    """Train fixture model `plugin` (tests/fixtures/plugins/outputs) one epoch on test_mlp's
    rows with the export on; returns (env finding the fixture, the run's latest dir)."""
    h5 = os.path.join(tmp, "r.h5")
    env = dict(os.environ, PIPELINE_PLUGIN_PATH=os.path.join(build, "tests", "fixtures",
                                                             "plugins", "outputs"))
    ini = os.path.join(tmp, name + ".ini")
    write_ini(ini, f"""[pipeline]
name = {name}
run_dir = {tmp}/runs
[data]
plugin = hdf5_rows
path = {h5}
datasets = x,y
batch_size = 8
eval_batch_size = 6
[model]
plugin = {plugin}
[optimizer]
plugin = adamw
lr = 0.01
[trainer]
max_epochs = 1
export = true
""")
    run([exe, "run", ini], env=env)
    return env, os.path.join(tmp, "runs", name, "latest")


def test_named_outputs(exe, build, tmp):
    """The fixture model fx_outputs (ABI 2.9 outputs verbs): the file holds exactly the
    outputs it named (a group made for "group/x", a 0-row dataset it declared), for
    `pipeline predict` and for the run's export; a failing outputs_batch leaves no file
    and no temporary file."""
    h5 = os.path.join(tmp, "r.h5")  # test_mlp's rows: train 64, val 16, test 20 of x [n, 4]
    env, rd = fixture_run(exe, build, tmp, "fx", "fx_outputs")
    exp = os.path.join(rd, "outputs", "fx_outputs.h5")
    names, attrs = h5_tree(exp)
    want = {"pred": ("<f4", (100, 1)), "group/x": ("<f4", (100, 4)), "decl/empty": ("<f4", (0, 2))}
    if names != want or attrs.get("fx") != "outputs":
        fail("export: %s holds %s, attributes %s; the model named %s" % (exp, names, attrs, want))
    with h5py.File(exp) as f, h5py.File(h5) as src:
        got, tr = f["group/x"][()], src["train/x"][()]
        # train in the loader's (shuffled) epoch order, then val and test in order
        same_train = np.array_equal(np.sort(got[:64], axis=0), np.sort(tr, axis=0))
        rest = np.concatenate([src["val/x"][()], src["test/x"][()]])
        if not same_train or not np.array_equal(got[64:], rest):
            fail("export: group/x is not the rows of train, val and test")
    no_temporaries(os.path.dirname(exp), "export")

    out = os.path.join(tmp, "fx_pred.h5")
    run([exe, "predict", rd, h5, out], env=env)
    names, attrs = h5_tree(out)
    want = {"pred": ("<f4", (20, 1)), "group/x": ("<f4", (20, 4)), "decl/empty": ("<f4", (0, 2))}
    if names != want or attrs.get("fx") != "outputs" or attrs.get("model") != "fx_outputs":
        fail("predict: %s holds %s, attributes %s; the model named %s" % (out, names, attrs, want))
    with h5py.File(out) as f, h5py.File(h5) as src:
        if not np.array_equal(f["group/x"][()], src["test/x"][()]):
            fail("predict: group/x is not the test rows in order")
    no_temporaries(tmp, "predict")

    # outputs_batch fails at the second batch: exit 1 naming the model, no file left
    bad = os.path.join(tmp, "fx_fail.h5")
    p = run([exe, "predict", rd, h5, bad, "model.fail_at_batch=1"], expect=1, env=env)
    if "failing at batch 1" not in p.stderr:
        fail("predict: the model's error is not reported:\n" + p.stderr)
    if os.path.exists(bad):
        fail("predict: a failed outputs_batch left " + bad)
    no_temporaries(tmp, "a failed predict")
    print("fx_outputs: predict and export files hold the named outputs; a failing "
          "outputs_batch leaves no file")


def test_legacy_outputs(exe, build, tmp):
    """A model plugin of ABI 2.8 (fixture fx_legacy) still writes its own files through
    the deprecated predict_* / export_* members: a 2.9 core calls them for it (a minor
    version adds, it never takes away); the predict file is renamed from the core's
    temporary name."""
    h5 = os.path.join(tmp, "r.h5")
    env, rd = fixture_run(exe, build, tmp, "fxl", "fx_legacy")
    exp = os.path.join(rd, "outputs", "fx_legacy.txt")
    rows = sum(int(l.split()[1]) for l in open(exp))
    if rows != 100:
        fail("legacy export: %s holds %d rows, expected train + val + test = 100" % (exp, rows))
    out = os.path.join(tmp, "fxl_pred.txt")
    run([exe, "predict", rd, h5, out], env=env)
    rows = sum(int(l.split()[1]) for l in open(out))
    if rows != 20:
        fail("legacy predict: %s holds %d rows, expected the 20 test rows" % (out, rows))
    no_temporaries(tmp, "legacy predict")
    print("fx_legacy: an ABI 2.8 model's own predict and export files are written as before")


def main():
    build = os.path.abspath(sys.argv[1])
    exe = os.path.join(build, "core", "pipeline")
    with tempfile.TemporaryDirectory(prefix="pl_test_predict_gm_") as tmp:
        test_gat_node(exe, tmp)
        test_gat_graphs(exe, tmp)
        test_mlp(exe, tmp)
        test_no_predict(exe, build, tmp)
        test_named_outputs(exe, build, tmp)
        test_legacy_outputs(exe, build, tmp)
    print("OK")


if __name__ == "__main__":
    main()
