#!/usr/bin/env bash
# gpu-device-check.sh — run kvsched-gpu's tests and its copy-bandwidth bench on an NVIDIA GPU.
#
# The GPU machine has no network (and may have no Rust toolchain), so this works in two steps:
#
#   1. HERE, on the build machine (x86-64 Linux with cargo), from anywhere in the repository:
#
#        scripts/gpu-device-check.sh build
#
#      runs `cargo test -p kvsched-gpu --release --no-run` and builds the `copy_bandwidth` example
#      in release mode, then copies the test binaries (kvsched_gpu = the unit tests, core_moves,
#      integrity, model, serving_loop; the build fails if one is missing) to .device/tests/ and
#      the example to .device/copy_bandwidth (debug info stripped: a few MB in all). .device/ is
#      ignored by git (the script gives it its own .gitignore).
#      cudarc loads libcuda at run time, so the binaries build and link without CUDA.
#
#   2. THERE, on the GPU machine (x86-64, CUDA driver, no network), from the repository root:
#
#        scripts/gpu-device-check.sh run
#
#      runs every copied test binary (--nocapture --test-threads=1, so the CUDA tests' results and
#      any "skipped: <reason>" lines show), then copy_bandwidth, and prints a summary. The CUDA
#      tests: integrity's cuda_* cases, model's and core_moves' property tests on CudaKvStore, and
#      serving_loop's cuda_serving_loop_keeps_every_page (a kvsched-core Scheduler driving
#      CudaKvStore and CudaAdapterStore through kvsched_gpu::bind for 4 x 600 iterations).
#      Then `copy_bandwidth --sweep`: every copy method (one copy per run, the batched driver copy,
#      the kernel on 1, 2 and 4 blocks, the default plan) for 4 KiB to 2 MiB pages both ways, next to
#      one contiguous copy, as a Markdown table (also written to copy-sweep.md beside the log; about
#      a minute on an H200).
#      The full log also goes to $OUT/gpu-device-check.log when $OUT is set (the device tool's
#      output folder), else to .device/gpu-device-check.log. Exit status 0 only if every binary passed.
#
#      With the device tool: carry [".device"], command "scripts/gpu-device-check.sh run",
#      timeout ~300 s (the tests take seconds; the default bench moves 4 x 256 MiB x 6 times).
#
# Environment for `run`:
#   BENCH_ARGS   arguments for copy_bandwidth (default: "--pages 4096 --page-kib 64 --iters 5")
#   SWEEP_ARGS   arguments for the sweep (default: "--mib 256 --iters 5")
#   REQUIRE_GPU  1 (default) = a test that printed "skipped:" or a bench without a driver fails
#                the run, since the point of running there is to exercise the GPU; 0 = allow.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE_DIR="$ROOT/.device"

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit 2
}

# Prints the "executable" paths of the compiler-artifact messages on stdin that match $1.
executables() {
    grep '"reason":"compiler-artifact"' | grep -e "$1" |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p'
}

build() {
    cd "$ROOT"
    rm -rf "$DEVICE_DIR"
    mkdir -p "$DEVICE_DIR/tests"
    printf '*\n' >"$DEVICE_DIR/.gitignore"

    echo "== cargo test -p kvsched-gpu --release --no-run"
    local tests
    tests="$(cargo test -p kvsched-gpu --release --no-run --message-format=json | executables '"test":true')"
    [ -n "$tests" ] || { echo "no test binaries found" >&2; exit 1; }
    local bin
    for bin in $tests; do
        # target/release/deps/integrity-0123abcd -> .device/tests/integrity
        cp "$bin" "$DEVICE_DIR/tests/$(basename "${bin%-*}")"
    done
    local expected
    for expected in kvsched_gpu core_moves integrity model serving_loop; do
        [ -x "$DEVICE_DIR/tests/$expected" ] || { echo "test binary $expected not built" >&2; exit 1; }
    done

    echo "== cargo build -p kvsched-gpu --release --example copy_bandwidth"
    local example
    example="$(cargo build -p kvsched-gpu --release --example copy_bandwidth --message-format=json |
        executables '"kind":\["example"\]')"
    [ -n "$example" ] || { echo "copy_bandwidth not built" >&2; exit 1; }
    cp "$example" "$DEVICE_DIR/copy_bandwidth"
    # The release profile keeps debug info (~50 MB in all); the device tool carries 64 MiB at most.
    # Symbols stay, so panics still show function names.
    if command -v strip >/dev/null; then
        strip --strip-debug "$DEVICE_DIR"/tests/* "$DEVICE_DIR/copy_bandwidth"
    fi

    {
        echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
            git -C "$ROOT" diff --quiet -- gpu 2>/dev/null || echo ' (gpu/ has uncommitted changes)')"
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(rustc --version)"
    } >"$DEVICE_DIR/BUILD_INFO"
    echo "== ready: $(ls "$DEVICE_DIR/tests" | tr '\n' ' ')copy_bandwidth"
    du -sh "$DEVICE_DIR"
}

run() {
    [ -d "$DEVICE_DIR/tests" ] || { echo "no $DEVICE_DIR/tests: run '$0 build' on the build machine first" >&2; exit 2; }
    local log="${OUT:-$DEVICE_DIR}/gpu-device-check.log"
    local bench_args="${BENCH_ARGS:---pages 4096 --page-kib 64 --iters 5}"
    local sweep_args="${SWEEP_ARGS:---mib 256 --iters 5}"
    local require_gpu="${REQUIRE_GPU:-1}"
    mkdir -p "$(dirname "$log")"
    : >"$log"
    local failed=() passed=() skipped=0

    {
        echo "== build: $(tr '\n' ';' <"$DEVICE_DIR/BUILD_INFO" 2>/dev/null || echo unknown)"
        echo "== host: $(uname -srm)"
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
                --format=csv,noheader || true
        else
            echo "nvidia-smi not found"
        fi
    } 2>&1 | tee -a "$log"

    local bin name status
    for bin in "$DEVICE_DIR"/tests/* "$DEVICE_DIR/copy_bandwidth" sweep; do
        name="$(basename "$bin")"
        echo "== $name" | tee -a "$log"
        local args=(--nocapture --test-threads=1)
        [ "$name" = copy_bandwidth ] && read -r -a args <<<"$bench_args"
        if [ "$name" = sweep ]; then
            bin="$DEVICE_DIR/copy_bandwidth"
            read -r -a args <<<"--sweep $sweep_args"
        fi
        set +e
        "$bin" "${args[@]}" 2>&1 | tee -a "$log" | tee "$DEVICE_DIR/.last"
        status=${PIPESTATUS[0]}
        set -e
        local skips
        skips="$(grep -c 'skipped:' "$DEVICE_DIR/.last" || true)"
        skipped=$((skipped + skips))
        if [ "$status" -ne 0 ]; then
            failed+=("$name (exit $status)")
        elif [ "$require_gpu" = 1 ] && [ "$skips" -gt 0 ]; then
            failed+=("$name ($skips skipped)")
        else
            passed+=("$name")
        fi
    done
    grep '^|' "$log" | tail -n 14 >"$(dirname "$log")/copy-sweep.md" || true
    rm -f "$DEVICE_DIR/.last"

    {
        echo "== summary"
        echo "passed: ${passed[*]:-none}"
        echo "failed: ${failed[*]:-none}"
        echo "skip lines: $skipped"
        echo "log: $log"
    } | tee -a "$log"
    [ "${#failed[@]}" -eq 0 ]
}

case "${1:-}" in
    build) build ;;
    run) run ;;
    *) usage ;;
esac
