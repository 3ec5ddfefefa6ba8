"""The event store: one URL to an eventsourcing application on SQLite or PostgreSQL, its
connections and its recorder.
"""
