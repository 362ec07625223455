# shellcheck shell=bash
# Toxiproxy (github.com/Shopify/toxiproxy/v2) for the fault-injection suite: a
# TCP proxy between the functions and PostgreSQL whose HTTP API adds and
# removes faults ("toxics") on the fly. Source it, then:
#
#   toxiproxy_install .tmp/bin          # go install, once (needs the Go proxy)
#   toxiproxy_start .tmp/bin LOGFILE    # sets TOXIPROXY_API, TOXIPROXY_PID
#   port=$(toxiproxy_add_proxy pg "127.0.0.1:$PGPORT")   # prints its port
#   toxiproxy_add_toxic pg resets reset_peer downstream 1.0 '{"timeout":50}'
#   toxiproxy_remove_toxic pg resets
#   toxiproxy_reset                     # removes every toxic
#   toxiproxy_stop
#
# Everything listens on 127.0.0.1 only. The API is the server's own
# (api.go of v2.12.0): POST /proxies, POST /proxies/{proxy}/toxics,
# DELETE /proxies/{proxy}/toxics/{toxic}, POST /reset, GET /version.

TOXIPROXY_MODULE=github.com/Shopify/toxiproxy/v2
TOXIPROXY_VERSION=v2.12.0
TOXIPROXY_API=""
TOXIPROXY_PID=""

tp__log() { echo "[toxiproxy] $*" >&2; }

# toxiproxy_install BINDIR: installs the server as BINDIR/toxiproxy-server
# (go install pkg@version does not touch the project's go.mod).
toxiproxy_install() {
  local bindir=$1
  # The binary reports its version as "git" (no release ldflags), so a
  # marker file records which version was installed.
  if [ -x "$bindir/toxiproxy-server" ] \
    && [ "$(cat "$bindir/toxiproxy-server.version" 2>/dev/null)" = "$TOXIPROXY_VERSION" ]; then
    return 0
  fi
  mkdir -p "$bindir"
  local tmp
  tmp=$(mktemp -d "$bindir/.install.XXXXXX")
  tp__log "installing $TOXIPROXY_MODULE/cmd/server@$TOXIPROXY_VERSION"
  if ! GOBIN="$(cd "$tmp" && pwd)" GOFLAGS= go install "$TOXIPROXY_MODULE/cmd/server@$TOXIPROXY_VERSION"; then
    rm -rf "$tmp"
    return 1
  fi
  mv "$tmp/server" "$bindir/toxiproxy-server"
  echo "$TOXIPROXY_VERSION" >"$bindir/toxiproxy-server.version"
  rm -rf "$tmp"
}

# toxiproxy_free_port [FROM]: a TCP port nothing listens on, from FROM
# (default 58400) up to 58600.
toxiproxy_free_port() {
  local port
  for port in $(seq "${1:-58400}" 58600); do
    if ! (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; then echo "$port"; return 0; fi
  done
  return 1
}

# toxiproxy_start BINDIR LOGFILE: starts the server on a free loopback port
# and waits (bounded) until its API answers. A port nothing listens on may
# still be taken (it is in the ephemeral range: a client connection can hold
# it as its local port, and the server's bind fails): then it tries the next
# free port, a few times.
toxiproxy_start() {
  local bindir=$1 log=$2 port=58399 i try
  for try in 1 2 3 4 5; do
    port=$(toxiproxy_free_port $((port + 1))) || { tp__log "no free port"; return 1; }
    "$bindir/toxiproxy-server" -host 127.0.0.1 -port "$port" >"$log" 2>&1 &
    TOXIPROXY_PID=$!
    TOXIPROXY_API="http://127.0.0.1:$port"
    for i in $(seq 1 100); do
      if curl -fsS --max-time 1 "$TOXIPROXY_API/version" >/dev/null 2>&1; then
        tp__log "server $TOXIPROXY_VERSION on 127.0.0.1:$port (pid $TOXIPROXY_PID)"
        return 0
      fi
      kill -0 "$TOXIPROXY_PID" 2>/dev/null || break
      # The server logs a failed bind and keeps running without its API.
      grep -q "address already in use" "$log" 2>/dev/null && break
      sleep 0.1
    done
    grep -q "address already in use" "$log" 2>/dev/null || break # not a port taken under our feet
    tp__log "port $port was taken (try $try); trying the next one"
    toxiproxy_stop
  done
  tp__log "server did not answer on $TOXIPROXY_API; log:"
  cat "$log" >&2
  toxiproxy_stop
  return 1
}

# toxiproxy_stop: stops the server this shell started.
toxiproxy_stop() {
  [ -n "$TOXIPROXY_PID" ] || return 0
  kill "$TOXIPROXY_PID" 2>/dev/null || true
  wait "$TOXIPROXY_PID" 2>/dev/null || true
  TOXIPROXY_PID=""
}

tp__api() { # METHOD PATH [JSON]
  local method=$1 path=$2 body=${3:-}
  if [ -n "$body" ]; then
    curl -fsS --max-time 5 -X "$method" -H 'Content-Type: application/json' -d "$body" "$TOXIPROXY_API$path" >/dev/null
  else
    curl -fsS --max-time 5 -X "$method" "$TOXIPROXY_API$path" >/dev/null
  fi
}

# toxiproxy_add_proxy NAME UPSTREAM (host:port): a proxy listening on a
# loopback port the kernel picks, printed on stdout. The server binds
# "127.0.0.1:0" and answers with the address it got (proxy.go of v2.12.0:
# net.Listen, then Listen = listener.Addr().String()). A port chosen here
# instead could be taken between the check and the bind: the ports are in the
# ephemeral range, and CI once failed with the server's 500 for that.
toxiproxy_add_proxy() {
  local out listen
  out=$(curl -sS --max-time 5 -X POST -H 'Content-Type: application/json' \
    -d "{\"name\":\"$1\",\"listen\":\"127.0.0.1:0\",\"upstream\":\"$2\",\"enabled\":true}" \
    -w '\n%{http_code}' "$TOXIPROXY_API/proxies") || { tp__log "cannot reach the API at $TOXIPROXY_API"; return 1; }
  if [ "${out##*$'\n'}" != 201 ]; then
    tp__log "creating the proxy $1 failed: ${out//$'\n'/ }"
    return 1
  fi
  listen=$(printf '%s' "${out%$'\n'*}" | sed -n 's/.*"listen":"127\.0\.0\.1:\([0-9]*\)".*/\1/p')
  [ -n "$listen" ] || { tp__log "the proxy $1 has no listen port in: ${out%$'\n'*}"; return 1; }
  echo "$listen"
}

# toxiproxy_add_toxic PROXY NAME TYPE STREAM TOXICITY ATTRIBUTES_JSON
#   TYPE: latency {"latency":ms,"jitter":ms}, reset_peer {"timeout":ms},
#         timeout {"timeout":ms} (0: hold the data until removed), ...
#   STREAM: upstream (client->server) or downstream (server->client).
#   TOXICITY: 0..1, the share of connections it applies to.
toxiproxy_add_toxic() {
  tp__api POST "/proxies/$1/toxics" \
    "{\"name\":\"$2\",\"type\":\"$3\",\"stream\":\"$4\",\"toxicity\":$5,\"attributes\":$6}"
}

# toxiproxy_remove_toxic PROXY NAME.
toxiproxy_remove_toxic() { tp__api DELETE "/proxies/$1/toxics/$2"; }

# toxiproxy_reset: re-enables every proxy and removes every toxic.
toxiproxy_reset() { tp__api POST /reset; }
