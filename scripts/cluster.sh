#!/usr/bin/env bash
# Local "cluster" for `ray job submit` + an MLflow tracking server, on this machine only.
#
#   scripts/cluster.sh up       start a Ray head and an MLflow server, wait until both are healthy
#   scripts/cluster.sh status   show what runs, with pids and health (exit 0 healthy, 1 unhealthy, 3 not running)
#   scripts/cluster.sh down     stop exactly the processes `up` started (never `ray stop`)
#   scripts/cluster.sh rotate-mlflow-password
#                               new random MLflow admin password (MLflow's update-password API), written
#                               to $CLUSTER_DIR/mlflow-password; restart (down, up) so Ray's jobs get it
#
# Everything listens on 127.0.0.1 only (checked by tests/test_cluster_job.py with `ss`):
#   RAY_PORT=6380          Ray GCS (token auth).
#   DASH_PORT=8266         Ray dashboard + job submission API (token auth).
#   MLFLOW_PORT=5001       MLflow tracking server + registry + artifact proxy (basic auth; /health is open).
#   RAY_CLIENT_PORT=10011  Ray client server (Ray's default 10001 would collide with other heads).
#   RAY_DASH_AGENT_PORT=52375, RAY_AUTOSCALER_METRIC_PORT=44237, RAY_DASHBOARD_METRIC_PORT=44247,
#   RAY_MIN_WORKER_PORT..RAY_MAX_WORKER_PORT=20002..29999: Ray's other fixed ports, moved off the
#   defaults so they don't collide with a developer's own Ray. Other Ray ports (raylet, object
#   manager, agents, metrics export) are picked free.
# How: `ray start --node-ip-address=127.0.0.1` alone is not enough on Linux: Ray replaces a loopback
#   node IP with the machine's address (services.resolve_ip_for_localhost). With
#   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's single-machine mode, the default on macOS/Windows) the
#   node IP stays 127.0.0.1 and Ray 2.60 binds its gRPC servers, agents, client server and metrics
#   servers to the node IP. The variable is inherited by every Ray process, job drivers included;
#   a client that talks to the GCS directly (`ray status`, `ray.init(address=...)`) needs it too.
#
# Secrets (none is ever on a command line; files are 0600, $CLUSTER_DIR is 0700):
#   ~/.ray/auth_token (or $RAY_AUTH_TOKEN_PATH)  Ray token: created with umask 077, chmod 600 if it existed.
#   $CLUSTER_DIR/mlflow-password      MLflow admin password (user "admin"), random, created once.
#   $CLUSTER_DIR/mlflow-flask-secret  the basic-auth app's CSRF key, random, created once.
#   $CLUSTER_DIR/mlflow-auth.ini, mlflow-auth.db  MLflow basic-auth config and user store.
#   `mlflow server --app-name basic-auth` gets the admin password as MLFLOW_AUTH_ADMIN_PASSWORD in its
#   environment; `ray start` gets MLFLOW_TRACKING_USERNAME/PASSWORD in its environment, so job
#   drivers on this head inherit them without a runtime env (whose env_vars Ray logs).
# Other knobs: VENV=.venv, RAY_NUM_CPUS=2, UP_TIMEOUT=120 (s), MLFLOW_WORKERS=1,
#   CLUSTER_DIR=<repo>/.cluster, RAY_TEMP_DIR=$CLUSTER_DIR/ray.
#
# How only our processes get stopped: `ray start` and `mlflow server` are each launched under
# `setsid`, so each gets its own session id (= the pid recorded in .cluster/*.sid). Every Ray
# daemon and worker stays in that session (workers get their own process group, not their own
# session). `down` stops: the members of our two sessions, all their descendants (job drivers
# call setsid themselves), and any process with a flag (--temp-dir=..., --session-dir=...) that
# points into our private Ray temp dir.
# Ray is stopped in `ray stop`'s order (raylet, then the rest, then gcs_server): SIGTERM, wait,
# SIGKILL what is left. Linux does not hand out a pid that is still in use as a session id, so
# a recorded session id cannot match someone else's processes while any of ours is alive; once
# all of ours are gone the number could be recycled, so a session only counts as ours if one
# member matches a recorded (pid, start time) pair in .cluster/*.pids or names our directories.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="${VENV:-.venv}"
RAY_PORT="${RAY_PORT:-6380}"
DASH_PORT="${DASH_PORT:-8266}"
MLFLOW_PORT="${MLFLOW_PORT:-5001}"
RAY_NUM_CPUS="${RAY_NUM_CPUS:-2}"
RAY_CLIENT_PORT="${RAY_CLIENT_PORT:-10011}"
RAY_DASH_AGENT_PORT="${RAY_DASH_AGENT_PORT:-52375}"
RAY_AUTOSCALER_METRIC_PORT="${RAY_AUTOSCALER_METRIC_PORT:-44237}"
RAY_DASHBOARD_METRIC_PORT="${RAY_DASHBOARD_METRIC_PORT:-44247}"
RAY_MIN_WORKER_PORT="${RAY_MIN_WORKER_PORT:-20002}"
RAY_MAX_WORKER_PORT="${RAY_MAX_WORKER_PORT:-29999}"
MLFLOW_WORKERS="${MLFLOW_WORKERS:-1}"
UP_TIMEOUT="${UP_TIMEOUT:-120}"
CLUSTER_DIR="${CLUSTER_DIR:-$ROOT/.cluster}"
RAY_TEMP_DIR="${RAY_TEMP_DIR:-$CLUSTER_DIR/ray}"

