#!/usr/bin/env bash
# What only a GPU can show, in one script: under 5 minutes on one GPU.
#
#   bash bench/gpu_check.sh              # every section, in order
#   bash bench/gpu_check.sh memory       # only the named sections
#   bash bench/gpu_check.sh --dry-run    # say what each section measures; runs nothing (the tests run this)
#
# A section is three things: its name in SECTIONS, a describe_NAME function (one paragraph for --dry-run) and a
# run_NAME function (exits non-zero when what it checks does not hold). A new measurement is one more section.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, whatever is installed

SECTIONS=(device equivalence memory release)

describe_device() {
    echo "The GPU: name, compute capability, memory, torch and CUDA versions; whether it computes bf16 natively"
    echo "(is_bf16_supported(including_emulation=False) on that device) and the dtype --dtype auto picks there for a"
    echo "checkpoint stored in bf16, with its reason."
}
run_device() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    python - <<'PY'
import torch

from gemma_embed.device import choose_dtype, resolve_device

device = resolve_device("auto")
assert device.type == "cuda", f"no CUDA device: {device}"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)")
print(f"{device}: {torch.cuda.get_device_name(device)}, capability {torch.cuda.get_device_capability(device)}, "
      f"{torch.cuda.get_device_properties(device).total_memory / 2**30:.1f} GiB")
with torch.cuda.device(device):
    native = torch.cuda.is_bf16_supported(including_emulation=False)
choice = choose_dtype("auto", device, torch.bfloat16, "as Gemma 4 checkpoints do")
print(f"bf16 native: {native}; --dtype auto on a bf16 checkpoint: {choice.name} ({choice.reason})")
PY
}

describe_equivalence() {
    echo "bf16 equality against transformers on the GPU: the equivalence tests marked gpu (tests/integration/test_bf16.py with"
    echo "device=cuda; pytest -m gpu -s). Gemma 4 images at 1120 tokens (wide, tall), video frames, Gemma 4 and"
    echo "Gemma 3n audio: every device batch bit-identical to transformers' bf16 model on the same inputs, every"
    echo "item within transformers' own batch-size difference (printed per item)."
}
run_equivalence() {
    python -m pytest -q -s -p no:cacheprovider -m gpu tests/
}

describe_memory() {
    echo "Peak device memory against the planned budget, and the chunk chosen per bucket: python -m"
    echo "bench.gpu_memory runs gemma-embed images on a real-size random vision tower (hidden 768, 16 layers) at 70,"
    echo "280 and 1120 soft tokens and prints, per bucket, the budget, the memory cap, the chunk the tuner chose,"
    echo "and the largest chunk's measured transient against its modelled cost and its budget; then the run's peak"
    echo "against weights + budget, the cost scale learned and the allocator's reserved/allocated/free. Twice: the"
    echo "default rule with the tuner, then a 1 GiB budget with chunks at the memory cap (a budget chunks reach)."
    echo "Fails if a chunk went over budget."
}
run_memory() {
    python -m bench.gpu_memory --device cuda &&
        python -m bench.gpu_memory --device cuda --memory-budget 1GiB --batch-size 64
}

describe_release() {
    echo "Speed at release size in bf16: python -m bench.bench_release on a random vision tower of the real size"
    echo "(hidden 768, 16 layers, 167M parameters, stored bf16), 32 images at each of 70, 280 and 1120 soft tokens"
    echo "and a video clip: gemma-embed against the per-item reference loop (processor + get_image_features per"
    echo "file) and against the bare tower (inputs prepared beforehand): items/s, patches/s, the share of the GPU's"
    echo "bf16 matmul rate, the tool/reference ratio and the tool's share of the bare tower. One round: about"
    echo "2 minutes on an H200 (estimated, not yet run on one)."
}
run_release() {
    python -m bench.bench_release --device cuda --dtypes bfloat16 --images 32 --rounds 1 --no-auto
}

dry_run=0
chosen=()
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry_run=1 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *)
            if ! declare -F "run_$arg" >/dev/null; then
                echo "error: no section '$arg' (sections: ${SECTIONS[*]})" >&2
                exit 2
            fi
            chosen+=("$arg") ;;
    esac
done
[ ${#chosen[@]} -eq 0 ] && chosen=("${SECTIONS[@]}")

if [ "$dry_run" = 1 ]; then
    echo "bench/gpu_check.sh would run ${#chosen[@]} section(s) on the first CUDA device:"
    for name in "${chosen[@]}"; do
        echo
        echo "[$name]"
        "describe_$name"
    done
    exit 0
fi

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: no CUDA device here; bench/gpu_check.sh --dry-run says what it would measure" >&2
    exit 2
fi

failed=()
for name in "${chosen[@]}"; do
    echo
    echo "================ [$name] ================"
    start=$SECONDS
    if "run_$name"; then
        echo "---- [$name] ok in $((SECONDS - start)) s"
    else
        echo "---- [$name] FAILED after $((SECONDS - start)) s"
        failed+=("$name")
    fi
done
echo
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check: failed: ${failed[*]}"
    exit 1
fi
echo "gpu_check: all ${#chosen[@]} section(s) ok"
