#!/usr/bin/env bash
# Run a local single-node Apache Kafka 4.x broker (KRaft mode, no ZooKeeper) from
# its Maven Central jars. Used as the comparison baseline for the Delta-on-MinIO bus.
set -euo pipefail

PROG=$(basename "$0")
# Newest 4.x whose full runtime dependency set resolves from Maven Central when this
# was written (kafka_2.13 4.4.0 is listed, but its kafka-tools-api 4.4.0 jar is not).
# KAFKA_VERSION=latest picks the newest 4.x that resolves completely at fetch time.
KAFKA_VERSION=${KAFKA_VERSION:-4.3.1}
CACHE_ROOT=${DELTABUS_CACHE:-$HOME/.cache/deltabus}
KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}
START_TIMEOUT=${KAFKA_START_TIMEOUT:-60}

usage() {
  cat <<EOF
Usage: $PROG <command> [options]

Commands:
  fetch                         Download Kafka ${KAFKA_VERSION} and its runtime jars with Maven
                                into \$DELTABUS_CACHE/kafka-<version>/libs (skipped when cached).
  start --port PORT --dir DIR   Write a KRaft single-node config in DIR, format storage (first
        [--set key=value]...    start only), start the broker in the background (PLAINTEXT on
                                127.0.0.1:PORT, CONTROLLER on 127.0.0.1:PORT+1) and wait until
                                the port accepts connections. pid: DIR/kafka.pid, log: DIR/kafka.log.
                                --set adds or overrides a server.properties entry.
  stop --dir DIR                Stop the broker started with --dir DIR and wait for it to exit.
  status --dir DIR              Exit 0 if the broker of DIR is running.
  libs                          Print the libs directory (after fetch).
  version                       Print the Kafka version used.

Environment:
  KAFKA_VERSION        Kafka version (default ${KAFKA_VERSION}); "latest" = newest complete 4.x
  DELTABUS_CACHE       cache root (default \$HOME/.cache/deltabus)
  KAFKA_HEAP_OPTS      JVM heap options (default "-Xms256m -Xmx512m")
  KAFKA_START_TIMEOUT  seconds to wait for the port (default 60)
EOF
}

die() { echo "$PROG: $*" >&2; exit 1; }

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH (${2:-install it})"; }

# Throwaway pom listing the given dependencies (each "group:artifact:version").
write_pom() {
  local dir=$1; shift
  {
    echo '<project xmlns="http://maven.apache.org/POM/4.0.0">'
    echo '  <modelVersion>4.0.0</modelVersion>'
    echo '  <groupId>deltabus.local</groupId><artifactId>kafka-fetch</artifactId>'
    echo '  <version>1</version><packaging>pom</packaging>'
    echo '  <dependencies>'
    local dep g a v
    for dep in "$@"; do
      IFS=: read -r g a v <<<"$dep"
      echo "    <dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version></dependency>"
    done
    echo '  </dependencies>'
    echo '</project>'
  } >"$dir/pom.xml"
}

# Newest kafka_2.13 version inside the Maven version range $1 (only the artifact's own
# metadata is consulted; transitive dependencies are not resolved here).
newest_in_range() {
  local range=$1 tmp
  tmp=$(mktemp -d)
  write_pom "$tmp" "org.apache.kafka:kafka_2.13:$range"
  sed -i 's#</version></dependency>#</version><exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions></dependency>#' "$tmp/pom.xml"
  if mvn -q -B -Dstyle.color=never -f "$tmp/pom.xml" dependency:list -DexcludeTransitive=true \
      -DoutputFile="$tmp/list.txt" >"$tmp/mvn.log" 2>&1; then
    grep -o 'org.apache.kafka:kafka_2.13:jar:[^:]*' "$tmp/list.txt" | head -n1 | cut -d: -f4
  fi
  rm -rf "$tmp"
}

# Copy kafka_2.13:$1 and its runtime dependencies (plus the slf4j->log4j2 binding the
# official distribution ships, so the broker logs) into $2. Returns non-zero on failure.
copy_jars() {
  local version=$1 out=$2 tmp log4j
  tmp=$(mktemp -d)
  write_pom "$tmp" "org.apache.kafka:kafka_2.13:$version"
  if ! mvn -q -B -Dstyle.color=never -f "$tmp/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$out" >"$tmp/mvn.log" 2>&1; then
    grep -E 'ERROR' "$tmp/mvn.log" | head -n 3 >&2 || true
    rm -rf "$tmp"; return 1
  fi
  log4j=$(find "$out" -maxdepth 1 -name 'log4j-core-*.jar' -printf '%f\n' | sed -E 's/^log4j-core-(.*)\.jar$/\1/' | head -n1)
  if [[ -n $log4j ]]; then
    write_pom "$tmp" "org.apache.logging.log4j:log4j-slf4j-impl:$log4j"
    if ! mvn -q -B -Dstyle.color=never -f "$tmp/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
        -DexcludeArtifactIds=slf4j-api,log4j-api,log4j-core \
        -DoutputDirectory="$out" >"$tmp/mvn.log" 2>&1; then
      grep -E 'ERROR' "$tmp/mvn.log" | head -n 3 >&2 || true
      rm -rf "$tmp"; return 1
    fi
  fi
  rm -rf "$tmp"
}

