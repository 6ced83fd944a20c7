"""Failover trials: real replicated servers, the primary lost mid-traffic, every value counted."""