case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
BIN="$VENV/bin"
RAY_SID_FILE="$CLUSTER_DIR/ray.sid"
RAY_SNAP="$CLUSTER_DIR/ray.pids"
MLFLOW_SID_FILE="$CLUSTER_DIR/mlflow.sid"
MLFLOW_SNAP="$CLUSTER_DIR/mlflow.pids"
RAY_LOG="$CLUSTER_DIR/ray-start.log"
MLFLOW_LOG="$CLUSTER_DIR/mlflow.log"
MLFLOW_USER=admin
MLFLOW_PASSWORD_FILE="$CLUSTER_DIR/mlflow-password"
MLFLOW_SECRET_FILE="$CLUSTER_DIR/mlflow-flask-secret"
MLFLOW_AUTH_INI="$CLUSTER_DIR/mlflow-auth.ini"
MLFLOW_AUTH_DB="$CLUSTER_DIR/mlflow-auth.db"
RAY_TOKEN_FILE="${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
# Ray's single-machine mode: the node IP stays 127.0.0.1, so every Ray server binds to loopback only.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0

die() { echo "cluster.sh: error: $*" >&2; exit 1; }
say() { echo "cluster.sh: $*"; }

# ---------------------------------------------------------------- process bookkeeping
session_members() {  # pids whose session id is $1
    ps -eo pid=,sid= | awk -v s="$1" '$2 == s { print $1 }'
}

descendants() {  # all descendants of the pids given as arguments (not including them)
    ps -eo pid=,ppid= | awk -v roots="$*" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) seen[r[i]] = 1 }
        { parent[$1] = $2; pids[NR] = $1 }
        END {
            changed = 1
            while (changed) {
                changed = 0
                for (i in pids) { p = pids[i]
                    if (!(p in seen) && (parent[p] in seen)) { seen[p] = 1; out[p] = 1; changed = 1 } }
            }
            for (p in out) print p
        }'
}

