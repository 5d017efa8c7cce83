"""The Kafka backbone of the benchmark: its broker, driver, consumer and the ETLs on it
(Pathway's, and a Kafka Streams topology)."""
