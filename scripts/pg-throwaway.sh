#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster for tests.
#
# Usage:
#   scripts/pg-throwaway.sh            start a cluster; prints its connection URL
#                                      (postgres://postgres@127.0.0.1:PORT/perch_test)
#                                      as the only line on stdout, and
#                                      "export PERCH_PG_DIR=..." on stderr
#   scripts/pg-throwaway.sh stop [DIR] stop the cluster in DIR (default: $PERCH_PG_DIR)
#                                      and delete DIR
#   scripts/pg-throwaway.sh restart DIR   restart the server in DIR (pg_ctl restart -m fast)
#   scripts/pg-throwaway.sh halt DIR      stop the server in DIR, keeping DIR (pg_ctl stop -m fast)
#   scripts/pg-throwaway.sh resume DIR    start the halted server in DIR again, on the same port
#                                      (outage tests use these three on a cluster of their own)
#
# Example (stderr may also carry warnings, so pick out the export line):
#   PERCH_TEST_DATABASE_URL="$(scripts/pg-throwaway.sh 2>pg.err)"
#   eval "$(grep '^export PERCH_PG_DIR=' pg.err)"
#   ...
#   scripts/pg-throwaway.sh stop "$PERCH_PG_DIR"
#
# The cluster is tuned for speed, not durability (fsync=off etc.), trusts every
# local connection and listens on 127.0.0.1 only. PostgreSQL refuses to run as
# root, so when run as root the server runs as the "postgres" user.
#
# Environment:
#   PERCH_PG_BIN   directory with initdb/pg_ctl/psql (default: where initdb on
#                  PATH lives, else the newest /usr/lib/postgresql/*/bin)
#   TMPDIR         where the cluster directory is created (default /tmp)

set -euo pipefail

readonly DB_NAME=perch_test
readonly DB_USER=postgres
readonly MARKER=.perch-pg-throwaway
readonly MAX_PORT_ATTEMPTS=20

die() {
  echo "pg-throwaway: error: $*" >&2
  exit 1
}

# Connection settings from the caller's environment must not leak into the
# commands below.
unset PGHOST PGHOSTADDR PGPORT PGDATABASE PGUSER PGPASSWORD PGSERVICE \
  PGSERVICEFILE PGOPTIONS PGDATA PGSSLMODE PGTARGETSESSIONATTRS || true

find_bin_dir() {
  local initdb dir
  if [[ -n "${PERCH_PG_BIN:-}" ]]; then
    [[ -x "$PERCH_PG_BIN/initdb" ]] || die "PERCH_PG_BIN=$PERCH_PG_BIN has no executable initdb"
    echo "$PERCH_PG_BIN"
    return
  fi
  if initdb="$(command -v initdb)"; then
    # Follow symlinks (e.g. /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb)
    # so that pg_ctl, psql, ... come from the same installation.
    dir="$(dirname -- "$(readlink -f -- "$initdb")")"
    if [[ -x "$dir/pg_ctl" && -x "$dir/psql" ]]; then
      echo "$dir"
      return
    fi
  fi
  dir="$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
  if [[ -x "$dir/initdb" ]]; then
    echo "$dir"
    return
  fi
  die "PostgreSQL server binaries not found (no initdb on PATH or in /usr/lib/postgresql/*/bin); install the 'postgresql' package"
}

BIN="$(find_bin_dir)"
for tool in initdb pg_ctl psql; do
  [[ -x "$BIN/$tool" ]] || die "$BIN/$tool not found or not executable"
done

# as_pg OUTFILE CMD...: run CMD as the postgres user (as ourselves when not
# root), appending its stdout and stderr to OUTFILE. cd / so that the tools
# don't complain about an unreadable working directory.
# The redirection is done inside the subshell on purpose: with
# "func ... >file", a trap that fires while func runs (e.g. on SIGTERM) would
# run with its output redirected to that file too.
as_pg() {
  local out="$1"
  shift
  if [[ "$(id -u)" == 0 ]]; then
    (cd / && exec runuser -u "$DB_USER" -- "$@" >>"$out" 2>&1)
  else
    (cd / && exec "$@" >>"$out" 2>&1)
  fi
}

stop_cluster() {
  local dir="$1"
  [[ -n "$dir" ]] || die "usage: $0 stop DIR (or set PERCH_PG_DIR)"
  [[ -d "$dir" ]] || die "$dir does not exist"
  [[ -f "$dir/$MARKER" ]] || die "$dir was not created by $0; refusing to delete it"
  if [[ -f "$dir/data/postmaster.pid" ]]; then
    as_pg /dev/null "$BIN/pg_ctl" stop -D "$dir/data" -m fast -w -t 30 ||
      as_pg /dev/null "$BIN/pg_ctl" stop -D "$dir/data" -m immediate -w -t 30 ||
      echo "pg-throwaway: warning: could not stop the server in $dir/data (see $dir/postgres.log)" >&2
  fi
  rm -rf -- "$dir"
}

if [[ "${1:-}" == stop ]]; then
  stop_cluster "${2:-${PERCH_PG_DIR:-}}"
  exit 0
fi