tempdir_procs() {  # our uid's processes with a flag pointing into our private Ray temp dir
    # (--temp-dir=, --session-dir=, --log_dir=, ... as Ray's daemons and workers have; a bare
    # path, as in `tail -f .../raylet.out`, does not match)
    local me=$$ pid args
    for d in /proc/[0-9]*; do
        pid="${d#/proc/}"
        [ "$pid" = "$me" ] && continue
        [ -O "$d" ] || continue
        args="$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)" || continue
        case "$args " in *"=$RAY_TEMP_DIR/"* | *"=$RAY_TEMP_DIR "*) echo "$pid" ;; esac
    done
}

starttime() {  # kernel start time of pid $1 (field 22 of /proc/pid/stat; comm may hold spaces)
    local st; st="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
    st="${st##*) }"; set -- $st; echo "${20:-}"
}

snapshot() {  # record "pid starttime" of the members of session $1 into file $2
    local p; for p in $(session_members "$1"); do echo "$p $(starttime "$p")"; done >"$2"
}

mentions_us() {  # does pid $1's command line mention our cluster dir or Ray temp dir?
    local args; args="$(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null)" || return 1
    case "$args" in *"$CLUSTER_DIR/"* | *"$RAY_TEMP_DIR/"*) return 0 ;; esac
    return 1
}

alive_sid() {  # prints the session id recorded in file $1 if that session is alive and ours
    # Ours = one member is in the snapshot file $2 with the same start time (pid + start time
    # is unique), or mentions our directories. Guards against a recycled session id.
    local f="$1" snap="$2" sid p
    [ -f "$f" ] || return 1
    sid="$(cat "$f")"; [ -n "$sid" ] || return 1
    for p in $(session_members "$sid"); do
        if { [ -f "$snap" ] && grep -qx "$p $(starttime "$p")" "$snap"; } || mentions_us "$p"; then
            echo "$sid"; return 0
        fi
    done
    return 1
}

our_procs() {  # every pid of the instance recorded in $1/$2 (+ Ray temp-dir matches if $3=yes)
    local with_tempdir="${3:-no}" sid base=""
    if sid="$(alive_sid "$1" "$2")"; then base="$(session_members "$sid")"; fi
    [ "$with_tempdir" = yes ] && base="$base $(tempdir_procs)"
    base="$(echo $base | tr ' ' '\n' | sort -un | tr '\n' ' ')"
    [ -z "${base// /}" ] && return 0
    { echo $base | tr ' ' '\n'; descendants $base; } | grep -v "^$$\$" | sort -un
}

comm_of() { ps -o comm= -p "$1" 2>/dev/null || true; }

key_pids() {  # "gcs_server=PID raylet=PID" for session $1
    ps -eo sid=,pid=,comm= | awk -v s="$1" '$1 == s && ($3 == "gcs_server" || $3 == "raylet") { printf "%s%s=%s", sep, $3, $2; sep = " " }'
}

term_then_kill() {  # SIGTERM the given pids, wait up to $1 s, SIGKILL the survivors
    local grace="$1"; shift
    local pids="$*" alive p i
    [ -z "${pids// /}" ] && return 0
    kill -TERM $pids 2>/dev/null || true
    for ((i = 0; i < grace * 5; i++)); do
        alive=""
        for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
        [ -z "$alive" ] && return 0
        sleep 0.2
    done
    say "SIGKILL after ${grace}s:$alive"
    kill -KILL $alive 2>/dev/null || true
}

# ---------------------------------------------------------------- health checks
port_busy() { "$BIN/python" - "$1" <<'EOF'
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", int(sys.argv[1])))
except OSError:
    sys.exit(0)   # busy
sys.exit(1)       # free
EOF
}

ray_healthy() {
    RAY_AUTH_MODE=token timeout 20 "$BIN/ray" status --address "127.0.0.1:$RAY_PORT" >/dev/null 2>&1 &&
        curl -fsS -m 3 "http://127.0.0.1:$DASH_PORT/api/gcs_healthz" >/dev/null 2>&1
}
mlflow_healthy() { curl -fsS -m 3 "http://127.0.0.1:$MLFLOW_PORT/health" >/dev/null 2>&1; }

