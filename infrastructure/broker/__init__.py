"""Messaging on RabbitMQ: publishing, topology, connections, delays, failures, permissions,
message schemas, dead letters, origins and the outbox relay's mapping.
"""
