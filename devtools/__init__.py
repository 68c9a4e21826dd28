"""Development and test tools, outside the product's import path: the local Kafka broker launcher
(`devtools.kafka_local`), the broker-jar fetcher (`devtools.kafka_jars`) and the stub engine
(`devtools.stub`). The service never imports this package; only the dev commands `clef-router kafka-local`
and `clef-router run/serve --stub-engine` load it, inside their handlers."""
