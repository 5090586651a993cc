#!/usr/bin/env python3
"""One-shot exec latency of the Python `kubernetes` client, in-process (part of
`cargo bench --bench exec`, which runs it; `pip install kubernetes`).

Usage: exec_python.py NAMESPACE POD CONTAINER N
Prints one JSON line: {"n": N, "p50_ms": ..., "p95_ms": ..., "samples_ms": [...]}.
"""
import json
import sys
import time

from kubernetes import client, config
from kubernetes.stream import stream


def main():
    ns, pod, container, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    config.load_kube_config()
    api = client.CoreV1Api()

    def once():
        stream(
            api.connect_get_namespaced_pod_exec,
            pod,
            ns,
            container=container,
            command=["true"],
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
        )

    for _ in range(5):  # warm-up: imports, TLS session, first connection
        once()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        once()
        samples.append((time.perf_counter() - t) * 1000.0)
    samples.sort()

    def pick(q):
        return samples[round((len(samples) - 1) * q)]

    print(json.dumps({"n": n, "p50_ms": pick(0.5), "p95_ms": pick(0.95), "samples_ms": samples}))


if __name__ == "__main__":
    main()
