"""RabbitMQ's Prometheus metric families beyond the queue depths and global counters
of L{brokerd.http.prometheus}, read from the broker at scrape time, and the
C{/metrics/detailed} page that picks families by name (RabbitMQ's C{family} and
C{vhost} query parameters).
"""
