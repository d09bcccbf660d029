"""Operating the engine: request traces (OpenTelemetry, `tracing`), the torch profiler
switch (`profiler`) and structured logs with request ids (`logs`). docs/operating.md."""
