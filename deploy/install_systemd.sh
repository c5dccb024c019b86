#!/usr/bin/env bash
# Installs odbd for systemd (docs/deploy.md, "systemd"): the daemon, its config, its
# environment file, the template unit odbd@.service and the account it runs as.
#
#   sudo deploy/install_systemd.sh                   # into / (PREFIX=/usr/local)
#   DESTDIR=/tmp/stage deploy/install_systemd.sh     # into a tree: nothing outside it is touched
#
# Variables (all optional):
#   DESTDIR   a staging root (packaging, tests); default: the real root
#   PREFIX    where the daemon goes: $PREFIX/bin/odbd (default /usr/local)
#   ODBD      the odbd to install; default the one `odbctl find-odbd` names when odbctl is on
#             PATH (a pip-installed package's own), else this checkout's .build/src/daemon/odbd
#   ODB_USER  the account odbd runs as, created as a system user (default odb); the trainers
#             run as it or in its group (the sockets and arenas are mode 0770 under /run/odb)
#
# Files written (existing config and environment files are kept: they are the admin's):
#   $PREFIX/lib/odb/bin/odbd (+ $PREFIX/lib/odb/.libs/ when the package's odbd brings its
#   libraries), $PREFIX/bin/odbd -> ../lib/odb/bin/odbd, /etc/odb/odbd.yaml (deploy/odbd.yaml:
#   one node, FileStore), /etc/odb/odbd.env (one rank), /etc/systemd/system/odbd@.service,
#   /etc/sysusers.d/odb.conf (the account, made by systemd-sysusers, or useradd without it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr/local}
ODB_USER=${ODB_USER:-odb}
if [ -z "${ODBD:-}" ]; then
  if command -v odbctl >/dev/null 2>&1; then ODBD=$(odbctl find-odbd); else ODBD=$here/../.build/src/daemon/odbd; fi
fi
[ -x "$ODBD" ] || { echo "install_systemd.sh: ODBD=$ODBD is not an executable (./scripts/build.sh, or pip install the wheel)" >&2; exit 1; }
ODBD=$(readlink -f "$ODBD")
"$ODBD" --help >/dev/null || { echo "install_systemd.sh: $ODBD does not run" >&2; exit 1; }

lib=$DESTDIR$PREFIX/lib/odb
install -d "$lib/bin" "$DESTDIR$PREFIX/bin" "$DESTDIR/etc/odb" "$DESTDIR/etc/systemd/system" "$DESTDIR/etc/sysusers.d"
install -m 0755 "$ODBD" "$lib/bin/odbd"
# The package's odbd finds its libraries through DT_RPATH $ORIGIN/../.libs: they come along.
libs=$(dirname "$ODBD")/../.libs
if [ -d "$libs" ]; then
  rm -rf "$lib/.libs" && cp -a "$libs" "$lib/.libs"
fi
ln -sfn ../lib/odb/bin/odbd "$DESTDIR$PREFIX/bin/odbd"

if [ ! -e "$DESTDIR/etc/odb/odbd.yaml" ]; then
  install -m 0644 "$here/odbd.yaml" "$DESTDIR/etc/odb/odbd.yaml"
fi
if [ ! -e "$DESTDIR/etc/odb/odbd.env" ]; then
  install -m 0644 /dev/stdin "$DESTDIR/etc/odb/odbd.env" <<'EOF'
# Read by odbd@.service (deploy/install_systemd.sh wrote it). One node, one rank:
# `systemctl start odbd@0`. The global rank is NODE_RANK * LOCAL_WORLD_SIZE + the
# instance (the local rank); ODB_JOB_ID names the job (a fresh one per run with
# alignment.store: redis). Multi-node: WORLD_SIZE and NODE_RANK of this host,
# ODB_GLOO_HOSTNAME=<this host's address its peers reach>, and in odbd.yaml
# alignment.store: redis with alignment.redis_host (docs/deploy.md).
ODB_JOB_ID=odb
WORLD_SIZE=1
NODE_RANK=0
LOCAL_WORLD_SIZE=1
EOF
fi
sed -e "s#/usr/local/bin/odbd#$PREFIX/bin/odbd#g" -e "s#^User=odb\$#User=$ODB_USER#" -e "s#^Group=odb\$#Group=$ODB_USER#" \
  "$here/odbd@.service" >"$DESTDIR/etc/systemd/system/odbd@.service"
chmod 0644 "$DESTDIR/etc/systemd/system/odbd@.service"
printf 'u %s - "odb collation daemon" /run/odb /usr/sbin/nologin\n' "$ODB_USER" >"$DESTDIR/etc/sysusers.d/odb.conf"

# The account: systemd-sysusers creates it (in $DESTDIR/etc/passwd with a DESTDIR).
if command -v systemd-sysusers >/dev/null 2>&1; then
  systemd-sysusers ${DESTDIR:+--root="$DESTDIR"} "$DESTDIR/etc/sysusers.d/odb.conf"
elif [ -z "$DESTDIR" ] && ! id -u "$ODB_USER" >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /run/odb --shell /usr/sbin/nologin "$ODB_USER"
fi
if [ -z "$DESTDIR" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "installed odbd for systemd under ${DESTDIR:-/} (prefix $PREFIX, user $ODB_USER): systemctl enable --now odbd@0"
