#!/usr/bin/env bash
# Hunt for new counterexamples: run every Hypothesis test of tests/ (pytest marker "hypothesis",
# added by Hypothesis's pytest plugin) under the randomised "explore" profile, once per seed.
#
#   tests/explore_hypothesis.sh              seeds 1..20
#   tests/explore_hypothesis.sh 1 50         seeds 1..50
#   PYTHON=.venv/bin/python tests/explore_hypothesis.sh
#
# Prints one line per seed and, at the end, the failing tests with their seeds; a failure shows
# the falsifying example and a @reproduce_failure blob (print_blob=True) in the log of that seed,
# kept under ${EXPLORE_LOG_DIR:-/tmp/hypothesis-explore}.  Exit status 1 if any seed failed.
set -u -o pipefail
first=${1:-1}
last=${2:-20}
python=${PYTHON:-python}
logdir=${EXPLORE_LOG_DIR:-/tmp/hypothesis-explore}
mkdir -p "$logdir"
cd "$(dirname "$0")/.."
failed=()
for seed in $(seq "$first" "$last"); do
    log="$logdir/seed-$seed.log"
    if HYPOTHESIS_PROFILE=explore "$python" -m pytest tests -m hypothesis -q -p no:cacheprovider \
        --hypothesis-seed="$seed" >"$log" 2>&1; then
        echo "seed $seed: ok ($(tail -n 1 "$log"))"
    else
        echo "seed $seed: FAILED ($(tail -n 1 "$log"))"
        while read -r line; do failed+=("seed $seed: $line"); done < <(grep '^FAILED' "$log")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    printf '%s\n' "failures (logs in $logdir):" "${failed[@]}"
    exit 1
fi
echo "no failure over seeds $first..$last"