resolve_version() {
  if [[ $KAFKA_VERSION != latest ]]; then echo "$KAFKA_VERSION"; return; fi
  local c
  c=$(cached_versions | head -n1)
  [[ -n $c ]] && { echo "$c"; return; }
  newest_in_range '[4.0.0,5.0.0)'
}

cached_versions() {
  [[ -d $CACHE_ROOT ]] || return 0
  find "$CACHE_ROOT" -maxdepth 3 -path '*/kafka-4.*/libs/.complete' 2>/dev/null \
    | sed -E 's#.*/kafka-([^/]+)/libs/.complete#\1#' | sort -rV || true
}

libs_dir() { echo "$CACHE_ROOT/kafka-$1/libs"; }

cmd_fetch() {
  need mvn "apt-get install maven"
  need java "apt-get install openjdk-17-jre-headless"
  local version upper tries=0 t0=$SECONDS
  if [[ $KAFKA_VERSION == latest ]]; then
    version=$(cached_versions | head -n1)
    if [[ -n $version ]]; then echo "kafka $version already cached in $(libs_dir "$version")"; return; fi
    upper=5.0.0
    while :; do
      version=$(newest_in_range "[4.0.0,$upper)")
      [[ -n $version ]] || die "no complete Kafka 4.x release could be resolved with Maven"
      if [[ -f $(libs_dir "$version")/.complete ]] || fetch_version "$version"; then break; fi
      echo "kafka $version does not resolve completely; trying an older 4.x" >&2
      upper=$version
      tries=$((tries + 1)); ((tries < 5)) || die "gave up after 5 versions"
    done
  else
    version=$KAFKA_VERSION
    if [[ -f $(libs_dir "$version")/.complete ]]; then
      echo "kafka $version already cached in $(libs_dir "$version")"; return
    fi
    fetch_version "$version" || die "could not fetch Kafka $version with Maven"
  fi
  echo "kafka $version in $(libs_dir "$version") ($((SECONDS - t0)) s)"
}

fetch_version() {
  local version=$1 libs staging
  libs=$(libs_dir "$version")
  [[ -f $libs/.complete ]] && return 0
  mkdir -p "$(dirname "$libs")"
  staging=$(mktemp -d "$(dirname "$libs")/.libs.XXXXXX")
  echo "fetching kafka_2.13:$version and its runtime dependencies with Maven..." >&2
  if ! copy_jars "$version" "$staging"; then
    rm -rf "$staging"; rmdir "$(dirname "$libs")" 2>/dev/null || true
    return 1
  fi
  touch "$staging/.complete"
  rm -rf "$libs"
  mv "$staging" "$libs"
}

parse_opts() {
  PORT="" DIR="" SETS=()
  while (($#)); do
    case $1 in
      --port) PORT=${2:?--port needs a value}; shift 2 ;;
      --port=*) PORT=${1#*=}; shift ;;
      --dir) DIR=${2:?--dir needs a value}; shift 2 ;;
      --dir=*) DIR=${1#*=}; shift ;;
      --set) SETS+=("${2:?--set needs key=value}"); shift 2 ;;
      --set=*) SETS+=("${1#*=}"); shift ;;
      -h|--help) usage; exit 0 ;;
      *) die "unknown option: $1 (see --help)" ;;
    esac
  done
}

