"""Settings: one table of every PROVISIONER_* variable, its parsing, the checks, the
generated docs and the `Settings` values.
"""
