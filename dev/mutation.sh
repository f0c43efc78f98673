#!/usr/bin/env bash
# Mutation testing (mutmut) of the files pyproject.toml's [tool.mutmut] only_mutate names, against their fast tests.
# Slow (hours of CPU for all mutants on 2 cores), so not part of `make test`; results accumulate in
# mutants/, so it can run in chunks and be stopped and resumed at any time.
#
#   dev/mutation.sh                       # every mutant not yet tested, then the scores
#   dev/mutation.sh run 'model.norm.*'    # a chunk: one module's mutants not run yet or surviving unexplained
#   dev/mutation.sh run NAME              # one mutant (mutmut's name), run again whatever its result
#   dev/mutation.sh score                 # mutation score per target, from what has run
#   .venv/bin/mutmut show NAME            # the diff of one mutant; `mutmut results` lists survivors
#
# CHUNK_S (default: none) stops a chunk after that many seconds; what finished is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MUTMUT=${MUTMUT:-$(dirname "$PY")/mutmut}
export OMP_NUM_THREADS=1  # tiny models: one thread per worker, one worker per core
# Each mutant is a pytest session of its own: keep debug=tiny's prepared data between them (tests/fixtures.py).
export MINILLAMA_TEST_DATA_CACHE=${MINILLAMA_TEST_DATA_CACHE:-$PWD/mutants/.test-data-cache}

command=${1:-all}
[ $# -gt 0 ] && shift
case "$command" in
  run|all)
    if [ $# -gt 0 ]; then
      # mutmut reruns every mutant a glob matches; keep a chunk to those not run yet or surviving unexplained,
      # so running the same command again continues where it stopped.
      mapfile -t todo < <("$PY" -m dev.mutation_score --todo "$@" | grep .)
      if [ ${#todo[@]} -eq 0 ]; then
        echo "nothing left to run for: $* (every matching mutant is killed or judged equivalent)"
        [ "$command" = all ] && exec "$PY" -m dev.mutation_score
        exit 0
      fi
      set -- "${todo[@]}"
    fi
    limit=()
    [ -n "${CHUNK_S:-}" ] && limit=(timeout --kill-after=10 "$CHUNK_S")
    # timeout exits 124 when it stops a chunk: that is a planned stop, not a failure.
    "${limit[@]}" "$MUTMUT" run --max-children "${MAX_CHILDREN:-2}" "$@" || [ $? -eq 124 ]
    if [ "$command" = all ]; then exec "$PY" -m dev.mutation_score; fi
    ;;
  score)
    exec "$PY" -m dev.mutation_score "$@"
    ;;
  *)
    echo "error: unknown command '$command'; use run [MUTANT-GLOB ...], score, or nothing for all" >&2
    exit 1
    ;;
esac
