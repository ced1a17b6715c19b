#!/usr/bin/env bash
# The CLI's Debian package, as a user gets it: `cpack -G DEB` in the build tree, then
# `apt-get install ./lockstep_*.deb`, `lockstep collect` from the PATH with two
# lockstep-loadgen runs sending to it, `lockstep compare` on the two logs, then removal.
# Needs root, dpkg and apt-get; exits 77 (ctest: skipped) without them, or when a lockstep
# package or /usr/bin/lockstep is already there (a user's install is never touched).
#   tests/install/deb_install_test.sh BUILD_DIR LOADGEN
set -euo pipefail
BUILD=$(cd "${1:?build dir}" && pwd)
LOADGEN=${2:?lockstep-loadgen}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (installs a .deb)"
for t in dpkg dpkg-deb dpkg-shlibdeps apt-get cpack flock; do
  command -v "$t" >/dev/null || skip "no $t on this machine"
done
exec 9>/tmp/lockstep-deb-test.lock
flock -w 300 9 || skip "another deb test holds /tmp/lockstep-deb-test.lock"
if dpkg-query -W -f='${Status}' lockstep 2>/dev/null | grep -q "ok installed"; then
  skip "a lockstep package is already installed"
fi
[ ! -e /usr/bin/lockstep ] || skip "/usr/bin/lockstep exists (not ours)"

tmp=$(mktemp -d)
installed=0 pid=""
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  [ "$installed" = 0 ] || dpkg -r lockstep >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

(cd "$BUILD" && cpack -G DEB -B "$tmp/pkg") >"$tmp/cpack.log" 2>&1 || { cat "$tmp/cpack.log"; exit 1; }
deb=$(ls "$tmp"/pkg/lockstep_*.deb)
echo "package: $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
for lib in libzmq5 libspdlog; do
  grep -q "$lib" <<<"$depends" || { echo "FAIL: Depends lacks $lib"; exit 1; }
done
# The listing is read whole first: `dpkg-deb -c | grep -q` under pipefail fails whenever grep
# stops early and dpkg-deb's tar dies of SIGPIPE (it did on CI).
contents=$(dpkg-deb -c "$deb")
grep -q './usr/share/man/man1/lockstep.1.gz' <<<"$contents" || { echo "FAIL: no man page"; exit 1; }
grep -q 'examples/lockstep-collect.service' <<<"$contents" || { echo "FAIL: no systemd unit"; exit 1; }

DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$deb" >"$tmp/apt.log" 2>&1 ||
  { cat "$tmp/apt.log"; exit 1; }
installed=1
[ "$(command -v lockstep)" = /usr/bin/lockstep ] || { echo "FAIL: lockstep is not /usr/bin/lockstep"; exit 1; }
lockstep --version
! systemctl is-enabled lockstep-collect >/dev/null 2>&1 || { echo "FAIL: the unit got enabled"; exit 1; }

cd "$tmp"
lockstep collect --listen 'tcp://127.0.0.1:*' --data-dir "$tmp/data" --ready-file "$tmp/ready.json" \
  --status-interval-s 0 --log-level warn &
pid=$!
for _ in $(seq 200); do [ -s "$tmp/ready.json" ] && break; sleep 0.05; done
[ -s "$tmp/ready.json" ] || { echo "FAIL: collector wrote no ready file"; exit 1; }
ep=$(sed -n 's/.*"listen": *\["\([^"]*\)".*/\1/p' "$tmp/ready.json")
"$LOADGEN" --endpoint "$ep" --run deb-base --role baseline --experiment deb --steps 12 --tensors 4 >/dev/null
"$LOADGEN" --endpoint "$ep" --run deb-cand --role candidate --experiment deb --steps 12 --tensors 4 \
  --drift-after 6 >/dev/null
for run in deb-base deb-cand; do
  for _ in $(seq 200); do
    grep -q '"Goodbye"' <<<"$(lockstep inspect "$tmp/data/$run.lslog" 2>/dev/null)" && break; sleep 0.05
  done
done
kill -TERM "$pid"; wait "$pid"; pid=""
rc=0
lockstep compare "$tmp/data/deb-base.lslog" "$tmp/data/deb-cand.lslog" >"$tmp/compare.txt" 2>&1 || rc=$?
cat "$tmp/compare.txt"
[ "$rc" -le 1 ] || { echo "FAIL: lockstep compare exited $rc"; exit 1; }
grep -q "steps compared: 12" "$tmp/compare.txt" || { echo "FAIL: compare did not compare 12 steps"; exit 1; }

dpkg -r lockstep >/dev/null; installed=0
[ ! -e /usr/bin/lockstep ] || { echo "FAIL: /usr/bin/lockstep left after removal"; exit 1; }
echo "PASS: built, installed, ran collect + compare from the PATH, removed"
