"""Read models' SQL and the tables beside them: the view store, its connection and queries,
the audit trail, audit findings, log sources and heartbeats.
"""
