/* The ceiling of bench/passthrough.py: a Kafka-to-Kafka forwarder in C on librdkafka.
 *
 *   forwarder BOOTSTRAP INPUT OUTPUT GROUP
 *
 * The at-least-once algorithm of the bench's first hand-written Python loop: poll up to
 * MAX_BATCH records or for MAX_BATCH_MS, produce each (key, value and headers copied),
 * flush, commit the consumed positions synchronously; until SIGTERM, then commit
 * what was flushed and leave the group. Built by the bench into its cache at run time from
 * Debian's librdkafka-dev (gcc -O2 forwarder.c -lrdkafka).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#define MAX_BATCH 10000
/* A batch gathers records for this long after its first (or until MAX_BATCH): bounded by
 * count alone it would wait for 10,000 records at a modest rate; not gathering at all, it
 * would flush and commit every few dozen records and load the broker with tiny requests. */
#define MAX_BATCH_MS 20.0

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

static volatile sig_atomic_t stopping = 0;

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

static void set(rd_kafka_conf_t *conf, const char *key, const char *value) {
    char err[512];
    if (rd_kafka_conf_set(conf, key, value, err, sizeof(err)) != RD_KAFKA_CONF_OK) {
        fprintf(stderr, "forwarder: %s=%s: %s\n", key, value, err);
        exit(2);
    }
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    if (m->err) {
        /* The input offset would be committed past a lost record: fail loudly instead. */
        fprintf(stderr, "forwarder: delivery failed: %s\n", rd_kafka_err2str(m->err));
        exit(3);
    }
}

int main(int argc, char **argv) {
    char err[512];
    if (argc != 5) {
        fprintf(stderr, "usage: forwarder BOOTSTRAP INPUT OUTPUT GROUP\n");
        return 2;
    }
    const char *bootstrap = argv[1], *input = argv[2], *output = argv[3], *group = argv[4];
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    rd_kafka_conf_t *pconf = rd_kafka_conf_new();
    set(pconf, "bootstrap.servers", bootstrap);
    set(pconf, "linger.ms", "5");
    set(pconf, "enable.idempotence", "true");
    set(pconf, "acks", "all");
    rd_kafka_conf_set_dr_msg_cb(pconf, on_delivery);
    rd_kafka_t *producer = rd_kafka_new(RD_KAFKA_PRODUCER, pconf, err, sizeof(err));
    if (!producer) {
        fprintf(stderr, "forwarder: producer: %s\n", err);
        return 2;
    }

    rd_kafka_conf_t *cconf = rd_kafka_conf_new();
    set(cconf, "bootstrap.servers", bootstrap);
    set(cconf, "group.id", group);
    set(cconf, "auto.offset.reset", "earliest");
    set(cconf, "enable.auto.commit", "false");
    rd_kafka_t *consumer = rd_kafka_new(RD_KAFKA_CONSUMER, cconf, err, sizeof(err));
    if (!consumer) {
        fprintf(stderr, "forwarder: consumer: %s\n", err);
        return 2;
    }
    rd_kafka_poll_set_consumer(consumer);
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, input, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t rc = rd_kafka_subscribe(consumer, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (rc) {
        fprintf(stderr, "forwarder: subscribe: %s\n", rd_kafka_err2str(rc));
        return 2;
    }

    while (!stopping) {
        int n = 0;
        rd_kafka_message_t *m = rd_kafka_consumer_poll(consumer, 100);
        double batch_end = now_ms() + MAX_BATCH_MS;
        while (m) {
            if (!m->err) {
                rd_kafka_headers_t *headers = NULL;
                if (rd_kafka_message_headers(m, &headers) == RD_KAFKA_RESP_ERR_NO_ERROR)
                    headers = rd_kafka_headers_copy(headers);
                else
                    headers = NULL;
                for (;;) {
                    rc = rd_kafka_producev(
                        producer, RD_KAFKA_V_TOPIC(output),
                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                        RD_KAFKA_V_KEY(m->key, m->key_len),
                        RD_KAFKA_V_VALUE(m->payload, m->len),
                        RD_KAFKA_V_HEADERS(headers), RD_KAFKA_V_END);
                    if (rc != RD_KAFKA_RESP_ERR__QUEUE_FULL) break;
                    rd_kafka_poll(producer, 10); /* queue full: serve deliveries, retry */
                }
                if (rc) {
                    fprintf(stderr, "forwarder: produce: %s\n", rd_kafka_err2str(rc));
                    return 3;
                }
                n++;
            }
            rd_kafka_message_destroy(m);
            double left = batch_end - now_ms();
            m = n < MAX_BATCH && left > 0 ? rd_kafka_consumer_poll(consumer, (int)left + 1) : NULL;
        }
        if (n > 0) {
            rd_kafka_flush(producer, 60000);
            if (rd_kafka_outq_len(producer) > 0) {
                fprintf(stderr, "forwarder: flush timed out\n");
                return 3;
            }
            rc = rd_kafka_commit(consumer, NULL, 0);
            if (rc && rc != RD_KAFKA_RESP_ERR__NO_OFFSET) {
                fprintf(stderr, "forwarder: commit: %s\n", rd_kafka_err2str(rc));
                return 3;
            }
        }
    }
    rd_kafka_consumer_close(consumer);
    rd_kafka_destroy(consumer);
    rd_kafka_flush(producer, 10000);
    rd_kafka_destroy(producer);
    return 0;
}
