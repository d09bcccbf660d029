"""Data parallelism: engine replicas behind a KV-aware router.

    kv_events   KV cache events over ZeroMQ, in vLLM's wire format (publisher, subscriber)
    router      which replica serves a request: load (power of two choices) and
                prefix-cache affinity (the replica caching the longest prefix)
    engine      `DPAsyncLLM`: N `AsyncLLM` replicas behind the router

The submodules import pyzmq and msgspec (the serve extra) when imported.
"""
