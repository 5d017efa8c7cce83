#!/usr/bin/env bash
# The jars a local Delta Spark session needs beside pyspark: Delta itself and the s3a
# filesystem (hadoop-aws matching Spark's Hadoop, and the AWS SDK bundle it was built
# with), fetched from Maven Central once and cached. Used by the Spark interop tests.
set -euo pipefail

PROG=$(basename "$0")
DELTA_VERSION=3.2.1        # delta-spark 3.2.x: Spark 3.5, Scala 2.12
HADOOP_VERSION=3.3.4       # the Hadoop that pyspark 3.5.x ships
AWS_SDK_VERSION=1.12.262   # what hadoop-aws 3.3.4 depends on
CACHE_ROOT=${DELTABUS_CACHE:-$HOME/.cache/deltabus}
JARS_DIR="$CACHE_ROOT/spark-delta-$DELTA_VERSION-hadoop-$HADOOP_VERSION/jars"
ARTIFACTS=(
  "io.delta:delta-spark_2.12:$DELTA_VERSION"
  "io.delta:delta-storage:$DELTA_VERSION"
  "org.apache.hadoop:hadoop-aws:$HADOOP_VERSION"
  "com.amazonaws:aws-java-sdk-bundle:$AWS_SDK_VERSION"
)

usage() {
  cat <<EOF
Usage: $PROG <command>

Commands:
  fetch   Download ${ARTIFACTS[*]}
          with Maven into $JARS_DIR (skipped when cached).
  jars    Print the cached jars, comma-separated (for spark.jars); fails when not fetched.
  dir     Print the jars directory.

Environment:
  DELTABUS_CACHE   cache root (default \$HOME/.cache/deltabus)
EOF
}

die() { echo "$PROG: $*" >&2; exit 1; }

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH (${2:-install it})"; }

cmd_fetch() {
  if [[ -f $JARS_DIR/.complete ]]; then
    echo "spark jars already cached in $JARS_DIR"; return
  fi
  need mvn "apt-get install maven"
  need java "apt-get install openjdk-17-jre-headless"
  local t0=$SECONDS staging artifact log
  mkdir -p "$(dirname "$JARS_DIR")"
  staging=$(mktemp -d "$(dirname "$JARS_DIR")/.jars.XXXXXX")
  log="$staging/.mvn.log"
  for artifact in "${ARTIFACTS[@]}"; do
    echo "fetching $artifact with Maven..." >&2
    # The jar alone: Spark provides everything else these depend on.
    if ! mvn -q -B -Dstyle.color=never dependency:copy -Dartifact="$artifact" \
        -DoutputDirectory="$staging" -Dmdep.overWriteReleases=true >"$log" 2>&1; then
      grep -E 'ERROR' "$log" | head -n 3 >&2 || true
      rm -rf "$staging"
      die "could not fetch $artifact from Maven Central"
    fi
  done
  rm -f "$log"
  touch "$staging/.complete"
  rm -rf "$JARS_DIR"
  mv "$staging" "$JARS_DIR"
  echo "spark jars in $JARS_DIR ($((SECONDS - t0)) s)"
}

cmd_jars() {
  [[ -f $JARS_DIR/.complete ]] || die "no cached jars in $JARS_DIR: run '$PROG fetch'"
  find "$JARS_DIR" -maxdepth 1 -name '*.jar' | sort | paste -sd, -
}

case ${1:-} in
  fetch) cmd_fetch ;;
  jars) cmd_jars ;;
  dir) echo "$JARS_DIR" ;;
  -h|--help|help|"") usage ;;
  *) die "unknown command: $1 (see --help)" ;;
esac
