#!/usr/bin/env bash
# `torchrr info` / `torchrr dump` on the golden files: exit codes, warnings and some output.
# Usage: cli_test.sh TORCHRR_BINARY GOLDEN_DIR
set -u
bin=$1
golden=$2
failures=0

# expect RC ARGS...: runs torchrr ARGS, checks the exit code; output in $out, stderr in $err.
expect() {
  local want=$1
  shift
  out=$("$bin" "$@" 2>/tmp/torchrr_cli_test_err.$$)
  local rc=$?
  err=$(cat /tmp/torchrr_cli_test_err.$$)
  if [ "$rc" != "$want" ]; then
    echo "FAIL: torchrr $*: exit $rc, want $want"
    echo "$err"
    failures=$((failures + 1))
  fi
}

# contains HAYSTACK NEEDLE WHAT
contains() {
  if ! grep -qF -- "$2" <<<"$1"; then
    echo "FAIL: $3: no \"$2\" in:"
    echo "$1" | head -20
    failures=$((failures + 1))
  fi
}

expect 0 --version
contains "$out" "torchrr " "--version"
expect 0 --help
contains "$out" "6  trace written by a newer torchrr format" "--help footer"
expect 2
expect 2 info
expect 2 frobnicate

expect 0 info "$golden/v1_0.trr"
contains "$out" "format:           1.0 (oldest reader 1.0)" "info"
contains "$out" "torch 2.4.1+cu121" "info"
contains "$out" "closed cleanly:   yes" "info"
contains "$out" "host:             golden-host, pid 4242, rank 3 of 8" "info"
contains "$out" "bytes per op:" "info"
expect 0 dump "$golden/v1_0.trr"
contains "$out" 'op op=1030 name="aten::add_1000"' "dump"
[ "$(wc -l <<<"$out")" = 24 ] || { echo "FAIL: dump: want 24 lines"; failures=$((failures + 1)); }
expect 0 dump --json "$golden/v1_0.trr"
contains "$(head -1 <<<"$out")" '"kind":"trace"' "dump --json header"
contains "$out" '"kind":"fingerprint"' "dump --json"
[ "$(wc -l <<<"$out")" = 25 ] || { echo "FAIL: dump --json: want 25 lines"; failures=$((failures + 1)); }

expect 4 info "$golden/errors/truncated.trr"
contains "$err" "torchrr: warning: $golden/errors/truncated.trr: truncated after chunk 2" "truncated"
contains "$out" "closed cleanly:   no" "truncated"
expect 4 dump "$golden/errors/truncated.trr"
contains "$out" "string id=1" "truncated dump still prints the data"
expect 5 info "$golden/errors/corrupt.trr"
contains "$err" "checksum mismatch (corrupt)" "corrupt"
expect 5 dump --json "$golden/errors/corrupt.trr"
expect 6 info "$golden/errors/too_new.trr"
contains "$err" "written by torchrr format 2.0; this torchrr reads up to 1." "too new"
expect 3 info "$golden/errors/not_a_trace.trr"
contains "$err" "not a torchrr trace" "not a trace"
expect 3 dump "$golden/does-not-exist.trr"
contains "$err" "No such file or directory" "missing file"

rm -f /tmp/torchrr_cli_test_err.$$
if [ "$failures" != 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "cli_test: all passed"
