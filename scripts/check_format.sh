#!/usr/bin/env bash
# Checks that every C++ file in git follows .clang-format; lists the files that do not.
#   scripts/check_format.sh [--fix]     --fix: reformat them in place
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check_format.sh: clang-format is missing (scripts/setup.sh installs it)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check_format.sh: ${#bad[@]} file(s) do not follow .clang-format (fix: scripts/check_format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format.sh: ${#files[@]} files follow .clang-format"
