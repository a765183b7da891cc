package dev.offtake.bench;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.CommitMode;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelStreamProcessor;
import io.confluent.parallelconsumer.PollContext;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * bench/concurrency.py's anchor: Confluent's Parallel Consumer, consume -> call the latency
 * service once per record -> produce the record to the output topic, offsets committed by the
 * Parallel Consumer once the output is acknowledged (pollAndProduce, its consume-produce
 * flow). One call per record on one of the Parallel Consumer's maxConcurrency worker threads
 * (its model: a thread per record in flight), with java.net.http.HttpClient (HTTP/1.1,
 * pooled connections). Stops on SIGTERM, draining what is in flight (closeDrainFirst).
 *
 * <p>Arguments: --bootstrap B --input T --output O --group G --ordering KEY|PARTITION|UNORDERED
 * --concurrency N --service http://127.0.0.1:PORT
 */
public final class ParallelConsumerBench {
  private ParallelConsumerBench() {}

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = new HashMap<>();
    for (int i = 0; i + 1 < argv.length; i += 2) {
      args.put(argv[i].replaceFirst("^--", ""), argv[i + 1]);
    }
    String bootstrap = required(args, "bootstrap");
    String input = required(args, "input");
    String output = required(args, "output");
    String service = required(args, "service");
    int concurrency = Integer.parseInt(required(args, "concurrency"));
    ProcessingOrder ordering = ProcessingOrder.valueOf(required(args, "ordering"));

    Properties c = new Properties();
    c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    c.put(ConsumerConfig.GROUP_ID_CONFIG, required(args, "group"));
    c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false"); // the Parallel Consumer commits
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    KafkaConsumer<byte[], byte[]> consumer =
        new KafkaConsumer<>(c, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    KafkaProducer<byte[], byte[]> producer =
        new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());

    ParallelConsumerOptions<byte[], byte[]> options =
        ParallelConsumerOptions.<byte[], byte[]>builder()
            .ordering(ordering)
            .maxConcurrency(concurrency)
            .commitMode(CommitMode.PERIODIC_CONSUMER_ASYNCHRONOUS) // its default
            .consumer(consumer)
            .producer(producer)
            .build();
    ParallelStreamProcessor<byte[], byte[]> pc =
        ParallelStreamProcessor.createEosStreamProcessor(options);

    HttpClient http =
        HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofSeconds(10))
            .build();
    String callUrl = service + "/call?key=";

    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  pc.closeDrainFirst(Duration.ofSeconds(5)); // the bench stops a run once measured
                  stopped.countDown();
                }));

    pc.subscribe(java.util.List.of(input));
    pc.pollAndProduce(
        (PollContext<byte[], byte[]> context) -> {
          byte[] key = context.key();
          String k = key == null ? "" : new String(key, StandardCharsets.UTF_8);
          HttpRequest request =
              HttpRequest.newBuilder(
                      URI.create(callUrl + URLEncoder.encode(k, StandardCharsets.UTF_8)))
                  .GET()
                  .build();
          try {
            HttpResponse<Void> answer = http.send(request, HttpResponse.BodyHandlers.discarding());
            if (answer.statusCode() != 200) {
              throw new IllegalStateException("service answered " + answer.statusCode());
            }
          } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
          }
          return new ProducerRecord<>(output, key, context.value());
        });
    stopped.await();
  }

  private static String required(Map<String, String> args, String name) {
    String value = args.get(name);
    if (value == null) {
      System.err.println("missing --" + name);
      System.exit(2);
    }
    return value;
  }
}
