#!/usr/bin/env bash
# One command for a CUDA machine: every CUDA-touching test, then bench_depth, bench_peers, the
# GPT-2-small diagnosis and bench_sweep on CUDA, each with a time limit, and one table at the
# end (step, status, seconds, the step's summary line). Sized to finish in under 10 minutes on
# one modern GPU; each step's full output is kept in $LOG_DIR.
#
#   bash benchmarks/gpu_check.sh            # from the repository root, in the venv
#   LOG_DIR=/tmp/gpu-check STEP_LIMIT=120 bash benchmarks/gpu_check.sh
#
# No figure it prints is written into the docs by this script.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
LOG_DIR=${LOG_DIR:-$(mktemp -d -t probekit-gpu-check.XXXXXX)}
STEP_LIMIT=${STEP_LIMIT:-90} # seconds per benchmark step (the tests get 120): 570 s at most
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "gpu_check.sh: $PYTHON cannot import torch; activate the environment with probekit" \
        "installed (pip install -e '.[dev,bench]') or set PYTHON" >&2
    exit 2
fi
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check.sh: torch sees no CUDA device (torch.cuda.is_available() is False);" \
        "run it on a machine with an NVIDIA GPU and a CUDA build of torch" >&2
    exit 2
fi
mkdir -p "$LOG_DIR"
"$PYTHON" -c "import torch; print('device:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
uptime

# the tests that mention CUDA (their CUDA branches run here and are skipped elsewhere)
mapfile -t CUDA_TESTS < <(grep -liE "cuda" tests/test_*.py | sort)
if ((${#CUDA_TESTS[@]} == 0)); then # never let an empty list make pytest run the whole suite
    echo "gpu_check.sh: no test under tests/ mentions CUDA" >&2
    exit 2
fi

ROWS=()
FAILED=0
step() { # step NAME LIMIT PATTERN COMMAND...: run with a limit, keep the log, add a table row
    local name=$1 limit=$2 pattern=$3 start status summary
    shift 3
    start=$(date +%s)
    echo "== $name: $*"
    if timeout "$limit" "$@" >"$LOG_DIR/$name.log" 2>&1; then
        status=ok
    else
        status="failed ($?)"
        FAILED=$((FAILED + 1))
    fi
    summary=$(grep -E "$pattern" "$LOG_DIR/$name.log" | tail -n 1 || true)
    [[ -n $summary ]] || summary=$(tail -n 1 "$LOG_DIR/$name.log")
    ROWS+=("$(printf '%-14s | %-12s | %5ss | %s' "$name" "$status" "$(($(date +%s) - start))" "$summary")")
    echo "   $status: $summary"
}

step tests 120 "passed|failed|error" "$PYTHON" -m pytest -q -p no:randomly -n 0 "${CUDA_TESTS[@]}"
step bench_depth "$STEP_LIMIT" "speed-up" "$PYTHON" benchmarks/bench_depth.py --device cuda --repeats 1 --memory
step bench_peers "$STEP_LIMIT" "probekit vs the fastest peer" \
    "$PYTHON" benchmarks/bench_peers.py --device cuda --model bench24 --repeats 1
step peers_gpt2 "$STEP_LIMIT" "probekit vs the fastest peer" \
    "$PYTHON" benchmarks/bench_peers.py --device cuda --model gpt2-small --repeats 1 --no-memory
step diagnose_gpt2 "$STEP_LIMIT" '"seconds"' \
    "$PYTHON" benchmarks/bench_diagnose_gpt2.py --device cuda --mode diagnose
step bench_sweep "$STEP_LIMIT" "per step|ratio loop" "$PYTHON" benchmarks/bench_sweep.py --device cuda \
    --steps 500 --batch-sizes 256 --loop-runs 2 --repeats 1

uptime
echo
printf '%-14s | %-12s | %6s | %s\n' step status time summary
for row in "${ROWS[@]}"; do echo "$row"; done
echo "logs: $LOG_DIR"
((FAILED == 0)) || { echo "$FAILED step(s) failed" >&2; exit 1; }