MLFLOW_PROBE="/api/2.0/mlflow/experiments/search?max_results=1"
mlflow_status_anonymous() {  # HTTP status of a request without credentials (401 when auth is on)
    curl -sS -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$MLFLOW_PORT$MLFLOW_PROBE" 2>/dev/null || true
}
mlflow_status_admin() {  # HTTP status with the admin credentials; curl reads them from stdin (-K -), not argv
    [ -s "$MLFLOW_PASSWORD_FILE" ] || { echo "none (no $MLFLOW_PASSWORD_FILE)"; return 0; }
    printf 'user = "%s:%s"\n' "$MLFLOW_USER" "$(cat "$MLFLOW_PASSWORD_FILE")" |
        curl -sS -m 5 -K - -o /dev/null -w '%{http_code}' "http://127.0.0.1:$MLFLOW_PORT$MLFLOW_PROBE" 2>/dev/null || true
}

wait_healthy() {  # name check_fn deadline(epoch s) sid_file snapshot_file
    local name="$1" fn="$2" deadline="$3"
    until "$fn"; do
        [ "$(date +%s)" -ge "$deadline" ] && return 1
        alive_sid "$4" "$5" >/dev/null || { say "$name exited during startup"; return 1; }
        sleep 1
    done
    say "$name healthy after $(( $(date +%s) - T_START ))s"
}

print_env() {
    cat <<EOF

Ray GCS        127.0.0.1:$RAY_PORT  (every Ray port on 127.0.0.1 only; token auth: $RAY_TOKEN_FILE)
Ray dashboard  http://127.0.0.1:$DASH_PORT  (also the job submission API)
MLflow         http://127.0.0.1:$MLFLOW_PORT  (basic auth, user $MLFLOW_USER; store: $CLUSTER_DIR/mlflow.db, artifacts: $CLUSTER_DIR/mlartifacts)
Jobs submitted here already see MLFLOW_TRACKING_URI=http://127.0.0.1:$MLFLOW_PORT and the MLflow credentials.

export RAY_ADDRESS=http://127.0.0.1:$DASH_PORT
export MLFLOW_TRACKING_URI=http://127.0.0.1:$MLFLOW_PORT
export RAY_AUTH_MODE=token
export MLFLOW_TRACKING_USERNAME=$MLFLOW_USER
export MLFLOW_TRACKING_PASSWORD="\$(cat $MLFLOW_PASSWORD_FILE)"
# only for clients that talk to the GCS directly (ray status, ray.init(address=...)):
# export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
EOF
}

# ---------------------------------------------------------------- secrets
new_secret() {  # a random secret into file $1 (mode 0600), unless it already has one; never printed
    if [ -s "$1" ]; then chmod 600 "$1"; return 0; fi
    ( umask 077
      "$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$1.tmp" && mv -f "$1.tmp" "$1" ) ||
        die "could not write $1"
}

ensure_ray_token() {
    # `ray start` turns token auth on only when a token already exists (unlike ray.init, it never creates one),
    # so on a fresh machine it would start an open job API: make sure there is a token (created with umask
    # 077, so the file is 0600 and a new ~/.ray is 0700), and ask for token mode.
    ( umask 077; "$BIN/ray" get-auth-token --generate >/dev/null 2>&1 ) ||
        die "could not create a Ray auth token ($RAY_TOKEN_FILE)"
    if [ -n "${RAY_AUTH_TOKEN:-}" ] && [ ! -f "$RAY_TOKEN_FILE" ]; then return 0; fi   # token from the environment
    [ -f "$RAY_TOKEN_FILE" ] || die "no Ray token file at $RAY_TOKEN_FILE after ray get-auth-token --generate"
    chmod 600 "$RAY_TOKEN_FILE"   # a token made earlier (ray.init, an older cluster.sh) may be world-readable
}

