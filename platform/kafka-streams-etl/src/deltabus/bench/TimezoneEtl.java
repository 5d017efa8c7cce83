package deltabus.bench;

import java.io.IOException;
import java.math.BigDecimal;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.OffsetDateTime;
import java.time.format.DateTimeFormatter;
import java.time.format.DateTimeParseException;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

/**
 * The time-zone ETL of the Kafka side-by-side benchmark as a Kafka Streams topology.
 *
 * <p>Reads topics {@code timezone1} and {@code timezone2} (JSON values {@code
 * {"date": "2024-01-31 12:00:00.123456 -0500", "message": "..."}}), parses each local time with
 * its UTC offset into epoch milliseconds (microsecond precision, as the Pathway ETL's {@code
 * strptime("%Y-%m-%d %H:%M:%S.%f %z").timestamp(unit="ms")}) and writes the union of both to
 * topic {@code timezone_unified} as JSON {@code {"timestamp": ms, "message": ..., "time": ms
 * when processed, "diff": 1}}, keeping each record's key. A value that does not parse is
 * dropped and counted on stderr.
 *
 * <p>Exactly-once v2: input offsets and output records commit in one transaction every
 * {@code --commit-interval-ms}; readers with read_committed see the output at each commit.
 *
 * <p>Usage: {@code TimezoneEtl --bootstrap HOST:PORT --application-id ID [--commit-interval-ms
 * MS] [--linger-ms MS] [--ready-file F] [--state-dir D]}. The ready file is created once the
 * client is RUNNING. SIGTERM closes the client (committing what it processed) and exits 0; a
 * stream thread's failure exits 1.
 */
public final class TimezoneEtl {
  static final List<String> INPUT_TOPICS = List.of("timezone1", "timezone2");
  static final String OUTPUT_TOPIC = "timezone_unified";
  static final DateTimeFormatter DATE_FORMAT =
      DateTimeFormatter.ofPattern("uuuu-MM-dd HH:mm:ss.SSSSSS xx");

  private static final AtomicLong REJECTED = new AtomicLong();

  private TimezoneEtl() {}

  /** The topology: both input topics, parsed, into the output topic. */
  static Topology topology() {
    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(INPUT_TOPICS, Consumed.with(Serdes.ByteArray(), Serdes.String()))
        .flatMapValues(TimezoneEtl::transform)
        .to(OUTPUT_TOPIC, Produced.with(Serdes.ByteArray(), Serdes.String()));
    return builder.build();
  }

  /** The output value of one input value: none when it does not parse. */
  static List<String> transform(String value) {
    String out = unified(value, System.currentTimeMillis());
    if (out == null) {
      long n = REJECTED.incrementAndGet();
      if (n == 1 || Long.bitCount(n) == 1) {
        System.err.println("TimezoneEtl: dropped " + n + " unparseable value(s), e.g. " + value);
      }
      return List.of();
    }
    return List.of(out);
  }

  /** {"timestamp", "message", "time", "diff"} for one input JSON value, or null. */
  static String unified(String value, long nowMs) {
    if (value == null) {
      return null;
    }
    String date = stringField(value, "date");
    String message = stringField(value, "message");
    if (date == null || message == null) {
      return null;
    }
    OffsetDateTime when;
    try {
      when = OffsetDateTime.parse(date, DATE_FORMAT);
    } catch (DateTimeParseException e) {
      return null;
    }
    long micros = when.toEpochSecond() * 1_000_000L + when.getNano() / 1_000;
    String ms = BigDecimal.valueOf(micros).movePointLeft(3).toPlainString();
    StringBuilder out = new StringBuilder(96);
    out.append("{\"timestamp\":").append(ms).append(",\"message\":");
    quote(message, out);
    out.append(",\"time\":").append(nowMs).append(",\"diff\":1}");
    return out.toString();
  }

  /** The string value of top-level field {@code name} of a flat JSON object, or null. */
  static String stringField(String json, String name) {
    String key = "\"" + name + "\"";
    int at = 0;
    while ((at = json.indexOf(key, at)) >= 0) {
      int i = at + key.length();
      while (i < json.length() && Character.isWhitespace(json.charAt(i))) {
        i++;
      }
      if (i < json.length() && json.charAt(i) == ':') {
        i++;
        while (i < json.length() && Character.isWhitespace(json.charAt(i))) {
          i++;
        }
        return i < json.length() && json.charAt(i) == '"' ? readString(json, i + 1) : null;
      }
      at = i;
    }
    return null;
  }

