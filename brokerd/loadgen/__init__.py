"""Load from outside and what it costs: a pipelining AMQP 0-9-1 client on raw
sockets, which the throughput benchmarks, the crash loop and the validation's
fast clients drive brokers with, and samplers of a process's CPU time and memory
read from /proc."""
