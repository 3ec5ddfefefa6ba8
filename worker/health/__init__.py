"""What a process reports of itself: health checks and their verdicts, liveness, the
metrics port's probes, and Prometheus metrics.
"""