ensure_mlflow_auth() {
    if [ -f "$MLFLOW_AUTH_DB" ] && [ ! -s "$MLFLOW_PASSWORD_FILE" ]; then
        die "$MLFLOW_AUTH_DB has an admin user but $MLFLOW_PASSWORD_FILE is gone; restore the file, or delete $MLFLOW_AUTH_DB to create a new admin (tracking data in mlflow.db is kept)"
    fi
    new_secret "$MLFLOW_PASSWORD_FILE"
    new_secret "$MLFLOW_SECRET_FILE"
    # NO_PERMISSIONS: a user other than the admin sees nothing until granted (the admin can do everything).
    # auth_cache_ttl_seconds: a checked password is remembered for 60 s instead of being hashed again (scrypt)
    # on every request: that costs 0.3-1 s of CPU per request on 2 cores, and a 2-step job makes ~85. A password
    # change through the API clears the entry at once (one uvicorn worker here, MLFLOW_WORKERS=1).
    ( umask 077; cat >"$MLFLOW_AUTH_INI" <<EOF
[mlflow]
default_permission = NO_PERMISSIONS
database_uri = sqlite:///$MLFLOW_AUTH_DB
admin_username = $MLFLOW_USER
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = 60
EOF
    )
}

# ---------------------------------------------------------------- start / stop pieces
start_ray() {
    # Unix socket paths are limited to 107 bytes; Ray puts its sockets under the session dir.
    local probe="$RAY_TEMP_DIR/session_2000-01-01_00-00-00_000000_4194304/sockets/plasma_store"
    [ "${#probe}" -le 107 ] || die "RAY_TEMP_DIR=$RAY_TEMP_DIR is too long for Ray's unix sockets; set RAY_TEMP_DIR to a shorter path inside a private directory (e.g. RAY_TEMP_DIR=$(mktemp -d)/ray: Ray makes its temp dir world-writable, the parent keeps others out)"
    ( umask 077; mkdir -p "$RAY_TEMP_DIR" )   # Ray chmods it 0777 itself; $CLUSTER_DIR (0700) keeps others out
    ensure_ray_token
    set +m
    # setsid: new session whose id is the pid we record; Ray's daemons inherit it, and its environment:
    # job drivers on this head get the MLflow URI and credentials from here (no runtime env needed).
    RAY_AUTH_MODE=token \
    MLFLOW_TRACKING_URI="http://127.0.0.1:$MLFLOW_PORT" \
    MLFLOW_TRACKING_USERNAME="$MLFLOW_USER" \
    MLFLOW_TRACKING_PASSWORD="$(cat "$MLFLOW_PASSWORD_FILE")" \
    AUTOSCALER_METRIC_PORT="$RAY_AUTOSCALER_METRIC_PORT" \
    DASHBOARD_METRIC_PORT="$RAY_DASHBOARD_METRIC_PORT" \
    PATH="$BIN:$PATH" \
        setsid "$BIN/ray" start --head \
            --node-ip-address=127.0.0.1 --port="$RAY_PORT" --num-cpus="$RAY_NUM_CPUS" \
            --dashboard-host=127.0.0.1 --dashboard-port="$DASH_PORT" --include-dashboard=true \
            --ray-client-server-port="$RAY_CLIENT_PORT" \
            --dashboard-agent-listen-port="$RAY_DASH_AGENT_PORT" \
            --min-worker-port="$RAY_MIN_WORKER_PORT" --max-worker-port="$RAY_MAX_WORKER_PORT" \
            --temp-dir="$RAY_TEMP_DIR" --disable-usage-stats \
            >"$RAY_LOG" 2>&1 </dev/null &
    local sid=$!
    echo "$sid" >"$RAY_SID_FILE"
    if ! wait "$sid"; then
        tail -n 20 "$RAY_LOG" >&2
        stop_ray
        die "ray start failed (log: $RAY_LOG)"
    fi
    # Record the pids (with start times); `down` re-discovers too, since workers come and go.
    snapshot "$sid" "$RAY_SNAP"
    say "ray head started in $(( $(date +%s) - T_START ))s (session $sid, $(wc -l <"$RAY_SNAP") processes: $(key_pids "$sid"))"
}

