#!/usr/bin/env bash
# The Kafka Streams ETL of the Kafka side-by-side benchmark (`deltabus bench --backbone
# kafka --etl kafka-streams`): org.apache.kafka:kafka-streams from Maven Central and the
# topology in platform/kafka-streams-etl/src, compiled with javac into the cache.
set -euo pipefail

PROG=$(basename "$0")
HERE=$(cd "$(dirname "$0")" && pwd -P)
SRC=$HERE/kafka-streams-etl/src
MAIN_CLASS=deltabus.bench.TimezoneEtl
STREAMS_VERSION=${KAFKA_STREAMS_VERSION:-4.3.1}
SLF4J_VERSION=${SLF4J_SIMPLE_VERSION:-2.0.17}
CACHE_ROOT=${DELTABUS_CACHE:-$HOME/.cache/deltabus}
HOME_DIR=$CACHE_ROOT/kafka-streams-$STREAMS_VERSION
ETL_HEAP_OPTS=${KAFKA_STREAMS_HEAP_OPTS:--Xms128m -Xmx384m}

usage() {
  cat <<EOF2
Usage: $PROG <command> [options]

Commands:
  fetch           Download kafka-streams ${STREAMS_VERSION} and its runtime jars (plus
                  slf4j 2 with slf4j-simple for its log, on stderr) with Maven into \$DELTABUS_CACHE/kafka-streams-<version>/libs
                  (skipped when cached).
  build           fetch, then compile platform/kafka-streams-etl/src with javac into
                  \$DELTABUS_CACHE/kafka-streams-<version>/classes-<hash of the sources>
                  (skipped when that build exists).
  run ARGS...     build, then exec the ETL in the foreground with ARGS (see run --help).
  classes         Print the compiled classes directory (after build).
  version         Print the kafka-streams version used.

Environment:
  KAFKA_STREAMS_VERSION    kafka-streams version (default ${STREAMS_VERSION})
  DELTABUS_CACHE           cache root (default \$HOME/.cache/deltabus)
  KAFKA_STREAMS_HEAP_OPTS  JVM heap options of run (default "-Xms128m -Xmx384m")
EOF2
}

die() { echo "$PROG: $*" >&2; exit 1; }

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH (${2:-install it})"; }

libs_dir() { echo "$HOME_DIR/libs"; }

src_hash() {
  (cd "$SRC" && find . -name '*.java' -type f -print0 | sort -z | xargs -0 sha256sum) \
    | sha256sum | cut -c1-12
}

classes_dir() { echo "$HOME_DIR/classes-$(src_hash)"; }

cmd_fetch() {
  local libs staging tmp
  libs=$(libs_dir)
  if [[ -f $libs/.complete ]]; then echo "kafka-streams $STREAMS_VERSION already cached in $libs"; return; fi
  need mvn "apt-get install maven"
  mkdir -p "$HOME_DIR"
  staging=$(mktemp -d "$HOME_DIR/.libs.XXXXXX")
  tmp=$(mktemp -d)
  cat >"$tmp/pom.xml" <<EOF2
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>deltabus.local</groupId><artifactId>kafka-streams-fetch</artifactId>
  <version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-streams</artifactId><version>$STREAMS_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>$SLF4J_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>$SLF4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF2
  echo "fetching kafka-streams:$STREAMS_VERSION and its runtime dependencies with Maven..." >&2
  if ! mvn -q -B -Dstyle.color=never -f "$tmp/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$staging" >"$tmp/mvn.log" 2>&1; then
    grep -E 'ERROR' "$tmp/mvn.log" | head -n 3 >&2 || true
    rm -rf "$tmp" "$staging"
    die "could not fetch kafka-streams $STREAMS_VERSION with Maven"
  fi
  rm -rf "$tmp"
  touch "$staging/.complete"
  rm -rf "$libs"
  mv "$staging" "$libs"
  echo "kafka-streams $STREAMS_VERSION in $libs"
}

cmd_build() {
  cmd_fetch >/dev/null
  local classes staging
  classes=$(classes_dir)
  if [[ -f $classes/.complete ]]; then echo "Kafka Streams ETL already built in $classes"; return; fi
  need javac "apt-get install openjdk-17-jdk-headless"
  staging=$(mktemp -d "$HOME_DIR/.classes.XXXXXX")
  find "$SRC" -name '*.java' -type f -print0 \
    | xargs -0 javac --release 17 -Xlint:all -Werror -cp "$(libs_dir)/*" -d "$staging" \
    || { rm -rf "$staging"; die "javac failed"; }
  touch "$staging/.complete"
  rm -rf "$classes"
  mv "$staging" "$classes"
  echo "Kafka Streams ETL built in $classes"
}

cmd_run() {
  need java "apt-get install openjdk-17-jre-headless"
  cmd_build >/dev/null
  # shellcheck disable=SC2086  # ETL_HEAP_OPTS is a list of JVM flags
  exec java $ETL_HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
    -cp "$(classes_dir):$(libs_dir)/*" "$MAIN_CLASS" "$@"
}

main() {
  (($#)) || { usage >&2; exit 2; }
  local cmd=$1; shift
  case $cmd in
    fetch) cmd_fetch ;;
    build) cmd_build ;;
    run) cmd_run "$@" ;;
    classes) local c; c=$(classes_dir); [[ -f $c/.complete ]] || die "not built"; echo "$c" ;;
    version) echo "$STREAMS_VERSION" ;;
    -h|--help|help) usage ;;
    *) echo "$PROG: unknown command: $cmd" >&2; usage >&2; exit 2 ;;
  esac
}

main "$@"
