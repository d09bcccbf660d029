"""Disaggregated prefill/decode: one instance computes prompts' KV, another decodes.

    connector   KVConnector (the interface), ZmqConnector, ShmConnector
    instance    the prefill / decode instance process around an EngineCore
    proxy       DisaggProxy: starts both, checks their KV layouts agree, routes requests

The submodules import torch, pyzmq and msgspec when imported.
"""