start_mlflow() {
    mkdir -p "$CLUSTER_DIR/mlartifacts"
    set +m
    # basic-auth app: anonymous requests get 401 (/health stays open); secrets only in the environment
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}" \
    MLFLOW_AUTH_CONFIG_PATH="$MLFLOW_AUTH_INI" \
    MLFLOW_AUTH_ADMIN_USERNAME="$MLFLOW_USER" \
    MLFLOW_AUTH_ADMIN_PASSWORD="$(cat "$MLFLOW_PASSWORD_FILE")" \
    MLFLOW_FLASK_SERVER_SECRET_KEY="$(cat "$MLFLOW_SECRET_FILE")" \
        setsid nohup "$BIN/mlflow" server --app-name basic-auth --host 127.0.0.1 --port "$MLFLOW_PORT" \
            --workers "$MLFLOW_WORKERS" \
            --backend-store-uri "sqlite:///$CLUSTER_DIR/mlflow.db" \
            --artifacts-destination "$CLUSTER_DIR/mlartifacts" \
            >"$MLFLOW_LOG" 2>&1 </dev/null &
    echo $! >"$MLFLOW_SID_FILE"
    snapshot "$(cat "$MLFLOW_SID_FILE")" "$MLFLOW_SNAP"
    say "mlflow server started (session $(cat "$MLFLOW_SID_FILE"), log $MLFLOW_LOG)"
}

stop_ray() {
    local all raylets gcs rest
    all="$(our_procs "$RAY_SID_FILE" "$RAY_SNAP" yes)"
    if [ -z "$all" ]; then rm -f "$RAY_SID_FILE" "$RAY_SNAP"; return 0; fi
    raylets=""; gcs=""; rest=""
    for p in $all; do
        case "$(comm_of "$p")" in
            raylet) raylets="$raylets $p" ;;
            gcs_server) gcs="$gcs $p" ;;
            "") ;;
            *) rest="$rest $p" ;;
        esac
    done
    say "stopping ray: $(echo $all | wc -w) processes (raylet:${raylets:- -} gcs_server:${gcs:- -})"
    term_then_kill 10 $raylets
    # re-scan: raylet's exit may have spawned nothing new, but workers may have exited already
    rest="$(for p in $rest $(our_procs "$RAY_SID_FILE" "$RAY_SNAP" yes); do
        c="$(comm_of "$p")"; [ -n "$c" ] && [ "$c" != gcs_server ] && echo "$p"; done | sort -un)"
    term_then_kill 10 $rest
    term_then_kill 10 $gcs
    rm -f "$RAY_SID_FILE" "$RAY_SNAP"
}

stop_mlflow() {
    local all
    all="$(our_procs "$MLFLOW_SID_FILE" "$MLFLOW_SNAP")"
    if [ -n "$all" ]; then
        say "stopping mlflow: $(echo $all | wc -w) processes"
        term_then_kill 10 $all
    fi
    rm -f "$MLFLOW_SID_FILE" "$MLFLOW_SNAP"
}

