#!/usr/bin/env bash
# Checks lora_step's planted bugs: `--bug none` trains and exits 0; every other bug exits 1 with
# PyTorch's in-place error on stderr, except the silent ones (`silent_*`: nothing raises, they
# train and exit 0), and has exactly one `// BUG(<name>)` line in samples/cpp.
#
#   samples/cpp/check_bugs.sh [path/to/lora_step] [extra lora_step options...]
#
# Exit status: 0 when every check passes, 1 otherwise (each failure says which bug and why).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
binary=${1:-$here/../../build/bin/lora_step}
shift || true
expected="one of the variables needed for gradient computation has been modified by an inplace operation"
failures=0

fail() {
  echo "FAIL $1: $2"
  failures=$((failures + 1))
}

if [[ ! -x $binary ]]; then
  echo "check_bugs: no lora_step at $binary (build it, or pass its path)" >&2
  exit 1
fi

out=$("$binary" --bug none --device cpu "$@" 2>&1)
rc=$?
if [[ $rc -ne 0 ]]; then
  fail none "exit $rc: $(head -n 1 <<<"$out")"
elif ! grep -q '^step 0 loss ' <<<"$out"; then
  fail none "no 'step 0 loss' line"
else
  echo "ok   none"
fi

for bug in $("$binary" --list-bugs | awk '$1 != "none" {print $1}'); do
  markers=$(grep -rn --include='*.cc' --include='*.h' -F "// BUG($bug)" "$here" | wc -l)
  if [[ $markers -ne 1 ]]; then
    fail "$bug" "$markers lines marked // BUG($bug), expected 1"
    continue
  fi
  err=$("$binary" --bug "$bug" --device cpu "$@" 2>&1 >/dev/null)
  rc=$?
  first=$(grep -m 1 '^error: ' <<<"$err")
  if [[ $bug == silent_* ]]; then
    if [[ $rc -ne 0 ]]; then
      fail "$bug" "exit $rc, expected 0 (a silent bug raises nothing)"
    else
      echo "ok   $bug: trains, silently wrong"
    fi
  elif [[ $rc -ne 1 ]]; then
    fail "$bug" "exit $rc, expected 1"
  elif [[ $first != *"$expected"* ]]; then
    fail "$bug" "no in-place error: ${first:-<no error line>}"
  else
    echo "ok   $bug: ${first:0:200}"
  fi
done

exit $((failures > 0))
