#!/usr/bin/env bash
# test_sdk.sh SOURCE_DIR BUILD_DIR - the SDK as an out-of-tree plugin author
# meets it, with no rebuild of pipeline:
#   1. install the build's SDK (components runtime + dev: library, CLI, the
#      cpu backend plugin, headers, pipeline.pc, CMake package) into a
#      temporary prefix; the core links no OpenBLAS, the cpu plugin does;
#   2. build examples/ against it with CMake (find_package through
#      CMAKE_PREFIX_PATH) and with make + pkg-config (PKG_CONFIG_PATH);
#   3. the installed `pipeline` lists, checks and runs examples/example.ini
#      with PIPELINE_PLUGIN_PATH on each out-of-tree build (summary.json
#      status ok, finite test loss), and a run resumed mid-epoch ends where an
#      uninterrupted one does (the example loader's start_batch);
#   4. a plugin's test program builds and runs against the installed harness
#      (pipeline/testing.h, libpipeline_testing, pipeline-testing.pc), and a
#      program that writes and reads safetensors against the installed file
#      formats (pipeline/safetensors.h, libpipeline_io, pipeline-io.pc);
#   5. plugins built for another ABI (a descriptor claiming another major, a
#      newer minor, and a plugin linked against libpipeline_core.so.<other
#      major>) are refused by `pipeline plugins` and `pipeline check` with a
#      message naming the file and both versions.
# Needs cmake, make, pkg-config and a C compiler; no network. Prints
# "ok - ..." / "FAIL - ..." per check and "N passed, M failed"; exit 1 on any failure.
set -u
if [ $# -ne 2 ]; then
    echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2
    exit 2
fi
SRC=$(cd "$1" && pwd) || exit 2
BUILD=$(cd "$2" && pwd) || exit 2
CMAKE=${CMAKE:-cmake}
CC=${CC:-cc}
MAKE=${MAKE:-make}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/pl-sdk-test.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT
PREFIX=$TMP/prefix
PIPELINE=$PREFIX/bin/pipeline
INI=$SRC/examples/example.ini
EXAMPLES="linear_warmup signsgd synth_regression linreg"
ABI_MAJOR=$(sed -n 's/^#define PL_ABI_MAJOR \([0-9][0-9]*\).*/\1/p' "$SRC/core/include/pipeline/plugin.h")
ABI_MINOR=$(sed -n 's/^#define PL_ABI_MINOR \([0-9][0-9]*\).*/\1/p' "$SRC/core/include/pipeline/plugin.h")
OTHER_MAJOR=$((ABI_MAJOR > 1 ? ABI_MAJOR - 1 : ABI_MAJOR + 1))
# the runs write nowhere near the sources, and no inherited plugin path counts
unset PIPELINE_PLUGIN_PATH
cd "$TMP" || exit 2

passed=0
failed=0
# check NAME COMMAND...: run it, log to $TMP/NAME.log, count, show the log tail on failure
check() {
    local name=$1
    shift
    "$@" >"$TMP/$name.log" 2>&1
    local rc=$?
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
        echo "ok - $name"
    else
        failed=$((failed + 1))
        echo "FAIL - $name (exit $rc): $*"
        tail -n 25 "$TMP/$name.log" | sed 's/^/    /'
    fi
}
# has FILE TEXT...: every TEXT occurs in FILE (fixed strings)
has() {
    local f=$1
    shift
    local t
    for t in "$@"; do
        grep -qF -- "$t" "$f" || {
            echo "expected '$t' in $f:"
            cat "$f"
            return 1
        }
    done
}

# ---- 1. install -----------------------------------------------------------

install_sdk() {
    "$CMAKE" --install "$BUILD" --prefix "$PREFIX" --component runtime &&
        "$CMAKE" --install "$BUILD" --prefix "$PREFIX" --component dev
}
check install install_sdk

installed_layout() {
    local f
    for f in bin/pipeline include/pipeline/pipeline.h include/pipeline/plugin.h \
        "lib/libpipeline_core.so.$ABI_MAJOR" lib/libpipeline_core.so lib/pkgconfig/pipeline.pc \
        "lib/libpipeline_testing.so.$ABI_MAJOR" lib/libpipeline_testing.so \
        "lib/libpipeline_run.so.$ABI_MAJOR" \
        lib/pkgconfig/pipeline-testing.pc include/pipeline/testing.h \
        "lib/libpipeline_io.so.$ABI_MAJOR" lib/libpipeline_io.so lib/pkgconfig/pipeline-io.pc \
        include/pipeline/safetensors.h \
        lib/cmake/pipeline/pipelineConfig.cmake lib/cmake/pipeline/pipelineConfigVersion.cmake \
        lib/cmake/pipeline/pipelineTargets.cmake lib/pipeline/plugins/cpu.so; do
        [ -e "$PREFIX/$f" ] || {
            echo "missing $PREFIX/$f"
            return 1
        }
    done
    # SONAME = plugin ABI major
    objdump -p "$PREFIX/lib/libpipeline_core.so.$ABI_MAJOR" | grep -E "SONAME +libpipeline_core\.so\.$ABI_MAJOR\$"
}
check installed_layout_and_soname installed_layout

# the installed core needs no HDF5: not linked, no header includes it, no
# package file asks for it
no_hdf5() {
    if objdump -p "$PREFIX/lib/libpipeline_core.so.$ABI_MAJOR" | grep -i hdf5; then return 1; fi
    if grep -rE '#[[:space:]]*include[[:space:]]*[<"](hdf5|H5)' "$PREFIX/include"; then return 1; fi
    if grep -ril hdf5 "$PREFIX/lib/pkgconfig" "$PREFIX/lib/cmake"; then return 1; fi
    return 0
}
check installed_core_needs_no_hdf5 no_hdf5

# the CPU kernels and OpenBLAS are the cpu backend plugin (runtime component),
# not the core: no OpenBLAS in the core's needs nor in its undefined symbols
no_openblas() {
    local core=$PREFIX/lib/libpipeline_core.so.$ABI_MAJOR
    if objdump -p "$core" | grep -i openblas; then return 1; fi
    if nm -D --undefined-only "$core" | grep -iE "cblas_|openblas_"; then return 1; fi
    objdump -p "$PREFIX/lib/pipeline/plugins/cpu.so" | grep -q "NEEDED *libopenblas"
}
check installed_core_links_no_openblas_the_cpu_plugin_does no_openblas

# ---- 2. build the examples out of tree ------------------------------------

build_cmake() {
    "$CMAKE" -S "$SRC/examples" -B "$TMP/ex-cmake" -DCMAKE_PREFIX_PATH="$PREFIX" \
        -DCMAKE_BUILD_TYPE=Release &&
        "$CMAKE" --build "$TMP/ex-cmake" -j 2 &&
        for p in $EXAMPLES; do [ -f "$TMP/ex-cmake/$p.so" ] || return 1; done
}
check examples_build_with_cmake_find_package build_cmake

build_make() {
    PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig "$MAKE" -C "$SRC/examples" OUT="$TMP/ex-make" \
        CC="$CC" PKG_CONFIG="$PKG_CONFIG" &&
        for p in $EXAMPLES; do [ -f "$TMP/ex-make/$p.so" ] || return 1; done
}
check examples_build_with_make_pkg_config build_make

pc_plugindir() {
    local d
    d=$(PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig "$PKG_CONFIG" --variable=plugindir pipeline) &&
        mkdir -p "$d" && [ "$(cd "$d" && pwd -P)" = "$(cd "$PREFIX" && pwd -P)/lib/pipeline/plugins" ]
}
check pkg_config_plugindir_is_the_install_plugin_dir pc_plugindir

# a plugin exports exactly one symbol: pl_plugin_entry
one_export() {
    local p n
    for p in $EXAMPLES; do
        n=$(nm -D --defined-only "$TMP/ex-cmake/$p.so" | awk '$2 ~ /^[TDBR]$/' | wc -l)
        nm -D --defined-only "$TMP/ex-cmake/$p.so" | grep -q " T pl_plugin_entry$" && [ "$n" -eq 1 ] ||
            return 1
    done
}
check examples_export_only_the_entry_symbol one_export

# ---- 3. the installed CLI with the out-of-tree plugins -------------------

list_examples() {
    PIPELINE_PLUGIN_PATH=$TMP/ex-cmake "$PIPELINE" plugins >"$TMP/plugins.out" 2>&1 &&
        has "$TMP/plugins.out" "$TMP/ex-cmake/linear_warmup.so" "$TMP/ex-cmake/signsgd.so" \
            "$TMP/ex-cmake/synth_regression.so" "$TMP/ex-cmake/linreg.so" &&
        ! grep -q REFUSED "$TMP/plugins.out"
}
check pipeline_plugins_lists_the_examples list_examples

check_ini() {
    PIPELINE_PLUGIN_PATH=$1 "$PIPELINE" check "$INI" >"$TMP/check.out" 2>&1 &&
        has "$TMP/check.out" "config OK"
}
check pipeline_check_example_ini_cmake_build check_ini "$TMP/ex-cmake"
check pipeline_check_example_ini_make_build check_ini "$TMP/ex-make"

# summary_ok RUN_DIR: status ok and a finite test loss in RUN_DIR/summary.json
summary_ok() {
    local s=$1/summary.json loss
    [ -f "$s" ] || {
        echo "no $s"
        return 1
    }
    grep -qE '"status":[[:space:]]*"ok"' "$s" || {
        echo "status is not ok:"
        cat "$s"
        return 1
    }
    loss=$(test_loss "$s")
    echo "test loss $loss"
    awk -v v="$loss" 'BEGIN { exit !(v != "" && v + 0 == v + 0 && v + 0 < 1e30 && v + 0 > -1e30) }'
}
# the "loss" value of "test_metrics" in a summary.json
test_loss() {
    awk '/"test_metrics"/ { t = 1 } t && /"loss"/ { gsub(/[",]/, ""); print $2; exit }' "$1"
}

run_example() {
    local plugins=$1 name=$2
    shift 2
    PIPELINE_PLUGIN_PATH=$plugins "$PIPELINE" run "$INI" pipeline.run_dir="$TMP/runs" \
        pipeline.name="$name" trainer.max_epochs=2 "$@"
}
check pipeline_run_example_cmake_build run_example "$TMP/ex-cmake" cmake
check run_summary_ok_cmake_build summary_ok "$TMP/runs/cmake/latest"
check pipeline_run_example_make_build run_example "$TMP/ex-make" make
check run_summary_ok_make_build summary_ok "$TMP/runs/make/latest"

# resume mid-epoch (step 44 = epoch 1, batch 12 of 32): same test loss, bit
# for bit, as the uninterrupted 2-epoch run of the same build
resume_mid_epoch() {
    local ck full resumed
    run_example "$TMP/ex-cmake" part trainer.max_steps=44 trainer.checkpoint_every_n_train_steps=4 \
        trainer.test=false || return 1
    ck=$(ls "$TMP"/runs/part/*/checkpoints/step-000044.safetensors 2>/dev/null | head -n 1)
    [ -n "$ck" ] || {
        echo "no step-000044 checkpoint"
        return 1
    }
    run_example "$TMP/ex-cmake" resumed --resume "$ck" || return 1
    summary_ok "$TMP/runs/resumed/latest" || return 1
    full=$(test_loss "$TMP/runs/cmake/latest/summary.json")
    resumed=$(test_loss "$TMP/runs/resumed/latest/summary.json")
    echo "uninterrupted $full, resumed $resumed"
    [ -n "$full" ] && [ "$full" = "$resumed" ]
}
check resumed_mid_epoch_matches_uninterrupted resume_mid_epoch

# ---- 4. the installed test harness --------------------------------------

# the CLI's services (predict, export, plot), the run (libpipeline_run: the
# trainer, the crash handler) and the harness are not in the library plugins
# link against; pl_message, which plugins call, is
core_is_lean() {
    local core="$PREFIX/lib/libpipeline_core.so.$ABI_MAJOR" run="$PREFIX/lib/libpipeline_run.so.$ABI_MAJOR"
    if nm -D --defined-only "$core" |
        grep -E " T (pl_harness_|pl_snapshot_|pl_predict_run|pl_export_run|pl_plot_run|pl_trainer_|tr_|pl_crash_handler_install)"; then
        return 1
    fi
    nm -D --defined-only "$core" | grep -q " T pl_message$"
    nm -D --defined-only "$run" | grep -q " T pl_trainer_run$"
    nm -D --defined-only "$PREFIX/lib/libpipeline_testing.so.$ABI_MAJOR" | grep -q " T pl_harness_new_in$"
}
check core_library_holds_no_cli_service_nor_harness core_is_lean

# no plugin needs the run (the build's plugins, the out-of-tree examples): none
# names libpipeline_run, none leaves a symbol undefined that only the run defines
plugins_link_core_only() {
    local run_syms p
    run_syms=$(mktemp)
    nm -D --defined-only "$PREFIX/lib/libpipeline_run.so.$ABI_MAJOR" | awk '{print $3}' >"$run_syms"
    for p in "$BUILD"/plugins/*.so "$TMP"/ex-cmake/*.so; do
        if objdump -p "$p" | grep -E "NEEDED +libpipeline_run" ||
            nm -D --undefined-only "$p" | awk '{print $2}' | grep -xFf "$run_syms"; then
            echo "$p needs libpipeline_run"
            rm -f "$run_syms"
            return 1
        fi
    done
    rm -f "$run_syms"
}
check plugins_need_no_run_library plugins_link_core_only

harness_pkg_config() {
    local flags san=
    # a sanitizer build's libraries need the program instrumented too (the
    # ASan runtime must come first), as CI's ASan pass builds them
    if ldd "$PREFIX/lib/libpipeline_core.so" 2>/dev/null | grep -q libasan; then
        san="-fsanitize=address,undefined"
    fi
    flags=$(PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig "$PKG_CONFIG" --cflags --libs pipeline-testing) &&
        echo "pkg-config pipeline-testing: $flags $san" &&
        "$CC" -std=gnu11 $san "$SRC/tests/sdk/harness_use.c" -o "$TMP/harness_use" $flags \
            -Wl,-rpath,"$PREFIX/lib" &&
        "$TMP/harness_use" "$TMP/ex-cmake"
}
check harness_builds_and_runs_with_pkg_config harness_pkg_config

# the file formats are their own library (issue 33): the core defines no
# pl_st_* / pl_nf4_load_into, libpipeline_io does, the CMake package names
# pipeline::io, and a program built with `pkg-config --libs pipeline-io`
# writes, reads back and refuses a truncated safetensors file
io_pkg_config() {
    local flags san=
    if nm -D --defined-only "$PREFIX/lib/libpipeline_core.so.$ABI_MAJOR" |
        grep -E " T (pl_st_|pl_nf4_load_into)"; then
        return 1
    fi
    nm -D --defined-only "$PREFIX/lib/libpipeline_io.so.$ABI_MAJOR" | grep -q " T pl_st_open$" &&
        grep -q "pipeline::io" "$PREFIX/lib/cmake/pipeline/pipelineTargets.cmake" || return 1
    if ldd "$PREFIX/lib/libpipeline_core.so" 2>/dev/null | grep -q libasan; then
        san="-fsanitize=address,undefined"
    fi
    flags=$(PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig "$PKG_CONFIG" --cflags --libs pipeline-io) &&
        echo "pkg-config pipeline-io: $flags $san" &&
        "$CC" -std=gnu11 $san "$SRC/tests/sdk/io_use.c" -o "$TMP/io_use" $flags \
            -Wl,-rpath,"$PREFIX/lib" &&
        "$TMP/io_use" "$TMP/io_use.safetensors"
}
check io_library_builds_and_runs_with_pkg_config io_pkg_config

# ---- 5. plugins built for another ABI are refused ------------------------

build_bad_abi() {
    local inc=$PREFIX/include lib=$PREFIX/lib d=$TMP/bad
    mkdir -p "$d" "$TMP/stub" || return 1
    # a descriptor claiming another major, linked against this core
    "$CC" -std=gnu11 -fPIC -shared -I"$inc" -DOLD_ABI_NAME='"old_major"' \
        -DOLD_ABI_MAJOR="$OTHER_MAJOR" -DOLD_ABI_MINOR=3 "$SRC/tests/sdk/old_abi.c" \
        -o "$d/old_major.so" -L"$lib" -lpipeline_core || return 1
    # the same major with a newer minor than this core
    "$CC" -std=gnu11 -fPIC -shared -I"$inc" -DOLD_ABI_NAME='"new_minor"' \
        -DOLD_ABI_MAJOR="$ABI_MAJOR" -DOLD_ABI_MINOR="$((ABI_MINOR + 1))" \
        "$SRC/tests/sdk/old_abi.c" -o "$d/new_minor.so" -L"$lib" -lpipeline_core || return 1
    # linked against libpipeline_core.so.<other major> (a stub with that
    # SONAME, absent at run time), as a plugin built by an older pipeline is
    echo 'void pl_stub_core(void) {}' >"$TMP/stub/stub.c" &&
        "$CC" -fPIC -shared -Wl,-soname,"libpipeline_core.so.$OTHER_MAJOR" "$TMP/stub/stub.c" \
            -o "$TMP/stub/libpipeline_core.so" &&
        "$CC" -std=gnu11 -fPIC -shared -I"$inc" -DOLD_ABI_NAME='"old_soname"' \
            -DOLD_ABI_MAJOR="$OTHER_MAJOR" "$SRC/tests/sdk/old_abi.c" -o "$d/old_soname.so" \
            -L"$TMP/stub" -Wl,--no-as-needed -lpipeline_core
}
check other_abi_plugins_build build_bad_abi

list_refuses() {
    PIPELINE_PLUGIN_PATH=$TMP/bad "$PIPELINE" plugins >"$TMP/bad.out" 2>&1
    local rc=$?
    cat "$TMP/bad.out"
    [ $rc -eq 0 ] &&
        has "$TMP/bad.out" \
            "REFUSED: plugin $TMP/bad/old_major.so was built for plugin ABI $OTHER_MAJOR.3 but this core provides ABI $ABI_MAJOR.$ABI_MINOR" \
            "REFUSED: plugin $TMP/bad/new_minor.so needs plugin ABI $ABI_MAJOR.$((ABI_MINOR + 1)) but this core provides only ABI $ABI_MAJOR.$ABI_MINOR" \
            "REFUSED: plugin $TMP/bad/old_soname.so was built for plugin ABI $OTHER_MAJOR (it links libpipeline_core.so.$OTHER_MAJOR) but this core provides ABI $ABI_MAJOR.$ABI_MINOR"
}
check pipeline_plugins_refuses_other_abis_naming_file_and_versions list_refuses

# check_refuses NAME TEXT...: `pipeline check` with [scheduler] plugin = NAME
# fails with a configuration error (exit 2) whose message has every TEXT
check_refuses() {
    local name=$1 rc
    shift
    PIPELINE_PLUGIN_PATH=$TMP/ex-cmake:$TMP/bad "$PIPELINE" check "$INI" \
        scheduler.plugin="$name" >"$TMP/check-$name.out" 2>&1
    rc=$?
    cat "$TMP/check-$name.out"
    [ $rc -eq 2 ] && has "$TMP/check-$name.out" "$TMP/bad/$name.so" "$@"
}
check pipeline_check_refuses_other_major check_refuses old_major \
    "ABI $OTHER_MAJOR.3" "ABI $ABI_MAJOR.$ABI_MINOR" "[scheduler] plugin = old_major"
check pipeline_check_refuses_newer_minor check_refuses new_minor \
    "ABI $ABI_MAJOR.$((ABI_MINOR + 1))" "ABI $ABI_MAJOR.$ABI_MINOR"
check pipeline_check_refuses_other_core_soname check_refuses old_soname \
    "libpipeline_core.so.$OTHER_MAJOR" "ABI $ABI_MAJOR.$ABI_MINOR" "libpipeline_core.so.$ABI_MAJOR"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