# ---------------------------------------------------------------- commands
cmd_up() {
    [ -x "$BIN/ray" ] && [ -x "$BIN/mlflow" ] || die "no ray/mlflow in $BIN; set VENV or run 'make install'"
    command -v setsid >/dev/null || die "setsid not found (util-linux)"
    command -v curl >/dev/null || die "curl not found"
    "$BIN/python" -c "import flask_wtf" 2>/dev/null ||
        die "MLflow's basic-auth app needs the auth extra: $BIN/pip install 'mlflow[auth]>=3.17,<4' (or make install)"
    ( umask 077; mkdir -p "$CLUSTER_DIR" ) && chmod 700 "$CLUSTER_DIR"
    T_START=$(date +%s)
    local ray_running=no mlflow_running=no
    alive_sid "$RAY_SID_FILE" "$RAY_SNAP" >/dev/null && ray_running=yes
    alive_sid "$MLFLOW_SID_FILE" "$MLFLOW_SNAP" >/dev/null && mlflow_running=yes
    if [ "$ray_running" = yes ] && [ "$mlflow_running" = yes ]; then
        say "already up"
        print_env
        return 0
    fi
    # Fail before starting anything if a port we need is taken by someone else.
    if [ "$ray_running" = no ]; then
        stop_ray   # clears stale records / leftovers of a half-failed start of ours
        for v in RAY_PORT DASH_PORT RAY_CLIENT_PORT RAY_DASH_AGENT_PORT; do
            port_busy "${!v}" && die "port ${!v} ($v) is already in use by another process; pick another: $v=<port> $0 up"
        done
    fi
    if [ "$mlflow_running" = no ]; then
        stop_mlflow
        port_busy "$MLFLOW_PORT" && die "port $MLFLOW_PORT (MLFLOW_PORT) is already in use by another process; pick another: MLFLOW_PORT=<port> $0 up"
    fi
    local deadline=$(( T_START + UP_TIMEOUT ))
    ensure_mlflow_auth
    # mlflow first: it starts in the background and warms up while `ray start` runs.
    [ "$mlflow_running" = no ] && start_mlflow
    [ "$ray_running" = no ] && start_ray
    if ! wait_healthy ray ray_healthy "$deadline" "$RAY_SID_FILE" "$RAY_SNAP"; then
        tail -n 20 "$RAY_LOG" >&2
        stop_ray; stop_mlflow
        die "ray did not become healthy (timeout ${UP_TIMEOUT}s); stopped what was started (logs in $CLUSTER_DIR)"
    fi
    if ! wait_healthy mlflow mlflow_healthy "$deadline" "$MLFLOW_SID_FILE" "$MLFLOW_SNAP"; then
        tail -n 20 "$MLFLOW_LOG" >&2
        stop_ray; stop_mlflow
        die "mlflow did not become healthy (timeout ${UP_TIMEOUT}s); stopped what was started (log: $MLFLOW_LOG)"
    fi
    local anon admin
    anon="$(mlflow_status_anonymous)"; admin="$(mlflow_status_admin)"
    if [ "$anon" != 401 ] || [ "$admin" != 200 ]; then
        stop_ray; stop_mlflow
        die "mlflow auth check failed: anonymous request -> HTTP $anon (want 401), admin -> HTTP $admin (want 200); if the admin password in $MLFLOW_PASSWORD_FILE was changed by hand, put the old one back or delete $MLFLOW_AUTH_DB. Stopped what was started (log: $MLFLOW_LOG)"
    fi
    say "mlflow auth: anonymous -> $anon, admin -> $admin"
    snapshot "$(cat "$RAY_SID_FILE")" "$RAY_SNAP"          # now with dashboard children, workers
    snapshot "$(cat "$MLFLOW_SID_FILE")" "$MLFLOW_SNAP"    # now with uvicorn
    say "up in $(( $(date +%s) - T_START ))s"
    print_env
}

cmd_down() {
    local t0; t0=$(date +%s)
    if ! alive_sid "$RAY_SID_FILE" "$RAY_SNAP" >/dev/null && ! alive_sid "$MLFLOW_SID_FILE" "$MLFLOW_SNAP" >/dev/null &&
        [ -z "$(tempdir_procs)" ]; then
        rm -f "$RAY_SID_FILE" "$RAY_SNAP" "$MLFLOW_SID_FILE" "$MLFLOW_SNAP"
        say "not up"
        return 0
    fi
    stop_ray
    stop_mlflow
    local left
    left="$(tempdir_procs)"
    [ -z "$left" ] || die "processes still running after down: $left"
    say "down in $(( $(date +%s) - t0 ))s"
}