# pid from DIR/kafka.pid if that process is alive and is this DIR's broker.
running_pid() {
  local dir=$1 pid
  [[ -f $dir/kafka.pid ]] || return 1
  pid=$(<"$dir/kafka.pid")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$dir/server.properties" || return 1
  echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

cmd_start() {
  parse_opts "$@"
  [[ $PORT =~ ^[0-9]+$ ]] && ((PORT > 0 && PORT < 65535)) || die "start needs --port PORT (1-65534)"
  [[ -n $DIR ]] || die "start needs --dir DATA_DIR"
  need java "apt-get install openjdk-17-jre-headless"
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd -P)
  local version libs cport pid cluster_id kv
  version=$(resolve_version)
  [[ -n $version ]] || die "no Kafka version resolved; run '$PROG fetch' first"
  libs=$(libs_dir "$version")
  [[ -f $libs/.complete ]] || { cmd_fetch; libs=$(libs_dir "$(resolve_version)"); }
  cport=$((PORT + 1))
  if pid=$(running_pid "$DIR"); then die "a broker for $DIR is already running (pid $pid)"; fi
  port_open "$PORT" && die "port $PORT is already in use"
  port_open "$cport" && die "port $cport (controller) is already in use"

  cat >"$DIR/server.properties" <<EOF
# Generated by platform/kafka.sh: single-node KRaft broker+controller, loopback only.
process.roles=broker,controller
node.id=1
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$cport
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
controller.quorum.bootstrap.servers=127.0.0.1:$cport
log.dirs=$DIR/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
auto.create.topics.enable=true
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
log.retention.hours=24
EOF
  for kv in "${SETS[@]}"; do
    [[ $kv == *=* ]] || die "--set wants key=value, got '$kv'"
    sed -i "/^${kv%%=*}=/d" "$DIR/server.properties"
    echo "$kv" >>"$DIR/server.properties"
  done

  cat >"$DIR/log4j2.properties" <<'EOF'
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
EOF

  local java_opts=(-Dlog4j2.configurationFile="$DIR/log4j2.properties" -Djava.awt.headless=true
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20)
  if [[ ! -f $DIR/data/meta.properties ]]; then
    cluster_id=$(java -cp "$libs/*" "${java_opts[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1)
    [[ -n $cluster_id ]] || die "StorageTool random-uuid failed"
    java -cp "$libs/*" "${java_opts[@]}" kafka.tools.StorageTool format -t "$cluster_id" \
      -c "$DIR/server.properties" --standalone >"$DIR/format.log" 2>&1 \
      || { tail -n 20 "$DIR/format.log" >&2; die "storage format failed"; }
  fi

  # shellcheck disable=SC2086  # KAFKA_HEAP_OPTS is a list of JVM flags
  setsid java $KAFKA_HEAP_OPTS "${java_opts[@]}" -cp "$libs/*" kafka.Kafka "$DIR/server.properties" \
    >"$DIR/kafka.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$DIR/kafka.pid"

  local deadline=$((SECONDS + START_TIMEOUT))
  until port_open "$PORT"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "--- tail of $DIR/kafka.log ---" >&2; tail -n 40 "$DIR/kafka.log" >&2
      rm -f "$DIR/kafka.pid"
      die "kafka exited during start-up"
    fi
    if ((SECONDS >= deadline)); then
      echo "--- tail of $DIR/kafka.log ---" >&2; tail -n 40 "$DIR/kafka.log" >&2
      kill "$pid" 2>/dev/null || true
      rm -f "$DIR/kafka.pid"
      die "kafka did not accept connections on 127.0.0.1:$PORT within ${START_TIMEOUT}s"
    fi
    sleep 0.5
  done
  echo "kafka $version running: pid $pid, bootstrap 127.0.0.1:$PORT, log $DIR/kafka.log"
}

cmd_stop() {
  parse_opts "$@"
  [[ -n $DIR ]] || die "stop needs --dir DATA_DIR"
  [[ -d $DIR ]] || die "no such directory: $DIR"
  DIR=$(cd "$DIR" && pwd -P)
  local pid i
  if ! pid=$(running_pid "$DIR"); then
    rm -f "$DIR/kafka.pid"
    echo "kafka for $DIR is not running"; return 0
  fi
  kill -TERM "$pid"
  for ((i = 0; i < 60; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "kafka (pid $pid) did not stop within 30 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  fi
  rm -f "$DIR/kafka.pid"
  echo "kafka stopped (pid $pid)"
}

cmd_status() {
  parse_opts "$@"
  [[ -n $DIR ]] || die "status needs --dir DATA_DIR"
  [[ -d $DIR ]] || { echo "not running"; exit 1; }
  DIR=$(cd "$DIR" && pwd -P)
  local pid
  if pid=$(running_pid "$DIR"); then echo "running (pid $pid)"; else echo "not running"; exit 1; fi
}

main() {
  (($#)) || { usage >&2; exit 2; }
  local cmd=$1; shift
  case $cmd in
    fetch) cmd_fetch ;;
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status "$@" ;;
    libs) local v; v=$(resolve_version); [[ -f $(libs_dir "$v")/.complete ]] || die "not fetched"; libs_dir "$v" ;;
    version) resolve_version ;;
    -h|--help|help) usage ;;
    *) echo "$PROG: unknown command: $cmd" >&2; usage >&2; exit 2 ;;
  esac
}

main "$@"
