#!/usr/bin/env bash
# The base side of scripts/device_commit_ab.sh: the sources a build needs (csrc, flashattn_cu,
# setup.py, pyproject.toml, MANIFEST.in, README.md) at COMMIT, unpacked into .ab_base/ (git-ignored, so the
# device tool carries it only when named: run(..., carry=[".ab_base"]); ~1.3 MB).
#   bash scripts/make_ab_base.sh 856d0ed
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
commit=${1:?usage: make_ab_base.sh COMMIT}
full=$(git rev-parse --short "$commit^{commit}")
rm -rf .ab_base
mkdir -p .ab_base
git archive "$full" csrc flashattn_cu setup.py pyproject.toml MANIFEST.in README.md | tar -x -C .ab_base
echo "$full" > .ab_base/COMMIT
echo ".ab_base: $full ($(du -sh .ab_base | cut -f1))"
