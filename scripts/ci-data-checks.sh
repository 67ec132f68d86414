#!/usr/bin/env bash
# CI data checks (docs/team.md): pull the shards of data/examples from the DVC remote and run the
# Great Expectations suites on them. The steps of .github/workflows/data-checks.yml and .gitlab-ci.yml.
#
#   scripts/ci-data-checks.sh [--no-install] [DATA_DOCS_DIR]
#
# Needs the remote's credentials in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and,
# for a store other than AWS, AWS_ENDPOINT_URL), never in a file. Exit status: 0 all checks pass,
# 1 an expectation failed (the report names the shard and the expectation), 2 bad input (no remote,
# a shard missing from it: one line saying what to do). Data Docs: DATA_DOCS_DIR
# (default reports/ci_data_docs), to keep as the job's artifact.
set -euo pipefail
cd "$(dirname "$0")/.."
install=1
if [ "${1:-}" = "--no-install" ]; then install=0; shift; fi
docs=${1:-reports/ci_data_docs}
[ -n "${AWS_ENDPOINT_URL:-}" ] || unset AWS_ENDPOINT_URL   # an empty CI variable: AWS S3 itself
if [ "$install" = 1 ]; then
    make install                  # .venv from pyproject.toml + constraints.txt (with the team extra: dvc-s3)
    export PATH="$PWD/.venv/bin:$PATH"
fi
for tool in dvc bertrace; do
    command -v "$tool" >/dev/null || { echo "error: no \`$tool\` on PATH: run \`make install\` (or drop --no-install)" >&2; exit 2; }
done
if ! dvc remote list | grep -q .; then
    echo "error: no DVC remote in .dvc/config: add one (docs/team.md: dvc remote add -d team s3://...)" >&2
    exit 2
fi
echo "ci-data-checks: dvc pull data/examples" >&2
if ! dvc pull data/examples; then
    echo "error: dvc pull data/examples failed (above): push the shards from the machine that built them (dvc push), and check the remote's credentials" >&2
    exit 2
fi
mkdir -p "$docs"
echo "ci-data-checks: bertrace validate data/examples (Data Docs: $docs)" >&2
bertrace validate data/examples --data-docs "$docs" --report "$docs/report.json"