# control DIR pg_ctl-ARGS...: run pg_ctl on the cluster a previous start created in DIR.
control() {
  local dir="$1"
  shift
  [[ -n "$dir" && -f "$dir/$MARKER" ]] || die "$dir was not created by $0"
  as_pg "$dir/control.log" "$BIN/pg_ctl" "$@" -D "$dir/data" -w -t 60 || {
    tail -n 20 "$dir/control.log" >&2
    die "pg_ctl $1 failed in $dir"
  }
}
case "${1:-}" in
restart)
  control "${2:-}" restart -m fast -l "${2:-}/postgres.log"
  exit 0
  ;;
halt)
  control "${2:-}" stop -m fast
  exit 0
  ;;
resume)
  control "${2:-}" start -l "${2:-}/postgres.log"
  exit 0
  ;;
esac
[[ $# -eq 0 ]] || die "unknown arguments: $* (usage: $0 [stop DIR])"

if [[ "$(id -u)" == 0 ]]; then
  id -u "$DB_USER" >/dev/null 2>&1 || die "running as root but there is no '$DB_USER' user to run PostgreSQL as"
  command -v runuser >/dev/null || die "running as root but runuser is not available"
fi

DIR="$(mktemp -d "${TMPDIR:-/tmp}/perch-pg.XXXXXXXXXX")" || die "mktemp -d failed"
touch "$DIR/$MARKER"
ok=0
interrupted=
cleanup_on_failure() {
  if [[ "$ok" != 1 ]]; then
    if [[ -n "$interrupted" ]]; then
      echo "pg-throwaway: interrupted by SIG$interrupted" >&2
    elif [[ -s "$DIR/setup.log" ]]; then
      echo "pg-throwaway: ---- setup output ----" >&2
      tail -n 40 "$DIR/setup.log" >&2 || true
    fi
    if [[ -z "$interrupted" && -s "$DIR/postgres.log" ]]; then
      echo "pg-throwaway: ---- server log ----" >&2
      tail -n 40 "$DIR/postgres.log" >&2 || true
    fi
    if [[ -f "$DIR/data/postmaster.pid" ]]; then
      as_pg /dev/null "$BIN/pg_ctl" stop -D "$DIR/data" -m immediate -w -t 30 || true
    fi
    rm -rf -- "$DIR"
    echo "pg-throwaway: failed to start a PostgreSQL cluster" >&2
  fi
}
trap cleanup_on_failure EXIT
trap 'interrupted=INT; exit 130' INT
trap 'interrupted=TERM; exit 143' TERM
trap 'interrupted=HUP; exit 129' HUP

if [[ "$(id -u)" == 0 ]]; then
  chown "$DB_USER": "$DIR" "$DIR/$MARKER"
fi
as_pg /dev/null test -w "$DIR" || die "$DIR is not writable by user $DB_USER (is TMPDIR=${TMPDIR:-/tmp} accessible to it?)"

# C collation: byte order, fast and the same everywhere; C.UTF-8 ctype so that
# upper()/lower() etc. work on non-ASCII text.
as_pg "$DIR/setup.log" "$BIN/initdb" -D "$DIR/data" -U "$DB_USER" -A trust --no-sync --no-instructions \
  -E UTF8 --locale=C.UTF-8 --lc-collate=C ||
  die "initdb failed"

cat >>"$DIR/data/postgresql.conf" <<EOF

# ---- pg-throwaway settings ----
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DIR'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
EOF

# Pick a port. Any probe-then-bind scheme is racy against other processes
# (including a concurrent run of this script), so the start itself is retried
# on a new port when the port turns out to be taken.
random_port() {
  # 15000-32767: below Linux's default ephemeral range (32768-60999), so
  # outgoing connections don't compete for it.
  echo $((15000 + (RANDOM * 32768 + RANDOM) % 17768))
}
port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

port=
for ((attempt = 1; attempt <= MAX_PORT_ATTEMPTS; attempt++)); do
  candidate="$(random_port)"
  port_in_use "$candidate" && continue
  : >"$DIR/postgres.log"
  if [[ "$(id -u)" == 0 ]]; then chown "$DB_USER": "$DIR/postgres.log"; fi
  if as_pg "$DIR/setup.log" "$BIN/pg_ctl" start -D "$DIR/data" -l "$DIR/postgres.log" -w -t 60 \
    -o "-p $candidate"; then
    port="$candidate"
    break
  fi
  if grep -q -e 'could not bind' -e 'could not create any TCP/IP sockets' -e 'lock file .* already exists' "$DIR/postgres.log"; then
    echo "pg-throwaway: port $candidate is taken, trying another one" >&2
    continue
  fi
  die "pg_ctl start failed"
done
[[ -n "$port" ]] || die "no free port found after $MAX_PORT_ATTEMPTS attempts"

# Record the port in the config too, so that a plain "pg_ctl start -D DIR/data"
# would come back on the same one.
echo "port = $port" >>"$DIR/data/postgresql.conf"

# pg_ctl -w has already waited for "ready to accept connections"; check over
# TCP (what the tests use) and create the database.
as_pg "$DIR/setup.log" "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U "$DB_USER" -d postgres \
  -c "CREATE DATABASE $DB_NAME" ||
  die "could not connect to the new server on 127.0.0.1:$port or create database $DB_NAME"

ok=1
printf 'export PERCH_PG_DIR=%q\n' "$DIR" >&2
printf '# stop with: %q stop %q\n' "$0" "$DIR" >&2
echo "postgres://$DB_USER@127.0.0.1:$port/$DB_NAME"