cmd_status() {
    local rc=0 sid
    if sid="$(alive_sid "$RAY_SID_FILE" "$RAY_SNAP")"; then
        echo "ray:    running (session $sid, $(session_members "$sid" | wc -l) processes;" \
             "$(key_pids "$sid"))"
        if ray_healthy; then echo "        healthy: gcs 127.0.0.1:$RAY_PORT, dashboard http://127.0.0.1:$DASH_PORT"
        else echo "        NOT healthy (log: $RAY_LOG)"; rc=1; fi
    else
        echo "ray:    not running"; rc=3
    fi
    if sid="$(alive_sid "$MLFLOW_SID_FILE" "$MLFLOW_SNAP")"; then
        echo "mlflow: running (session $sid, $(session_members "$sid" | wc -l) processes)"
        if mlflow_healthy; then echo "        healthy: http://127.0.0.1:$MLFLOW_PORT" \
            "(anonymous -> HTTP $(mlflow_status_anonymous), admin -> HTTP $(mlflow_status_admin))"
        else echo "        NOT healthy (log: $MLFLOW_LOG)"; rc=1; fi
    else
        echo "mlflow: not running"; rc=3
    fi
    [ "$rc" = 0 ] && print_env
    return "$rc"
}

cmd_rotate_mlflow_password() {
    # MLflow's update-password API (what mlflow.server.auth.client.AuthServiceClient.update_user_password
    # calls). Old and new password go from files to the request inside Python: never on a command line.
    alive_sid "$MLFLOW_SID_FILE" "$MLFLOW_SNAP" >/dev/null && mlflow_healthy || die "mlflow is not up"
    [ -s "$MLFLOW_PASSWORD_FILE" ] || die "no $MLFLOW_PASSWORD_FILE"
    rm -f "$MLFLOW_PASSWORD_FILE.new"
    new_secret "$MLFLOW_PASSWORD_FILE.new"
    "$BIN/python" - "http://127.0.0.1:$MLFLOW_PORT" "$MLFLOW_USER" "$MLFLOW_PASSWORD_FILE" "$MLFLOW_PASSWORD_FILE.new" <<'EOF' ||
import base64, json, sys, urllib.request
from pathlib import Path
uri, user, old_file, new_file = sys.argv[1:]
old, new = Path(old_file).read_text().strip(), Path(new_file).read_text().strip()
body = json.dumps({"username": user, "password": new, "current_password": old}).encode()
req = urllib.request.Request(f"{uri}/api/2.0/mlflow/users/update-password", data=body, method="PATCH", headers={
    "Content-Type": "application/json",
    "Authorization": "Basic " + base64.b64encode(f"{user}:{old}".encode()).decode()})
urllib.request.urlopen(req, timeout=30).read()
EOF
        { rm -f "$MLFLOW_PASSWORD_FILE.new"; die "update-password request failed; $MLFLOW_PASSWORD_FILE unchanged"; }
    mv -f "$MLFLOW_PASSWORD_FILE.new" "$MLFLOW_PASSWORD_FILE"
    [ "$(mlflow_status_admin)" = 200 ] || die "the new password in $MLFLOW_PASSWORD_FILE is not accepted"
    say "new MLflow admin password in $MLFLOW_PASSWORD_FILE (the old one no longer works)"
    say "Ray's processes still hold the old one: restart for jobs (scripts/cluster.sh down; scripts/cluster.sh up),"
    say "and re-export MLFLOW_TRACKING_PASSWORD=\"\$(cat $MLFLOW_PASSWORD_FILE)\" in your shells"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    rotate-mlflow-password) cmd_rotate_mlflow_password ;;
    *) echo "usage: $0 up|down|status|rotate-mlflow-password" >&2; exit 2 ;;
esac
