"""The workspace gateway: the httpx adapter, how its answers are read, the family listing,
TLS, when it last answered, shared family reads and the fleet's pace.
"""