  private static String readString(String json, int start) {
    StringBuilder s = new StringBuilder();
    for (int i = start; i < json.length(); i++) {
      char c = json.charAt(i);
      if (c == '"') {
        return s.toString();
      }
      if (c != '\\') {
        s.append(c);
        continue;
      }
      if (++i >= json.length()) {
        return null;
      }
      char e = json.charAt(i);
      switch (e) {
        case '"', '\\', '/' -> s.append(e);
        case 'b' -> s.append('\b');
        case 'f' -> s.append('\f');
        case 'n' -> s.append('\n');
        case 'r' -> s.append('\r');
        case 't' -> s.append('\t');
        case 'u' -> {
          if (i + 4 >= json.length()) {
            return null;
          }
          try {
            s.append((char) Integer.parseInt(json.substring(i + 1, i + 5), 16));
          } catch (NumberFormatException ex) {
            return null;
          }
          i += 4;
        }
        default -> {
          return null;
        }
      }
    }
    return null;
  }

  private static void quote(String text, StringBuilder out) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }

  static Properties config(
      String bootstrap, String applicationId, long commitMs, int lingerMs, Path stateDir) {
    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitMs);
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // As the Pathway ETL's reader (librdkafka fetch.wait.max.ms=5).
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG), 5);
    p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), lingerMs);
    return p;
  }

  public static void main(String[] args) throws Exception {
    String bootstrap = null;
    String applicationId = "deltabus-kafka-streams-etl";
    long commitMs = 100;
    int lingerMs = 5;
    Path ready = null;
    Path stateDir = null;
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (a.equals("-h") || a.equals("--help")) {
        System.out.println(
            "usage: TimezoneEtl --bootstrap HOST:PORT [--application-id ID]"
                + " [--commit-interval-ms MS] [--linger-ms MS] [--ready-file F] [--state-dir D]");
        return;
      }
      if (i + 1 >= args.length) {
        usage("missing value of " + a);
      }
      String v = args[++i];
      switch (a) {
        case "--bootstrap" -> bootstrap = v;
        case "--application-id" -> applicationId = v;
        case "--commit-interval-ms" -> commitMs = Long.parseLong(v);
        case "--linger-ms" -> lingerMs = Integer.parseInt(v);
        case "--ready-file" -> ready = Path.of(v);
        case "--state-dir" -> stateDir = Path.of(v);
        default -> usage("unknown option " + a);
      }
    }
    if (bootstrap == null) {
      usage("--bootstrap is required");
    }
    if (commitMs < 1) {
      usage("--commit-interval-ms must be >= 1");
    }
    boolean ownStateDir = stateDir == null;
    if (ownStateDir) {
      stateDir = Files.createTempDirectory("deltabus-kafka-streams-");
    }
    run(config(bootstrap, applicationId, commitMs, lingerMs, stateDir), ready, ownStateDir);
    System.exit(FAILED.get() ? 1 : 0);
  }

  private static final AtomicBoolean FAILED = new AtomicBoolean();

  private static void run(Properties props, Path ready, boolean ownStateDir)
      throws InterruptedException {
    Path stateDir = Path.of(props.getProperty(StreamsConfig.STATE_DIR_CONFIG));
    KafkaStreams streams = new KafkaStreams(topology(), props);
    CountDownLatch stopped = new CountDownLatch(1);
    streams.setStateListener(
        (now, before) -> {
          if (now == KafkaStreams.State.RUNNING && ready != null) {
            try {
              Files.write(ready, new byte[0]);
            } catch (IOException e) {
              System.err.println("TimezoneEtl: cannot write " + ready + ": " + e);
            }
          }
          if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
            stopped.countDown();
          }
        });
    streams.setUncaughtExceptionHandler(
        e -> {
          System.err.println("TimezoneEtl: stream thread failed: " + e);
          e.printStackTrace();
          FAILED.set(true);
          return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    Thread hook =
        new Thread(
            () -> {
              streams.close(java.time.Duration.ofSeconds(30));
              if (ownStateDir) {
                deleteTree(stateDir);
              }
              stopped.countDown();
            },
            "timezone-etl-shutdown");
    Runtime.getRuntime().addShutdownHook(hook);
    System.err.printf(
        "TimezoneEtl: %s %s -> %s, %s, commit.interval.ms=%s%n",
        props.get(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG),
        INPUT_TOPICS,
        OUTPUT_TOPIC,
        props.get(StreamsConfig.PROCESSING_GUARANTEE_CONFIG),
        props.get(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG));
    streams.start();
    stopped.await();
    if (FAILED.get()) {
      streams.close(java.time.Duration.ofSeconds(30));
      if (ownStateDir) {
        deleteTree(stateDir);
      }
    }
  }

  private static void deleteTree(Path dir) {
    try (var paths = Files.walk(dir)) {
      paths.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException e) {
      // scratch state of a stateless topology: left for the OS's tmp cleaning
    }
  }

  private static void usage(String problem) {
    System.err.println("TimezoneEtl: " + problem + " (see --help)");
    System.exit(2);
  }
}
