"""Benchmarks, the demo and throwaway servers: tools around rota, never
imported by it (`rota bench` and `rota demo` come through entry points)."""
